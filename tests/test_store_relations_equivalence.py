"""The fast forms of the step relations and ITL queries answer exactly like the straightforward ones.

`steps` computes each step's end with list functions per span instead of a window over every step;
`step_membership` carries the ends of each span's first and last step, so `itl_token_gaps` computes each
ITL without joining `steps` twice. Here the straightforward definitions (the window, the joins) are run on
the same store, a simulated four-model fleet plus an engine run with a host pause and preemptions, and
compared row for row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infertrace.analyzers import query_text
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request
from reference_engine.fleet.config import load_fleet
from tests.engine_runs import T0, run_to_store
from tests.fleet_traces import simulate_fleet

ROOT = Path(__file__).resolve().parent.parent

# The window form of `steps`: each step's end is the span's start plus a running sum over the span's steps.
STEPS_BY_WINDOW = """
WITH span AS (
    SELECT trace_id, span_id, start_ns AS span_start_ns,
        "res.service.instance.id" AS instance, "res.service.name" AS service,
        "res.infertrace.engine.model" AS model, "res.infertrace.hardware" AS hardware,
        "res.infertrace.engine.policy" AS policy,
        "attr.infertrace.step.index" AS first_index,
        "attr.infertrace.step.durations_ns" AS durations,
        "attr.infertrace.step.prefill_tokens" AS prefill_tokens,
        "attr.infertrace.step.decode_tokens" AS decode_tokens,
        coalesce(len("attr.infertrace.step.prefill.request_ids"), 0) AS num_prefills,
        coalesce(len("attr.infertrace.step.decode.request_ids"), 0) AS num_decodes,
        "attr.infertrace.step.decode.context_tokens" AS context_tokens,
        "attr.infertrace.step.running" AS running, "attr.infertrace.step.waiting" AS waiting,
        "attr.infertrace.step.kv.used_blocks" AS kv_used_blocks,
        "attr.infertrace.step.kv.total_blocks" AS kv_total_blocks,
        coalesce(len("attr.infertrace.step.preempted.request_ids"), 0) AS num_preempted,
        coalesce("attr.infertrace.step.pause_ns", 0) AS pause_ns
    FROM spans WHERE name = 'engine_step'
),
step AS (
    SELECT * EXCLUDE (durations), unnest(range(len(durations))) AS run_position,
        unnest(durations) AS duration_ns, len(durations) AS run_steps
    FROM span
),
timed AS (
    SELECT *, CAST(span_start_ns + sum(duration_ns) OVER (PARTITION BY trace_id, span_id ORDER BY run_position)
                   AS BIGINT) AS end_ns
    FROM step
)
SELECT instance, service, model, hardware, policy, first_index + run_position AS step_index,
    end_ns - duration_ns AS start_ns, end_ns, duration_ns, trace_id, span_id, run_position, run_steps,
    prefill_tokens, decode_tokens, num_prefills, num_decodes,
    context_tokens + run_position * num_decodes AS decode_context_tokens,
    running, waiting, kv_used_blocks, kv_total_blocks, num_preempted,
    CASE WHEN run_position = run_steps - 1 THEN pause_ns ELSE 0 END AS pause_ns
FROM timed
"""

# The join form of the gaps' ITL: end of the run's first step less end of the previous run's last step.
GAP_ITLS_BY_JOIN = """
SELECT g.request_id, g.instance, g.first_step_index, s_to.end_ns - s_from.end_ns AS itl_ns
FROM itl_token_gaps g
JOIN steps s_to ON s_to.instance = g.instance AND s_to.step_index = g.first_step_index
JOIN steps s_from ON s_from.instance = g.instance AND s_from.step_index = g.prev_last_step_index
"""


def _same_rows(store: Store, a: str, b: str) -> int:
    """Asserts that two queries return the same multiset of rows; returns how many."""
    count_a = store.sql(f"SELECT count(*) FROM ({a})").fetchall()[0][0]
    count_b = store.sql(f"SELECT count(*) FROM ({b})").fetchall()[0][0]
    assert count_a == count_b
    assert store.sql(f"SELECT count(*) FROM (({a}) EXCEPT ALL ({b}))").fetchall()[0][0] == 0
    assert store.sql(f"SELECT count(*) FROM (({b}) EXCEPT ALL ({a}))").fetchall()[0][0] == 0
    return int(count_a)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    tmp = tmp_path_factory.mktemp("equivalence")
    fleet_trace = tmp / "fleet.jsonl"
    if not (ROOT.parent / "shared" / "workloads").is_dir():
        pytest.skip("../shared/workloads is not beside the repo (the four-model fleet replays its traces)")
    simulate_fleet(load_fleet(ROOT / "examples" / "fleets" / "four_models.toml"), fleet_trace, 20.0, seed=3)
    # One engine with a host pause and too little KV cache for its requests (preemptions, recomputes).
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM", policy="decode_first", chunked_prefill=True,
                          max_num_batched_tokens=256, num_kv_blocks=400)
    requests = [Request(f"r-{i:02d}", T0 + i * 20_000_000, Prompt(((f"user-{i}", 300 + 37 * i),)), 400, 2048)
                for i in range(24)]
    engine_store, _, log = run_to_store(tmp, config, requests, pauses=[(T0 + 2 * 10**9, 80_000_000)])
    engine_store.close()
    assert any(r.pause_ns for r in log.reports)
    assert any(r.batch.preempted for r in log.reports)
    ingest_paths(tmp / "store", [fleet_trace, tmp / f"{config.instance_id}.jsonl"])
    with Store.open(tmp / "store") as opened:
        yield opened


def test_steps_by_list_sums_equal_steps_by_window_row_for_row(store: Store) -> None:
    rows = _same_rows(store, "SELECT * FROM steps", STEPS_BY_WINDOW)
    multi = store.sql("SELECT count(*) FROM steps WHERE run_steps > 1").fetchall()[0][0]
    paused = store.sql("SELECT count(*) FROM steps WHERE pause_ns > 0").fetchall()[0][0]
    assert rows > 10_000 and multi > rows // 2 and paused >= 1


def test_membership_step_ends_are_the_steps_first_and_last_ends(store: Store) -> None:
    _same_rows(store,
               "SELECT trace_id, span_id, first_step_end_ns, last_step_end_ns FROM step_membership",
               "SELECT m.trace_id, m.span_id, f.end_ns, l.end_ns FROM step_membership m "
               "JOIN steps f ON f.trace_id = m.trace_id AND f.span_id = m.span_id AND f.run_position = 0 "
               "JOIN steps l ON l.trace_id = m.trace_id AND l.span_id = m.span_id "
               "AND l.run_position = l.run_steps - 1")


def test_gap_itls_equal_the_step_joins_and_the_itl_distribution_is_unchanged(store: Store) -> None:
    store.con.execute(f"CREATE OR REPLACE TEMP TABLE itl_token_gaps AS {query_text('itl_token_gaps')}")
    assert store.sql("SELECT count(*) FROM itl_token_gaps WHERE itl_ns IS NULL").fetchall()[0][0] == 0
    rows = _same_rows(store, "SELECT request_id, instance, first_step_index, itl_ns FROM itl_token_gaps",
                      GAP_ITLS_BY_JOIN)
    assert rows > 1000
    by_join = (f"SELECT instance, itl_ns, 1::BIGINT AS tokens FROM ({GAP_ITLS_BY_JOIN}) UNION ALL "
               "SELECT instance, duration_ns, num_decodes::BIGINT FROM steps WHERE run_position > 0")
    _same_rows(store, query_text("itl_token_itls"), by_join)
    # Every token's ITL in `tokens` is one of these, with the same weights.
    _same_rows(store, "SELECT instance, itl_ns, sum(tokens) FROM (" + query_text("itl_token_itls") + ") GROUP BY ALL",
               "SELECT instance, itl_ns, count(*) FROM tokens WHERE itl_ns IS NOT NULL AND NOT from_prefill "
               "GROUP BY ALL")
