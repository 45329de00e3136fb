"""ITL spike attribution on hand-built engine runs whose answer is known without the analyzer."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from infertrace.analyzers.itl import analyze_itl
from infertrace.analyzers.itl_requests import (
    attribute_from_requests,
    attribute_store_requests,
)
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request
from tests.engine_runs import T0, run_to_store

COLLISION = T0 + 3 * 10**9


def _victims(n: int) -> list[Request]:
    return [Request(f"victim-{i:02d}", T0 + i * 1000, Prompt(((f"user-victim-{i}", 2047),)), 400, 2048)
            for i in range(n)]


def test_a_4096_token_prefill_under_prefill_first_stalls_all_64_decodes_for_its_whole_step(tmp_path: Path) -> None:
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM", policy="prefill_first")
    culprit = Request("culprit", COLLISION, Prompt((("user-culprit", 4096),)), 8, 2048, tenant="tenant-x")
    store, _, log = run_to_store(tmp_path, config, [*_victims(64), culprit])
    # The engine's own record: the step that prefilled the culprit, alone, while 64 requests were decoding.
    (step,) = [r for r in log.reports if any(s.request_id == "culprit" for s, _ in r.batch.prefills)]
    duration = int(step.durations[0])
    with store:
        result = analyze_itl(store)
    (stall,) = [s for s in result.stalls if any(c.request_id == "culprit" for c in s.culprits)]
    assert stall.step_index == step.index
    assert stall.duration_ns == duration
    assert stall.excess_ns == duration  # prefill-only: the victims got nothing from the step
    assert stall.causes == ("prefill",)
    assert sorted(stall.victims) == [f"victim-{i:02d}" for i in range(64)]
    (c,) = stall.culprits
    assert (c.chunk_tokens, c.computed_tokens, c.share, c.tenant) == (4096, 0, 1.0, "tenant-x")
    # Every victim's ITL across it is the step plus one decode step, several times a decode step.
    assert all(itl > duration for itl in stall.victim_itls_ns)
    engine = result.engines[0]
    assert max(stall.victim_itls_ns) > 5 * engine.decode_step_p50_ns
    summary = next(s for s in result.culprits if s.request_id == "culprit")
    assert (summary.victims, summary.stall_ns, summary.victim_stall_ns) == (64, duration, 64 * duration)
    # The 64 victims' admissions were prefills too (they stalled those already decoding); nothing else.
    assert {c.request_id for s in result.stalls for c in s.culprits} <= {"culprit", *stall.victims}
    assert result.pairs() >= {("engine-0", step.index, "culprit")}
    assert not result.unexplained


def test_decode_first_with_a_small_chunk_budget_leaves_no_stall_to_attribute(tmp_path: Path) -> None:
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM", policy="decode_first", chunked_prefill=True,
                          max_num_batched_tokens=128, max_num_seqs=64)
    culprit = Request("culprit", COLLISION, Prompt((("user-culprit", 4096),)), 8, 2048)
    store, _, log = run_to_store(tmp_path, config, [*_victims(32), culprit])
    chunk_steps = [r for r in log.reports if any(s.request_id == "culprit" for s, _ in r.batch.prefills)]
    assert len(chunk_steps) > 30  # the prompt went through in many small chunks next to the decodes
    with store:
        result = analyze_itl(store)
    assert not [s for s in result.stalls if any(c.request_id == "culprit" for c in s.culprits)]


def test_a_host_pause_is_labelled_host_pause_with_no_culprit(tmp_path: Path) -> None:
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM", policy="decode_first", chunked_prefill=True,
                          max_num_batched_tokens=256)
    pause_at, pause = T0 + 2 * 10**9, 150_000_000
    store, _, log = run_to_store(tmp_path, config, _victims(16), pauses=[(pause_at, pause)])
    paused = [r for r in log.reports if r.pause_ns]
    assert len(paused) == 1
    with store:
        result = analyze_itl(store)
    (stall,) = result.stalls
    assert stall.causes == ("host_pause",)
    assert stall.culprits == ()
    assert stall.pause_ns == pause
    assert stall.step_index == paused[0].index + len(paused[0].durations) - 1
    assert len(stall.victims) == 16
    assert result.pairs() == set()


def test_request_spans_and_token_times_alone_name_the_colliding_prefill(tmp_path: Path) -> None:
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM", policy="prefill_first")
    culprit = Request("culprit", COLLISION, Prompt((("user-culprit", 4096),)), 8, 2048)
    store, _, log = run_to_store(tmp_path, config, [*_victims(64), culprit])
    (step,) = [r for r in log.reports if any(s.request_id == "culprit" for s, _ in r.batch.prefills)]
    start, end = step.start_ns, step.start_ns + int(step.durations[0])
    with store:
        result = attribute_store_requests(store)
    (stall,) = [s for s in result.stalls if any(c.request_id == "culprit" for c in s.culprits)]
    assert stall.start_ns <= start and end <= stall.end_ns  # the window holds the prefill step
    assert len(stall.victims) == 64
    (c,) = stall.culprits
    assert (c.confidence, c.contained, c.uncached_tokens) == (1.0, True, 4096)


def _steady_tokens(request: str, start_ms: int, count: int, stall_after: int | None = None,
                   stall_ms: int = 0) -> list[tuple[str, int]]:
    """A request's token times every 10 ms, with one gap `stall_ms` longer after token `stall_after`."""
    times, t = [], start_ms
    for k in range(count):
        times.append((request, t * 10**6))
        t += 10 + (stall_ms if k == stall_after else 0)
    return times


def test_request_only_clears_a_chunked_prefill_that_ran_through_normal_gaps() -> None:
    # Two requests decode every 10 ms; at 500 ms a 60 ms stall hits both. Request "chunked" prefilled from
    # 400 to 700 ms, in chunks the decoders kept their pace through (a 10 ms gap at 410–420 ms lies inside):
    # its chunks did not stall anyone, so the spike is left unexplained. Request "whole" prefilled in one
    # step inside the stall window: it is named, with confidence 1.
    tokens = pd.DataFrame(_steady_tokens("d1", 0, 80, stall_after=50, stall_ms=60)
                          + _steady_tokens("d2", 0, 80, stall_after=50, stall_ms=60), columns=["request_id", "time_ns"])
    requests = pd.DataFrame({
        "request_id": ["d1", "d2", "chunked"], "instance": ["e0"] * 3, "tenant": ["t"] * 3,
        "scheduled_ns": [0, 0, 400 * 10**6], "first_token_ns": [0, 0, 700 * 10**6],
        "input_tokens": [10, 10, 6000], "cached_tokens": [0, 0, 0]})
    (stall,) = attribute_from_requests(requests, tokens).stalls
    assert (stall.start_ns, stall.end_ns, stall.victims) == (500 * 10**6, 570 * 10**6, ("d1", "d2"))
    assert stall.culprits == ()

    whole = pd.DataFrame({"request_id": ["whole"], "instance": ["e0"], "tenant": ["t"],
                          "scheduled_ns": [505 * 10**6], "first_token_ns": [565 * 10**6],
                          "input_tokens": [4000], "cached_tokens": [0]})
    (stall,) = attribute_from_requests(pd.concat([requests, whole], ignore_index=True), tokens).stalls
    (culprit,) = stall.culprits
    assert (culprit.request_id, culprit.confidence, culprit.contained) == ("whole", 1.0, True)
