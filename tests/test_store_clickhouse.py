"""A store over ClickHouse's `otel_traces` (rows as the OpenTelemetry Collector's exporter writes them, in
ClickHouse's own engine through chdb) answers exactly as the local store holding the same spans: every derived
relation row for row, every report section, every runbook query. Parametrised over every sample incident and
over every relation the store defines, so a relation or a sample added later is covered without listing it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from infertrace.analyzers import itl, slo
from infertrace.report import ReportOptions, build_report
from infertrace.runbook import answer_notes, load_queries, run_query
from infertrace.store.clickhouse.connection import ChdbConnection, parse_url
from infertrace.store.clickhouse.pushdown import CLICKHOUSE_RELATIONS, TWINS
from infertrace.store.clickhouse.rows import SPAN_KINDS, STATUS_CODES
from infertrace.store.clickhouse.store import ClickHouseStore, create_otel_traces, ingest_window
from infertrace.store.store import RELATIONS, SIDE_RELATIONS, Store, open_store
from tests.clickhouse_stores import (
    DUCKDB_FORM,
    bank_in_clickhouse,
    chdb_url,
    clickhouse_relation_rows,
    exported,
    sample_in_clickhouse,
)
from tests.incident_stores import SAMPLES

SAMPLE_NAMES = sorted(p.parent.name for p in SAMPLES.glob("*/ground_truth.json"))
# The default run compares one sample (a prefill storm on a multi-model fleet); CI's slow run all of them.
DEFAULT_SAMPLES = ("prefill_storm",)
SAMPLES_PARAMS = [pytest.param(s, marks=() if s in DEFAULT_SAMPLES else pytest.mark.slow) for s in SAMPLE_NAMES]


def _rows(store: Store, name: str) -> pa.Table:
    return store.sql(f"SELECT * FROM {name} ORDER BY ALL").to_arrow_table()


@pytest.fixture(scope="module")
def opened() -> Iterator[dict[str, tuple[Store, Store]]]:
    """(local store, store over chdb) per sample, opened once for the module's many read-only comparisons."""
    stores: dict[str, tuple[Store, Store]] = {}
    yield stores
    for local, clickhouse in stores.values():
        local.close()
        clickhouse.close()


def _both(opened: dict[str, tuple[Store, Store]], sample: str) -> tuple[Store, Store]:
    if sample not in opened:
        local, url = sample_in_clickhouse(sample)
        pair = Store.open(local), open_store(url)
        for store in pair:  # each relation computed once per backend: the many queries below then read it
            store.materialize()
        opened[sample] = pair
    return opened[sample]


@pytest.mark.parametrize("sample", SAMPLES_PARAMS)
@pytest.mark.parametrize("relation", [*RELATIONS, *SIDE_RELATIONS])
def test_every_relation_reads_the_same_rows_from_clickhouse_as_from_the_local_store(
        opened: dict[str, tuple[Store, Store]], sample: str, relation: str) -> None:
    local, clickhouse = _both(opened, sample)
    expected, got = _rows(local, relation), _rows(clickhouse, relation)
    assert got.schema == expected.schema
    assert got.num_rows == expected.num_rows
    assert got.equals(expected)


def test_spans_come_back_typed_exactly_as_ingest_stored_them(opened: dict[str, tuple[Store, Store]]) -> None:
    local, clickhouse = _both(opened, "prefill_storm")
    # event attribute values and links' text are what the exporter's Map(String, String) cannot carry
    query = ("SELECT * EXCLUDE (events, links), list_transform(events, lambda e: {'t': e.time_ns, 'n': e.name}) "
             "AS events FROM spans ORDER BY trace_id, span_id")
    expected, got = local.sql(query).to_arrow_table(), clickhouse.sql(query).to_arrow_table()
    assert got.num_rows == expected.num_rows > 1000
    assert got.equals(expected)


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """The report document less the one thing that differs by construction: how many files held the spans."""
    doc = json.loads(json.dumps(doc))
    del doc["store"]["segments"]
    return doc


@pytest.mark.parametrize("sample", SAMPLES_PARAMS)
def test_every_report_section_is_the_same_on_clickhouse(opened: dict[str, tuple[Store, Store]], sample: str) -> None:
    local, clickhouse = _both(opened, sample)
    expected = _comparable(build_report(local, ReportOptions()))
    got = _comparable(build_report(clickhouse, ReportOptions()))
    assert set(got["sections"]) == set(expected["sections"]) and expected["sections"]
    for section in expected["sections"]:
        assert got["sections"][section] == expected["sections"][section], section
    assert got == expected


def _values_for(store: Store) -> dict[str, str]:
    rid = store.sql("SELECT request_id FROM tokens ORDER BY itl_ns DESC NULLS LAST, request_id LIMIT 1").fetchall()
    step = store.sql("SELECT instance, end_ns FROM steps ORDER BY duration_ns DESC, end_ns LIMIT 1").fetchall()
    model = store.sql("SELECT model FROM requests GROUP BY model ORDER BY count(*) DESC, model LIMIT 1").fetchall()
    lo, hi = store.sql("SELECT min(start_ns), max(end_ns) FROM spans").fetchall()[0]
    return {"request_id": rid[0][0] if rid else "none", "instance": step[0][0] if step else "none",
            "at": str(step[0][1] if step else lo), "model": model[0][0], "models": model[0][0],
            "since": str(lo + (hi - lo) // 3), "until": str(lo + 2 * (hi - lo) // 3)}


BANK_SCENARIOS = 3  # bank(seed=3, count=3, duration_s=120): the bank `evaluate` is held to below, three families


@pytest.mark.slow
@pytest.mark.parametrize("scenario", range(BANK_SCENARIOS))
def test_every_report_section_and_runbook_query_is_the_same_on_clickhouse_for_a_generated_bank(scenario: int) -> None:
    name, local_dir, url = bank_in_clickhouse(seed=3, count=BANK_SCENARIOS)[scenario]
    with Store.open(local_dir) as local, open_store(url) as clickhouse:
        expected = _comparable(build_report(local, ReportOptions()))
        got = _comparable(build_report(clickhouse, ReportOptions()))
        assert expected["sections"], name
        assert got == expected, name
        values = _values_for(local)
        for query, q in sorted(load_queries().items()):
            params = {p.name: values[p.name] for p in q.parameters if p.required}
            pd.testing.assert_frame_equal(run_query(clickhouse, q, params), run_query(local, q, params),
                                          check_exact=True, obj=f"{name}: {query}")


@pytest.mark.parametrize("sample", SAMPLES_PARAMS)
@pytest.mark.parametrize("query", sorted(load_queries()))
def test_every_runbook_query_returns_the_same_rows_on_clickhouse(opened: dict[str, tuple[Store, Store]], sample: str,
                                                                 query: str) -> None:
    local, clickhouse = _both(opened, sample)
    q = load_queries()[query]
    values = _values_for(local)
    params = {p.name: values[p.name] for p in q.parameters if p.required}
    expected, got = run_query(local, q, params), run_query(clickhouse, q, params)
    pd.testing.assert_frame_equal(got, expected, check_exact=True)
    # and what the answer says it could not draw on
    assert answer_notes(clickhouse, q, params, len(got)) == answer_notes(local, q, params, len(expected))


def test_a_window_read_from_clickhouse_reports_as_the_same_window_pulled_into_a_local_store(tmp_path: Path) -> None:
    local_dir, url = sample_in_clickhouse("prefill_storm")
    with Store.open(local_dir) as local:
        lo, hi = local.sql("SELECT min(start_ns), max(end_ns) FROM spans").fetchall()[0]
        everything = local.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    since, until = lo + (hi - lo) // 3, lo + (hi - lo) // 2
    read, new = ingest_window(tmp_path / "window", url, since, until)
    assert 0 < read == new < everything  # the window was chosen in ClickHouse: only part of the spans came
    assert ingest_window(tmp_path / "window", url, since, until) == (read, 0)  # pulling it again adds nothing
    options = ReportOptions(since_ns=since, until_ns=until)
    with Store.open(tmp_path / "window") as pulled, ClickHouseStore.open(url, since, until) as clickhouse:
        assert clickhouse.sql("SELECT count(*) FROM spans").fetchall()[0][0] == read
        assert _comparable(build_report(clickhouse, options)) == _comparable(build_report(pulled, options))


def test_a_window_brings_every_token_of_the_requests_in_it() -> None:
    local_dir, url = sample_in_clickhouse("prefill_storm")
    with Store.open(local_dir) as local:
        lo, hi = local.sql("SELECT min(start_ns), max(end_ns) FROM spans").fetchall()[0]
        since, until = lo + (hi - lo) // 3, lo + (hi - lo) // 2
        with ClickHouseStore.open(url, since, until) as clickhouse:
            ids = [r[0] for r in clickhouse.sql("SELECT request_id FROM requests WHERE arrival_ns < $u AND "
                                                "finish_ns >= $s", {"s": since, "u": until}).fetchall()]
            assert len(ids) > 10
            query = "SELECT * FROM tokens WHERE list_contains($ids, request_id) ORDER BY ALL"
            expected = local.sql(query, {"ids": ids}).to_arrow_table()
            assert clickhouse.sql(query, {"ids": ids}).to_arrow_table().equals(expected)



def test_a_window_without_spans_reads_as_an_empty_store_not_an_error() -> None:
    local_dir, url = sample_in_clickhouse("prefill_storm")
    with Store.open(local_dir) as local:
        hi = local.sql("SELECT max(end_ns) FROM spans").fetchall()[0][0]
    with ClickHouseStore.open(url, hi + 10**12, hi + 2 * 10**12) as clickhouse:
        assert clickhouse.sql("SELECT count(*) FROM spans").fetchall()[0][0] == 0
        assert clickhouse.sql("SELECT count(*) FROM requests").fetchall()[0][0] == 0
        assert clickhouse.segments == []


def test_the_spans_read_back_are_held_as_compressed_parquet_files_removed_when_the_store_closes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-back is bounded by disk, not memory: one Parquet file per streamed batch in the store's private
    directory, no table of span rows in DuckDB's memory, nothing left behind after close."""
    from infertrace.store.clickhouse import store as clickhouse_store

    local_dir, url = sample_in_clickhouse("prefill_storm")
    with Store.open(local_dir) as local:
        spans = local.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    monkeypatch.setattr(clickhouse_store, "READ_BACK_ROWS", 997)
    clickhouse = ClickHouseStore.open(url)
    try:
        assert clickhouse.sql("SELECT count(*) FROM spans").fetchall()[0][0] == spans > 5 * 997
        parts = sorted((clickhouse.root / "read-back").glob("part-*.parquet"))
        assert len(parts) > 1  # one per streamed batch
        assert clickhouse.sql("SELECT sum(num_rows) FROM parquet_file_metadata($f)",
                              {"f": [str(p) for p in parts]}).fetchall()[0][0] == spans
        assert clickhouse.sql("SELECT count(*) FROM duckdb_tables()").fetchall()[0][0] == 0
        codecs = clickhouse.sql("SELECT DISTINCT compression FROM parquet_metadata($f)",
                                {"f": str(parts[0])}).fetchall()
        assert codecs == [("ZSTD",)]
    finally:
        clickhouse.close()
    assert not clickhouse.root.exists()


@pytest.mark.parametrize("rows_per_batch", [997, 20_000])
def test_the_spans_read_back_are_the_same_whatever_the_size_of_the_batches_they_are_streamed_in(
        monkeypatch: pytest.MonkeyPatch, rows_per_batch: int) -> None:
    from infertrace.store.clickhouse import store as clickhouse_store

    _, url = sample_in_clickhouse("prefill_storm")
    query = "SELECT trace_id, span_id, name, start_ns, end_ns, \"attr.gen_ai.request.id\" FROM spans ORDER BY ALL"
    with ClickHouseStore.open(url) as clickhouse:
        expected = clickhouse.sql(query).to_arrow_table()
    monkeypatch.setattr(clickhouse_store, "READ_BACK_ROWS", rows_per_batch)
    with ClickHouseStore.open(url) as clickhouse:
        assert clickhouse.sql(query).to_arrow_table().equals(expected)
    assert expected.num_rows > 1000

def test_every_aggregation_with_a_clickhouse_form_is_held_to_its_duckdb_form() -> None:
    assert set(TWINS) == set(DUCKDB_FORM)


# Every aggregation's ClickHouse form runs in the default run through the report's sections and the ITL and SLO
# analyses on ClickHouse (the tests above and below); row by row, the default run compares two, CI's slow run each.
TWIN_PARAMS = [pytest.param(n, marks=() if n in ("itl_stall_candidates", "slo_requests") else pytest.mark.slow)
               for n in sorted(TWINS)]


@pytest.mark.parametrize("sample", SAMPLES_PARAMS)
@pytest.mark.parametrize("name", TWIN_PARAMS)
def test_an_aggregation_pushed_into_clickhouse_returns_the_rows_duckdb_computes(sample: str, name: str) -> None:
    local_dir, url = sample_in_clickhouse(sample)
    query, params_of = DUCKDB_FORM[name]
    with Store.open(local_dir) as local, ClickHouseStore.open(url) as clickhouse:
        itl._register(local)
        params = params_of(local)
        expected = local.aggregate(name, query, params).to_arrow_table()
        got = clickhouse.aggregate(name, query, params).to_arrow_table()
        assert not clickhouse.spans_read  # computed in ClickHouse: only the reduced rows came back
        assert got.schema == expected.schema
        assert got.num_rows == expected.num_rows > 0
        assert got.equals(expected)


# A window reaches every aggregation's ClickHouse form the same way (the store's window filter): the default run
# checks one, CI's slow run each.
WINDOW_PARAMS = [pytest.param(n, marks=() if n == "itl_stall_candidates" else pytest.mark.slow) for n in sorted(TWINS)]


@pytest.mark.parametrize("name", WINDOW_PARAMS)
def test_an_aggregation_pushed_into_clickhouse_reads_the_window_the_store_reads(name: str) -> None:
    local_dir, url = sample_in_clickhouse("prefill_storm")
    query, params_of = DUCKDB_FORM[name]
    with Store.open(local_dir) as local:
        lo, hi = local.sql("SELECT min(start_ns), max(end_ns) FROM spans").fetchall()[0]
        itl._register(local)
        params = params_of(local)
        whole = local.aggregate(name, query, params).to_arrow_table()
    with ClickHouseStore.open(url, lo + (hi - lo) // 3, lo + (hi - lo) // 2) as clickhouse:
        got = clickhouse.aggregate(name, query, params).to_arrow_table()
        assert not clickhouse.spans_read
        itl._register(clickhouse)  # the window's spans read back, and the DuckDB form run on them
        expected = Store.aggregate(clickhouse, name, query, params).to_arrow_table()
        assert clickhouse.spans_read
    assert got.num_rows > 0 and got.equals(expected)
    assert not got.equals(whole)  # a part of the store


@pytest.mark.parametrize("sample", SAMPLES_PARAMS)
@pytest.mark.parametrize("relation", sorted(CLICKHOUSE_RELATIONS))
def test_a_relation_the_twins_read_has_the_same_rows_in_its_clickhouse_form(sample: str, relation: str) -> None:
    """The building blocks of the twins (relations/<name>.sql) against the relation's DuckDB definition, every
    column, values compared in the DuckDB relation's types."""
    local_dir, url = sample_in_clickhouse(sample)
    with Store.open(local_dir) as local, ClickHouseStore.open(url) as clickhouse:
        itl._register(local)  # itl_token_gaps, the ITL analyzer's own table
        expected = _rows(local, relation)
        got = clickhouse_relation_rows(clickhouse, relation, expected)
        assert not clickhouse.spans_read
    assert got.num_rows == expected.num_rows > 0
    assert got.equals(expected)


def test_the_itl_distributions_are_the_same_pushed_down_and_computed_locally() -> None:
    local_dir, url = sample_in_clickhouse("prefill_storm")
    with Store.open(local_dir) as local, ClickHouseStore.open(url) as clickhouse:
        expected, got = itl.itl_distributions(local), itl.itl_distributions(clickhouse)
        assert not clickhouse.spans_read
    assert sorted(got) == sorted(expected) and expected
    for instance, (values, weights) in expected.items():
        assert got[instance][0].tolist() == values.tolist() and got[instance][1].tolist() == weights.tolist()


@pytest.mark.parametrize("sample", SAMPLES_PARAMS)
def test_the_itl_analysis_runs_in_clickhouse_and_finds_the_same_stalls_victims_and_culprits(sample: str) -> None:
    local_dir, url = sample_in_clickhouse(sample)
    with Store.open(local_dir) as local, ClickHouseStore.open(url) as clickhouse:
        expected = itl.analyze_itl(local)
        got = itl.analyze_itl(clickhouse, partition_steps=50)  # the ranges do not change the result
        assert not clickhouse.spans_read  # every aggregation it reads ran in ClickHouse
    assert got == expected


def test_the_slo_summary_runs_in_clickhouse_and_gives_the_same_percentiles_and_buckets() -> None:
    local_dir, url = sample_in_clickhouse("prefill_storm")
    with Store.open(local_dir) as local, ClickHouseStore.open(url) as clickhouse:
        for selection in ({}, {"since_ns": local.sql("SELECT quantile_disc(arrival_ns, 0.5) FROM requests"
                                                     ).fetchall()[0][0]}):
            expected = slo.slo_summary(local, **selection)
            assert slo.slo_summary(clickhouse, **selection) == expected and expected.buckets
        assert not clickhouse.spans_read


def test_rows_are_written_as_the_collector_exporter_writes_them() -> None:
    _, url = sample_in_clickhouse("prefill_storm")
    connection = ChdbConnection(parse_url(url))
    try:
        table = connection.target.table
        kinds = {r["SpanKind"] for r in connection.query_arrow(f"SELECT DISTINCT SpanKind FROM {table}").to_pylist()}
        status = {r["StatusCode"] for r in
                  connection.query_arrow(f"SELECT DISTINCT StatusCode FROM {table}").to_pylist()}
        step = connection.query_arrow(
            f"SELECT ServiceName, SpanAttributes, Duration, toUnixTimestamp64Nano(Timestamp) AS start FROM {table} "
            "WHERE SpanName = 'engine_step' ORDER BY Timestamp LIMIT 1").to_pylist()[0]
        columns = [r["name"] for r in connection.query_arrow(f"DESCRIBE TABLE {table}").to_pylist()]
    finally:
        connection.close()
    assert kinds <= set(SPAN_KINDS) and "Server" in kinds
    assert status <= set(STATUS_CODES)
    attributes = dict(step["SpanAttributes"])
    # arrays arrive as JSON text, integers in decimal, as pcommon's Value.AsString writes them
    assert json.loads(attributes["infertrace.step.durations_ns"]) and attributes["infertrace.step.index"].isdigit()
    assert step["ServiceName"] and step["Duration"] > 0
    assert columns[:4] == ["Timestamp", "TraceId", "SpanId", "ParentSpanId"]
    assert "Events.Timestamp" in columns and "Links.Attributes" in columns


def test_a_declared_key_whose_text_is_not_of_its_type_stays_as_text_in_the_map() -> None:
    url = chdb_url("odd_values")
    connection = ChdbConnection(parse_url(url))
    try:
        create_otel_traces(connection)
        connection.command(
            f"INSERT INTO {connection.target.table} (Timestamp, TraceId, SpanId, SpanName, SpanKind, ServiceName, "
            "ResourceAttributes, SpanAttributes, Duration, StatusCode) VALUES "
            "(toDateTime64('2026-01-01 00:00:00', 9), 'ab', 'cd', 'engine_step', 'Internal', 'e', "
            "map('service.name', 'e'), map('infertrace.step.index', 'seven', 'infertrace.step.running', '3', "
            "'infertrace.step.durations_ns', 'not json', 'custom.key', 'x'), 5, 'Ok')")
    finally:
        connection.close()
    with open_store(url) as store:
        row = store.sql('SELECT "attr.infertrace.step.index", "attr.infertrace.step.running", '
                        '"attr.infertrace.step.durations_ns", span_attributes, end_ns - start_ns, status_code '
                        "FROM spans").fetchall()
        notes = store.notes
    index, running, durations, attributes, duration, status = row[0]
    assert (index, running, durations, duration, status) == (None, 3, None, 5, 1)
    assert attributes == {"infertrace.step.index": "seven", "infertrace.step.durations_ns": "not json",
                          "custom.key": "x"}
    # and the coverage says so, as a local ingest of the same values would
    assert notes == {"kept_as_text": {"infertrace.step.index": 1, "infertrace.step.durations_ns": 1}}


def test_a_password_in_the_url_is_refused_and_read_from_the_environment_instead(tmp_path: Path) -> None:
    from infertrace.store.clickhouse.connection import password_from_env

    with pytest.raises(ValueError, match="INFERTRACE_CLICKHOUSE_PASSWORD"):
        parse_url("clickhouse://oncall:secret@ch1:8123/otel")
    target = parse_url("clickhouse://oncall@ch1/otel")
    assert (target.user, target.host, target.port, target.table) == ("oncall", "ch1", 8123, "otel.otel_traces")
    secret = tmp_path / "pw"
    secret.write_text("s3cret\nignored\n", encoding="utf-8")
    assert password_from_env({"INFERTRACE_CLICKHOUSE_PASSWORD_FILE": str(secret)}) == "s3cret"
    assert password_from_env({"INFERTRACE_CLICKHOUSE_PASSWORD": "a", "INFERTRACE_CLICKHOUSE_PASSWORD_FILE": "x"}) == "a"
    with pytest.raises(ValueError, match="not a plain ClickHouse name"):
        parse_url("clickhouse://u@h/otel;drop")


def test_exporting_twice_stores_each_span_twice_and_readers_read_it_once() -> None:
    local_dir, _ = sample_in_clickhouse("host_pauses")
    url = exported(local_dir, "host_pauses_twice")
    with Store.open(local_dir) as local:
        from infertrace.store.clickhouse.store import export_rows

        export_rows(local, url)
        itl._register(local)
        with ClickHouseStore.open(url) as clickhouse:  # in ClickHouse: the relations and the ITL analysis
            for relation in CLICKHOUSE_RELATIONS:
                expected = _rows(local, relation)
                got = clickhouse_relation_rows(clickhouse, relation, expected)
                assert got.num_rows == expected.num_rows > 0 and got.equals(expected), relation
            assert itl.analyze_itl(clickhouse) == itl.analyze_itl(local)
            assert not clickhouse.spans_read
        with open_store(url) as clickhouse:  # read back
            assert clickhouse.duplicate_rows == local.sql("SELECT count(*) FROM spans").fetchall()[0][0]
            assert clickhouse.conflicting_spans == 0
            assert _rows(clickhouse, "requests").equals(_rows(local, "requests"))


@pytest.mark.slow
def test_evaluate_scores_a_generated_bank_identically_on_both_backends(tmp_path: Path) -> None:
    from infertrace.evaluation import clickhouse_backend
    from infertrace.evaluation.itl import evaluate_itl
    from infertrace.evaluation.rca import evaluate_rca_section
    from reference_engine.scenarios.bank import bank, generate
    from tests.clickhouse_stores import chdb_dir

    generate(bank(seed=3, count=3, duration_s=120.0), tmp_path / "bank")

    def scores() -> dict[str, Any]:
        result = {"itl": evaluate_itl(tmp_path / "bank"), "rca": evaluate_rca_section(tmp_path / "bank")}
        return json.loads(json.dumps(_without_timing(result)))  # wall-clock seconds differ, nothing else may

    local = scores()
    with clickhouse_backend(chdb_dir()):
        clickhouse = scores()
    assert local["itl"]["tp"] > 0 and local["rca"]
    assert clickhouse == local


def _without_timing(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


SERVER_ENV = "INFERTRACE_TEST_CLICKHOUSE_URL"


@pytest.mark.skipif(not os.environ.get(SERVER_ENV), reason=(
    f"no ClickHouse server: set ${SERVER_ENV}=clickhouse://USER@HOST:8123/DB (a scratch database) to run it. None is "
    "installable here: Debian's clickhouse-server is 18.16 (2018), without the DateTime64 and Map columns the "
    "exporter's table needs; PyPI and npm carry clients and chdb, not the server"))
def test_end_to_end_through_clickhouse_connect_to_a_server(opened: dict[str, tuple[Store, Store]]) -> None:
    from infertrace.store.clickhouse.connection import connect
    from infertrace.store.clickhouse.store import export_rows

    url = os.environ[SERVER_ENV]
    connection = connect(url)
    connection.command(f"DROP TABLE IF EXISTS {connection.target.table}")
    connection.close()
    local, _ = _both(opened, "prefill_storm")
    assert export_rows(local, url) == local.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    with open_store(url) as server:
        for relation in RELATIONS:
            assert _rows(server, relation).equals(_rows(local, relation)), relation
        assert _comparable(build_report(server, ReportOptions())) == _comparable(build_report(local, ReportOptions()))


@pytest.mark.slow  # one of the longest in the default run; CI runs it with the slow set
def test_cli_exports_to_and_ingests_from_clickhouse_and_reports_on_it(tmp_path: Path) -> None:
    local_dir = str(sample_in_clickhouse("host_pauses")[0])
    chdb = f"chdb://{tmp_path / 'chdb'}?database=otel"

    def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "infertrace.cli", *args], capture_output=True, text=True,
                              timeout=300, env={**os.environ, **env})

    exported_run = cli("export", "--store", local_dir, "--to", chdb)
    assert exported_run.returncode == 0, exported_run.stderr
    spans = Store.open(local_dir).sql("SELECT count(*) FROM spans").fetchall()[0][0]
    assert f"Wrote {spans} spans to" in exported_run.stderr
    report = cli("report", "--store", chdb, "--format", "json", "--fail-on", "never")
    assert report.returncode == 0, report.stderr
    with Store.open(local_dir) as local:
        assert _comparable(json.loads(report.stdout))["sections"] == _comparable(build_report(local))["sections"]
    pulled = cli("ingest", "--store", str(tmp_path / "pulled"), "--from", chdb, "--no-materialize")
    assert pulled.returncode == 0 and f"Read {spans} spans" in pulled.stderr, pulled.stderr
    with Store.open(tmp_path / "pulled") as back, Store.open(local_dir) as local:
        assert _rows(back, "tokens").equals(_rows(local, "tokens"))
    refused = cli("report", "--store", "clickhouse://oncall:secret@127.0.0.1:1/otel")
    assert refused.returncode == 2 and "INFERTRACE_CLICKHOUSE_PASSWORD" in refused.stderr
    unreachable = cli("query", "--store", "clickhouse://oncall@127.0.0.1:1/otel", "slowest_requests",
                      INFERTRACE_CLICKHOUSE_PASSWORD="x")
    assert unreachable.returncode == 2 and "--store clickhouse://oncall@127.0.0.1:1/otel" in unreachable.stderr


def test_once_the_spans_are_read_back_aggregations_run_on_that_copy_not_again_in_clickhouse() -> None:
    """A report reads every relation for its coverage first; its SLO, anomaly and ITL aggregations then run on the
    spans already read back (the same DuckDB text), without making the relation tables in ClickHouse again."""
    local_dir, url = sample_in_clickhouse("prefill_storm")
    temporary = "SELECT count() FROM system.tables WHERE is_temporary AND name LIKE 'infertrace_%'"
    with Store.open(local_dir) as local, ClickHouseStore.open(url) as clickhouse:
        assert clickhouse.pushes_down("slo_requests")
        clickhouse.sql("SELECT count(*) FROM requests").fetchall()  # a view: the spans come back
        assert clickhouse.spans_read and not clickhouse.pushes_down("slo_requests")
        assert slo.slo_summary(clickhouse) == slo.slo_summary(local)
        assert itl.analyze_itl(clickhouse) == itl.analyze_itl(local)
        assert clickhouse.connection.query_arrow(temporary).column(0).to_pylist() == [0]
        clickhouse.refresh()  # a new snapshot: not read back yet, so pushed down again
        assert clickhouse.pushes_down("slo_requests")
        assert slo.slo_summary(clickhouse) == slo.slo_summary(local)
        assert clickhouse.connection.query_arrow(temporary).column(0).to_pylist() != [0]
