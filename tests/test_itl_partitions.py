"""The ITL analysis reads its stall candidates in ranges of each engine's steps (`partition_steps`), so that its
memory is set by a range, not by the window: the stalls, their victims and the attributions must not depend on
where the ranges are cut, including when every gap between two tokens crosses a boundary."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from infertrace.analyzers import query_text
from infertrace.analyzers.itl import ItlAnalysis, analyze_itl
from infertrace.store.store import Store
from tests.incident_stores import SAMPLES, incident_store, sample_store

SAMPLE_NAMES = sorted(p.name for p in SAMPLES.iterdir() if (p / "ground_truth.json").is_file())
DEFAULT_SAMPLES = ("prefill_storm",)
SAMPLES_PARAMS = [pytest.param(s, marks=() if s in DEFAULT_SAMPLES else pytest.mark.slow) for s in SAMPLE_NAMES]
WHOLE_ENGINE = 10**9  # one range per engine


def _fields(analysis: ItlAnalysis) -> tuple:
    return dataclasses.astuple(analysis)


def _assert_cut_anywhere_the_same(store: Store, expect_stalls: bool) -> None:
    ranges = store.sql(query_text("itl_stall_partitions"), {"steps": 64}).fetchall()
    engines = {instance for instance, *_ in ranges}
    assert len(ranges) > 2 * len(engines), "the data must hold engines of several ranges for the test to cut them"
    whole = analyze_itl(store, partition_steps=WHOLE_ENGINE)
    if expect_stalls:  # a sample whose incident is not an ITL one (kv_transfer_congestion) may have none
        assert whole.stalls and any(len(s.victims) > 1 for s in whole.stalls)
    for steps in (64,):
        cut = analyze_itl(store, partition_steps=steps)
        assert [(s.instance, s.step_index, s.victims, s.victim_itls_ns) for s in cut.stalls] == \
            [(s.instance, s.step_index, s.victims, s.victim_itls_ns) for s in whole.stalls]
        assert cut.pairs(include_recompute=True) == whole.pairs(include_recompute=True)
        assert _fields(cut) == _fields(whole)  # every stall, culprit, victim and engine summary


@pytest.mark.parametrize("sample", SAMPLES_PARAMS)
def test_stalls_victims_and_attributions_do_not_depend_on_where_the_steps_are_cut(sample: str) -> None:
    with Store.open(sample_store(sample).store) as store:
        _assert_cut_anywhere_the_same(store, expect_stalls=sample in DEFAULT_SAMPLES)


@pytest.mark.slow
def test_a_generated_fleet_is_analysed_the_same_whatever_the_ranges() -> None:
    with Store.open(incident_store("prefill_storm", seed=3).store) as store:
        _assert_cut_anywhere_the_same(store, expect_stalls=True)


def test_the_ranges_cover_each_engines_candidate_steps_once_without_overlap() -> None:
    with Store.open(sample_store("prefill_storm").store) as store:
        ranges = store.sql(query_text("itl_stall_partitions"), {"steps": 5}).fetchall()
        candidates = store.sql("SELECT instance, count(DISTINCT step_index) FROM steps "
                               "WHERE num_prefills > 0 OR pause_ns > 0 GROUP BY instance").fetchall()
    assert all(n <= 5 for *_, n in ranges)
    by_engine: dict[str, list[tuple[int, int, int]]] = {}
    for instance, first, last, n in ranges:
        by_engine.setdefault(instance, []).append((first, last, n))
    assert {i: sum(n for *_, n in r) for i, r in by_engine.items()} == dict(candidates)
    for r in by_engine.values():
        assert all(a[1] < b[0] for a, b in itertools.pairwise(r))


def test_a_partition_size_below_one_is_refused() -> None:
    with Store.open(sample_store("prefill_storm").store) as store, pytest.raises(ValueError, match="partition_steps"):
        analyze_itl(store, partition_steps=0)
