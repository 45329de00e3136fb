"""Aggregates over every token read from `token_runs` (a row per run of tokens, not per token) give exactly what
the same aggregate over the `tokens` relation gives: the SLO's ITL percentiles per model and per bucket, the ITL
heatmap, the token counts of the store's coverage. The store's materialised relations leave `tokens` out; these
are what keeps that safe."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infertrace.analyzers.slo import QUANTILES, slo_summary, weighted_quantile_cont
from infertrace.runbook import run_query
from infertrace.sources.capabilities import store_coverage
from infertrace.store.store import Store
from tests.incident_stores import sample_store


@pytest.fixture(scope="module")
def store() -> Store:
    with Store.open(sample_store("prefill_storm").store) as opened:
        yield opened


_CON = duckdb.connect()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=60))
def test_a_weighted_quantile_is_duckdbs_quantile_cont_of_the_expanded_values_to_the_last_bit(values: list[int]) -> None:
    con = _CON
    expected = con.execute("SELECT quantile_cont(v, [0.5, 0.95, 0.99]) FROM (SELECT unnest($v::BIGINT[]) AS v)",
                           {"v": values}).fetchall()[0][0]
    distinct, counts = np.unique(np.array(values, dtype=np.int64), return_counts=True)
    assert weighted_quantile_cont(con, distinct, counts, QUANTILES) == list(expected)


def test_slo_itl_percentiles_per_model_and_bucket_equal_quantile_cont_over_every_token(store: Store) -> None:
    summary = slo_summary(store)
    rows = store.sql(
        "SELECT r.model, count(t.itl_ns), quantile_cont(t.itl_ns, [0.5, 0.95, 0.99]) FROM requests r "
        "JOIN tokens t ON t.request_id = r.request_id AND t.itl_ns IS NOT NULL GROUP BY ALL").fetchall()
    assert rows
    for model, n, q in rows:
        itl = summary.model(model).itl
        assert (itl.count, itl.p50_ms, itl.p95_ms, itl.p99_ms) == (n, *(v / 1e6 for v in q))
    # per bucket of the requests' arrival (from the gateway span when the trace has one)
    buckets = store.sql(
        "SELECT q.model, $origin + (coalesce(g.start_ns, q.arrival_ns) - $origin) // $width * $width AS bucket, "
        "quantile_cont(t.itl_ns, 0.99) FROM requests q LEFT JOIN component_calls g ON g.trace_id = q.trace_id "
        "AND g.component = 'gateway' JOIN tokens t ON t.request_id = q.request_id AND t.itl_ns IS NOT NULL "
        "GROUP BY ALL", params={"origin": summary.start_ns, "width": summary.bucket_ns}).fetchall()
    got = {(b.model, b.start_ns): b.percentiles_ms["itl_p99_ms"] for b in summary.buckets}
    assert len(buckets) > 1
    assert {(m, int(b)): v / 1e6 for m, b, v in buckets} == {k: v for k, v in got.items() if v is not None}


def test_the_itl_heatmap_counts_every_token_of_the_engine_by_time_and_band(store: Store) -> None:
    engine = store.sql("SELECT instance FROM steps GROUP BY ALL ORDER BY count(*) DESC LIMIT 1").fetchall()[0][0]
    heat = run_query(store, "itl_heatmap", {"instance": engine, "bucket_s": "5"})
    tokens = store.sql("SELECT time_ns // 5000000000 AS bucket, CAST(floor(log2(greatest(itl_ns / 1e6, 0.0625))) "
                       "AS INTEGER) AS band, count(*) AS n, max(itl_ns) AS worst FROM tokens WHERE instance = $i "
                       "AND itl_ns IS NOT NULL GROUP BY ALL ORDER BY ALL", params={"i": engine}).fetchall()
    assert heat["tokens"].tolist() == [n for _, _, n, _ in tokens]
    assert heat["max_itl_ms"].tolist() == [round(w / 1e6, 3) for _, _, _, w in tokens]
    assert int(heat["tokens"].sum()) > 1000


def test_the_coverage_counts_as_many_tokens_as_the_tokens_relation_has_rows(store: Store) -> None:
    coverage = store_coverage(store)
    assert coverage.tokens_from_steps == store.sql("SELECT count(*) FROM tokens").fetchall()[0][0] > 0
    assert coverage.tokens_from_spans == 0
