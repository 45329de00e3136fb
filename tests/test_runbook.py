"""Runbook queries: headers parse, every query runs on a real store, answers match the relations they
summarise, parameters are bound (never formatted into SQL), and RUNBOOK.md is regenerated from headers."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pandas.testing import assert_frame_equal

from infertrace.results.relations import materialize_relations, open_reader
from infertrace.runbook import RunbookError, get_query, load_queries, parse_time_ns, run_query
from infertrace.runbook.catalog import parse_query
from infertrace.runbook.document import runbook_markdown
from infertrace.store.store import Store
from tests.incident_stores import demo_store, incident_store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo() -> Store:
    with Store.open(demo_store().store) as store:
        store.materialize()
        yield store


def test_at_least_fifteen_queries_each_with_title_question_when_and_documented_parameters() -> None:
    queries = load_queries()
    assert len(queries) >= 15
    for q in queries.values():
        assert q.title and q.question and q.when
        used = set(re.findall(r"\$(\w+)", "\n".join(ln for ln in q.sql.splitlines() if not ln.startswith("--"))))
        assert used == {p.name for p in q.parameters}, q.name
        assert all(p.description for p in q.parameters), q.name


def test_a_header_whose_parameters_differ_from_the_sql_is_rejected() -> None:
    text = "-- title: t\n-- question: q\n-- when: w\n-- param a int: A.\nSELECT $a + $b\n"
    with pytest.raises(RunbookError, match="declared parameters"):
        parse_query("bad", text)


def _values_for(store: Store) -> dict[str, str]:
    rid = store.sql("SELECT request_id FROM tokens ORDER BY itl_ns DESC NULLS LAST LIMIT 1").fetchall()[0][0]
    instance, at = store.sql("SELECT instance, end_ns FROM steps ORDER BY duration_ns DESC LIMIT 1").fetchall()[0]
    model = store.sql("SELECT model FROM requests GROUP BY model ORDER BY count(*) DESC LIMIT 1").fetchall()[0][0]
    lo, hi = store.sql("SELECT min(start_ns), max(end_ns) FROM spans").fetchall()[0]
    return {"request_id": rid, "instance": instance, "at": str(at), "model": model, "models": model,
            "since": str(lo + (hi - lo) // 3), "until": str(lo + 2 * (hi - lo) // 3)}


def test_every_query_runs_on_a_real_store_and_most_return_rows(demo: Store) -> None:
    values = _values_for(demo)
    empty = []
    for q in load_queries().values():
        frame = run_query(demo, q, {p.name: values[p.name] for p in q.parameters if p.required})
        if frame.empty:
            empty.append(q.name)
    # the demo fleet is not disaggregated (no KV transfers) and its KV cache never runs out (no preemptions)
    assert set(empty) <= {"kv_transfer_by_link", "kv_transfer_by_size", "pd_ttft_transfer_share", "preemptions"}, empty


@pytest.mark.slow  # 7-9 s: the default run stays under 10 minutes; CI runs it
def test_every_query_answers_the_same_from_a_materialised_store(tmp_path: Path) -> None:
    """`infertrace query` (and replay, export) open a store with its materialised relations attached: each query
    then reads the written files, not the spans, and must answer exactly as the views do."""
    root = tmp_path / "store"
    shutil.copytree(demo_store().store / "spans", root / "spans")
    queries = load_queries().values()
    with Store.open(root) as live:
        values = _values_for(live)
        wanted = {q.name: {p.name: values[p.name] for p in q.parameters if p.required} for q in queries}
        expected = {q.name: run_query(live, q, wanted[q.name]) for q in queries}
        materialize_relations(live)
    with open_reader(root) as opened:
        views = dict(opened.sql("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall())
        assert all("derived" in views[name] for name in ("requests", "steps", "token_runs")), views
        for q in queries:
            assert_frame_equal(run_query(opened, q, wanted[q.name]), expected[q.name], obj=q.name)


def test_slowest_requests_returns_exactly_the_top_ttfts_of_the_requests_relation(demo: Store) -> None:
    frame = run_query(demo, "slowest_requests", {"top": "5"})
    expected = demo.sql("SELECT request_id FROM requests ORDER BY ttft_ns DESC, request_id LIMIT 5").fetchall()
    assert frame["request_id"].tolist() == [r[0] for r in expected]


def test_prefills_colliding_with_the_worst_stalled_request_name_the_ground_truth_culprit(demo: Store) -> None:
    truth = demo_store().truth["itl"]["stalled_steps"]
    worst = max(truth, key=lambda s: s["duration_ns"] - s["decode_only_ns"])
    victim = worst["victims"][0]
    frame = run_query(demo, "prefills_colliding_with_request", {"request_id": victim, "top": "1"})
    assert set(frame["prefill_request_id"]) & {c["request"] for c in worst["culprits"]}


def test_rate_limiter_query_counts_every_429_of_the_flapping_limiter() -> None:
    flapping = incident_store("rate_limiter_flapping")
    with Store.open(flapping.store) as store:
        frame = run_query(store, "rate_limited_by_tenant", {})
        direct = store.sql("SELECT count(*) FROM component_calls WHERE component_kind = 'rate_limiter' "
                           "AND http_status = 429").fetchall()[0][0]
    assert direct > 0
    assert frame["rejected_429"].sum() == direct
    limiter = flapping.truth["root_cause"]["instances"][0]
    assert frame.groupby("rate_limiter")["rejected_429"].sum().idxmax() == limiter


INJECTION = "x' OR '1'='1"


def test_parameters_are_bound_so_a_quoted_value_matches_nothing_instead_of_everything(demo: Store) -> None:
    q = get_query("request_tokens")
    assert run_query(demo, q, {"request_id": INJECTION}).empty
    # The same value formatted into the SQL would have matched every token: the probe is meaningful.
    formatted = q.sql.replace("$request_id", f"'{INJECTION}'").replace("$min_itl_ms", "0")
    assert len(demo.sql(formatted).fetchall()) > 0
    # and a value that tries to end the statement is only a value
    assert run_query(demo, q, {"request_id": "x'; DROP VIEW requests; --"}).empty
    assert demo.sql("SELECT count(*) FROM requests").fetchall()[0][0] > 0


def test_query_text_never_contains_a_bound_value(demo: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, object]] = []
    original = demo.sql

    def spy(query: str, params: object = None) -> object:
        seen.append((query, params))
        return original(query, params)

    monkeypatch.setattr(demo, "sql", spy)
    run_query(demo, "ttft_breakdown", {"model": "needle-model-name"})
    (text, params), = seen
    assert "needle-model-name" not in text
    assert params["model"] == "needle-model-name"


def test_unknown_and_missing_and_malformed_parameters_are_refused_by_name() -> None:
    q = get_query("step_timeline_around")
    with pytest.raises(RunbookError, match="no parameter 'bogus'"):
        q.bind({"instance": "e", "at": "0", "bogus": "1"})
    with pytest.raises(RunbookError, match="needs --param at"):
        q.bind({"instance": "e"})
    with pytest.raises(RunbookError, match="parameter at"):
        q.bind({"instance": "e", "at": "yesterday"})


def test_times_read_as_iso_utc_epoch_seconds_or_epoch_nanoseconds() -> None:
    ns = 1_767_225_630_000_000_000
    assert parse_time_ns("2026-01-01T00:00:30Z") == ns
    assert parse_time_ns("2026-01-01T00:00:30") == ns
    assert parse_time_ns("2026-01-01T01:00:30+01:00") == ns
    assert parse_time_ns("1767225630") == ns
    assert parse_time_ns(str(ns + 7)) == ns + 7
    assert parse_time_ns("2026-01-01T00:00:30.000001Z") == ns + 1000


def test_runbook_md_is_generated_from_the_headers_and_not_stale() -> None:
    committed = (ROOT / "RUNBOOK.md").read_text(encoding="utf-8")
    assert committed == runbook_markdown(), (
        "RUNBOOK.md is stale: run `python -m infertrace.runbook.document > RUNBOOK.md`")
    for q in load_queries().values():
        assert f"## {q.name}" in committed


@pytest.mark.slow
def test_cli_lists_runs_and_exits_2_on_a_missing_store_or_a_bad_parameter(tmp_path: Path) -> None:
    store = str(demo_store().store)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "infertrace.cli", *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)

    listed = cli("query", "--list")
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == len(load_queries()) + 2  # header, rule
    assert [line.split()[0] for line in listed.stdout.splitlines()[2:]] == list(load_queries())
    ran = cli("query", "--store", store, "engine_load", "--format", "json")
    assert ran.returncode == 0, ran.stderr
    assert '"instance"' in ran.stdout
    missing = cli("query", "--store", str(tmp_path / "nope"), "engine_load")
    assert missing.returncode == 2 and "nope" in missing.stderr
    bad = cli("query", "--store", store, "ttft_breakdown", "--param", "model=x", "--param", "bogus=1")
    assert bad.returncode == 2 and "bogus" in bad.stderr
