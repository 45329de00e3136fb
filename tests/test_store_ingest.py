"""Ingest of OTLP JSON lines into the store, checked against the official opentelemetry-proto parser."""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import zstandard
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from infertrace import semconv as sc
from infertrace.otlp_json import message_to_otlp_json, parse_traces_data
from infertrace.store.batch import MIN_START_NS
from infertrace.store.ingest import ingest_paths
from infertrace.store.segments import list_segments
from infertrace.store.store import Store
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.tracer import EngineTracer, engine_resource
from reference_engine.workload import SyntheticWorkload, synthetic_requests

T0 = 1_767_225_600_000_000_000


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20-second synthetic simulation (prefix caching, chunked prefill), written as OTLP JSON lines in
    small batches (many lines)."""
    return _write_trace(tmp_path_factory.mktemp("trace") / "sim.jsonl")


def _write_trace(path: Path) -> Path:
    """`trace_file`'s run, written to `path` (.gz: gzip, .zst: zstd)."""
    config = EngineConfig(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=2048)
    requests = synthetic_requests(SyntheticWorkload(rate=6.0), 20.0, seed=3, model=config.model)
    writer = OtlpJsonLinesWriter(path)
    tracer = EngineTracer(writer, engine_resource(config), seed=3, batch_size=97)
    LLMEngine(config, observers=[tracer]).run(requests)
    tracer.close()
    writer.close()
    return path


def _official_spans(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Every span of the file as the official parser reads it, keyed by (hex trace id, hex span id)."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            data = parse_traces_data(line)
            for rs in data.resource_spans:
                resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out[(s.trace_id.hex(), s.span_id.hex())] = {
                            "parent_span_id": s.parent_span_id.hex() or None, "name": s.name, "kind": s.kind,
                            "start_ns": s.start_time_unix_nano, "end_ns": s.end_time_unix_nano,
                            "attributes": {kv.key: _value(kv.value) for kv in s.attributes},
                            "resource": resource,
                            "events": [(e.name, e.time_unix_nano, {kv.key: _value(kv.value) for kv in e.attributes})
                                       for e in s.events]}
    return out


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def test_every_span_and_attribute_round_trips_as_the_official_parser_reads_it(trace_file: Path,
                                                                             tmp_path: Path) -> None:
    summary = ingest_paths(tmp_path / "store", [trace_file])
    expected = _official_spans(trace_file)
    assert summary.spans_read == summary.spans_new == len(expected) > 500
    assert summary.skipped == 0
    with Store.open(tmp_path / "store") as store:
        table = store.sql("SELECT * FROM spans").to_arrow_table()
    assert table.num_rows == len(expected)
    attribute_columns = [c for c in table.column_names if c.startswith("attr.")]
    resource_columns = [c for c in table.column_names if c.startswith("res.")]
    for row in table.to_pylist():
        want = expected[(row["trace_id"], row["span_id"])]
        assert row["parent_span_id"] == want["parent_span_id"]
        assert (row["name"], row["kind"], row["start_ns"], row["end_ns"]) == (
            want["name"], want["kind"], want["start_ns"], want["end_ns"])
        got_attributes = {c[5:]: row[c] for c in attribute_columns if row[c] is not None}
        assert got_attributes == want["attributes"]
        got_resource = {c[4:]: row[c] for c in resource_columns if row[c] is not None}
        assert got_resource == want["resource"]
        got_events = [(e["name"], e["time_ns"], json.loads(e["attributes"])) for e in row["events"] or []]
        assert got_events == want["events"]


def test_hex_ids_parse_wrongly_without_conversion_and_round_trip_with_it() -> None:
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "x",
        "startTimeUnixNano": "1", "endTimeUnixNano": "2"}]}]}]})
    naive = json_format.Parse(line, TracesData())
    assert len(naive.resource_spans[0].scope_spans[0].spans[0].trace_id) == 24  # the pitfall: silently wrong
    parsed = parse_traces_data(line)
    span = parsed.resource_spans[0].scope_spans[0].spans[0]
    assert span.trace_id.hex() == "5b8efff798038103d269b633813fc60c"
    assert span.span_id.hex() == "eee19b7ec3c1b174"
    again = json.loads(message_to_otlp_json(parsed))["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert (again["traceId"], again["spanId"]) == ("5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174")
    assert base64.b64decode(json_format.MessageToDict(parsed)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
                            ["traceId"]).hex() == "5b8efff798038103d269b633813fc60c"


def test_reingesting_the_same_file_adds_no_rows_and_no_segments(trace_file: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = ingest_paths(store, [trace_file])
    segments = list_segments(store)
    second = ingest_paths(store, [trace_file])
    assert second.spans_read == first.spans_read and second.spans_new == 0
    assert list_segments(store) == segments
    with Store.open(store) as s:
        assert s.sql("SELECT count(*) FROM spans_raw").fetchall() == [(first.spans_read,)]


def test_gzip_zstd_directories_and_globs_ingest_the_same_spans_once(trace_file: Path, tmp_path: Path) -> None:
    inputs = tmp_path / "in" / "nested"
    inputs.mkdir(parents=True)
    with open(trace_file, "rb") as src, gzip.open(inputs / "sim.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    with open(trace_file, "rb") as src, zstandard.open(inputs / "sim.ndjson.zst", "wb") as packed:
        shutil.copyfileobj(src, packed)
    shutil.copy(trace_file, tmp_path / "in" / "copy.jsonl")
    (tmp_path / "in" / "notes.txt").write_text("not a trace")
    summary = ingest_paths(tmp_path / "store", [tmp_path / "in", str(tmp_path / "in" / "*.jsonl")])
    assert summary.files == 3 and summary.skipped == 0
    with Store.open(tmp_path / "store") as s:
        total, distinct = s.sql("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchall()[0]
    assert total == distinct == len(_official_spans(trace_file))


def test_the_engine_writes_gzip_and_zstd_that_decompress_to_its_plain_trace_and_ingest_the_same_spans(
        trace_file: Path, tmp_path: Path) -> None:
    plain = trace_file.read_bytes()
    gz, zst = _write_trace(tmp_path / "sim.jsonl.gz"), _write_trace(tmp_path / "sim.jsonl.zst")
    assert gzip.decompress(gz.read_bytes()) == plain
    with zstandard.ZstdDecompressor().stream_reader(zst.read_bytes(), read_across_frames=True) as unpacked:
        assert unpacked.read() == plain  # a standard zstd stream: zstandard's own reader, not ingest's
    assert zst.stat().st_size < len(plain) / 5
    assert _write_trace(tmp_path / "again.jsonl.zst").read_bytes() == zst.read_bytes()  # a fixed seed, the same bytes
    tables = []
    for path in (trace_file, gz, zst):
        summary = ingest_paths(tmp_path / f"store-{path.name}", [path])
        assert summary.skipped == 0 and summary.rejected_lines == summary.rejected_spans == 0
        with Store.open(tmp_path / f"store-{path.name}") as store:
            tables.append(store.sql("SELECT * FROM spans ORDER BY trace_id, span_id").to_arrow_table())
    assert tables[0].num_rows == len(_official_spans(trace_file))
    assert tables[1].equals(tables[0]) and tables[2].equals(tables[0])


def test_spans_the_same_data_batched_differently_are_counted_once(trace_file: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    ingest_paths(store, [trace_file], block_bytes=100_000)
    ingest_paths(store, [trace_file], block_bytes=250_000)
    with Store.open(store) as s:
        raw = s.sql("SELECT count(*) FROM spans_raw").fetchall()[0][0]
        unique = s.sql("SELECT count(*) FROM spans").fetchall()[0][0]
        requests = s.sql("SELECT count(*), count(DISTINCT request_id) FROM requests").fetchall()[0]
    assert raw > unique == len(_official_spans(trace_file))
    assert requests[0] == requests[1]


def test_a_bad_line_or_span_is_quarantined_with_file_line_and_reason_and_the_rest_ingested(
        trace_file: Path, tmp_path: Path) -> None:
    good = trace_file.read_text().splitlines()
    bad_span = json.loads(good[1])
    spans = bad_span["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["traceId"] = "not-hex"
    spans[1]["startTimeUnixNano"] = "soon"
    lines = [good[0], json.dumps(bad_span), "{truncated", '"a string"', "", *good[2:]]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    summary = ingest_paths(tmp_path / "store", [path])
    assert (summary.rejected_lines, summary.rejected_spans) == (2, 2)
    assert summary.spans_read == len(_official_spans(trace_file)) - 2
    kept = [json.loads(line) for q in summary.quarantine for line in q.read_text().splitlines()]
    by_line = {k["line"]: k for k in kept}
    assert set(by_line) == {2, 3, 4}
    assert all(k["source"] == str(path) for k in kept)
    assert any("traceId" in k["reason"] and '"not-hex"' in k["record"] for k in kept if k["line"] == 2)
    assert any("startTimeUnixNano" in k["reason"] for k in kept if k["line"] == 2)
    assert "not JSON" in by_line[3]["reason"] and by_line[3]["record"] == "{truncated"
    assert "not a TracesData" in by_line[4]["reason"]
    assert "Skipped 2 lines and 2 spans" in summary.paragraph()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "infertrace.cli", *args], capture_output=True, text=True,
                          timeout=120)
    done.stderr = " ".join(done.stderr.split())  # rich wraps lines to the terminal width
    return done


@pytest.mark.slow
def test_cli_ingest_exit_codes_strict_and_missing_paths(trace_file: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nonsense\n" + trace_file.read_text().splitlines()[0] + "\n")
    store = str(tmp_path / "store")
    lenient = _cli("ingest", "--store", store, "--no-progress", str(bad))
    assert lenient.returncode == 0, lenient.stderr
    assert "Skipped 1 lines" in lenient.stderr
    strict = _cli("ingest", "--store", store, "--no-progress", "--strict", str(bad))
    assert strict.returncode == 1
    missing = _cli("ingest", "--store", store, "--no-progress", str(tmp_path / "absent.jsonl"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    clean = _cli("ingest", "--store", store, "--no-progress", "--strict", str(trace_file))
    assert clean.returncode == 0, clean.stderr
    nothing = tmp_path / "nothing.jsonl"
    nothing.write_text('{"status": "not found"}\n')  # what a trace API answers for an unknown id
    rejected = _cli("ingest", "--store", store, "--no-progress", str(nothing))
    assert rejected.returncode == 1 and "Nothing was stored: everything given was rejected" in rejected.stderr


def test_a_first_line_that_is_a_bare_null_is_quarantined_and_the_spans_after_it_are_stored(
        trace_file: Path, tmp_path: Path) -> None:
    # Arrow 26's JSON reader crashes the process (SIGSEGV) on a block that starts with such a line: run the ingest
    # in a child process so that a crash fails this test instead of ending the test run.
    good = trace_file.read_text().splitlines()[:2]
    path = tmp_path / "with-null.jsonl"
    path.write_text(f"null\n{good[0]}\n{good[1]}\n", encoding="utf-8")
    script = ("import json, sys; from pathlib import Path; from infertrace.store.ingest import ingest_paths; "
              "s = ingest_paths(Path(sys.argv[1]), [Path(sys.argv[2])]); "
              "print(json.dumps([s.spans_new, s.rejected_lines, [str(q) for q in s.quarantine]]))")
    child = subprocess.run([sys.executable, "-c", script, str(tmp_path / "store"), str(path)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    spans_new, rejected_lines, quarantine = json.loads(child.stdout.splitlines()[-1])
    expected = sum(len(json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]) for line in good)
    assert (spans_new, rejected_lines) == (expected, 1)
    kept = [json.loads(x) for q in quarantine for x in Path(q).read_text().splitlines()]
    assert [k["line"] for k in kept] == [1]


def test_segments_are_valid_parquet_partitioned_by_date_and_service(trace_file: Path, tmp_path: Path) -> None:
    ingest_paths(tmp_path / "store", [trace_file])
    segments = list_segments(tmp_path / "store")
    assert segments
    for segment in segments:
        assert segment.parent.name == "service=llm-engine"
        assert segment.parent.parent.name.startswith("date=20")
        table = pq.read_table(segment)
        assert set(table["res.service.name"].to_pylist()) == {"llm-engine"}
    assert not list((tmp_path / "store").rglob("*.tmp"))


# ------------------------------------------------------------------------------ vLLM and components
def _readable(name: str, attributes: dict[str, Any], resource: dict[str, Any], start: int, end: int,
              trace_id: int, span_id: int, parent: int | None = None) -> ReadableSpan:
    flags = TraceFlags(TraceFlags.SAMPLED)
    return ReadableSpan(
        name=name, context=SpanContext(trace_id, span_id, False, flags),
        parent=SpanContext(trace_id, parent, False, flags) if parent else None,
        resource=Resource(resource), attributes=attributes, kind=SpanKind.SERVER, start_time=start, end_time=end)


def _write_sdk_spans(path: Path, spans: list[ReadableSpan]) -> None:
    """Encodes spans with the SDK's own OTLP encoder and writes them as one OTLP JSON line."""
    path.write_text(message_to_otlp_json(encode_spans(spans)) + "\n")


def test_vllm_llm_request_spans_become_requests_rows(tmp_path: Path) -> None:
    t0 = 1_767_225_600_000_000_000
    vllm = {"gen_ai.request.id": "cmpl-abc", "gen_ai.response.model": "meta-llama/Llama-3.1-8B-Instruct",
            "gen_ai.usage.prompt_tokens": 812, "gen_ai.usage.completion_tokens": 64, "gen_ai.request.max_tokens": 128,
            "gen_ai.request.temperature": 0.7, "gen_ai.request.top_p": 0.9, "gen_ai.request.n": 1,
            "gen_ai.latency.time_in_queue": 0.012, "gen_ai.latency.time_to_first_token": 0.085,
            "gen_ai.latency.e2e": 1.25, "gen_ai.latency.time_in_model_prefill": 0.073,
            "gen_ai.latency.time_in_model_decode": 1.165}
    span = _readable("llm_request", vllm, {"service.name": "vllm"}, t0, t0 + 1_250_000_000, 0xABC, 0x123)
    _write_sdk_spans(tmp_path / "vllm.jsonl", [span])
    ingest_paths(tmp_path / "store", [tmp_path / "vllm.jsonl"])
    with Store.open(tmp_path / "store") as store:
        rows = store.sql("SELECT * FROM requests").to_arrow_table().to_pylist()
    assert len(rows) == 1
    row = rows[0]
    assert row["request_id"] == "cmpl-abc" and row["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert (row["input_tokens"], row["output_tokens"], row["max_tokens"]) == (812, 64, 128)
    assert row["timing_source"] == "gen_ai.latency"
    assert row["queue_ns"] == 12_000_000 and row["ttft_ns"] == 85_000_000
    assert row["prefill_ns"] == 73_000_000 and row["e2e_ns"] == 1_250_000_000
    assert row["decode_ns"] == 1_250_000_000 - 85_000_000
    assert row["outcome"] == "ok"


def test_component_spans_become_component_calls_with_model_from_the_gateway(tmp_path: Path) -> None:
    t0 = 1_767_225_600_000_000_000
    trace = 0x5B8EFFF798038103D269B633813FC60C

    def resource(kind: str, instance: str) -> dict[str, Any]:
        return {sc.SERVICE_NAME: kind, sc.SERVICE_INSTANCE_ID: instance, sc.COMPONENT_KIND: kind}

    common = {sc.REQUEST_ID: "req-1", sc.TENANT_ID: "acme"}
    spans = [
        _readable("gateway", {**common, sc.REQUEST_MODEL: "llama-3-8b", sc.HTTP_STATUS_CODE: 429},
                  resource("gateway", "gw-0"), t0, t0 + 5_000_000, trace, 1),
        _readable("auth", {**common, sc.COMPONENT_OUTCOME: "ok", sc.HTTP_STATUS_CODE: 200},
                  resource("auth", "auth-0"), t0 + 100, t0 + 700_100, trace, 2, 1),
        _readable("rate_limit", {**common, sc.COMPONENT_OUTCOME: "rejected", sc.HTTP_STATUS_CODE: 429},
                  resource("rate_limiter", "rl-1"), t0 + 800_000, t0 + 1_000_000, trace, 3, 1),
        _readable("route", {**common, sc.COMPONENT_OUTCOME: "ok", sc.ROUTE_TARGET: "engine-3"},
                  resource("router", "router-0"), t0 + 1_000_000, t0 + 1_500_000, trace, 4, 1),
    ]
    _write_sdk_spans(tmp_path / "fleet.jsonl", spans)
    ingest_paths(tmp_path / "store", [tmp_path / "fleet.jsonl"])
    with Store.open(tmp_path / "store") as store:
        rows = {r["component"]: r for r in store.sql("SELECT * FROM component_calls").to_arrow_table().to_pylist()}
    assert set(rows) == {"gateway", "auth", "rate_limit", "route"}
    assert rows["auth"]["latency_ns"] == 700_000 and rows["auth"]["instance"] == "auth-0"
    assert rows["rate_limit"]["outcome"] == "rejected" and rows["rate_limit"]["http_status"] == 429
    assert rows["rate_limit"]["component_kind"] == "rate_limiter"
    assert rows["route"]["route_target"] == "engine-3"
    assert rows["gateway"]["outcome"] == "rejected"  # no outcome attribute: derived from HTTP 429
    assert {r["model"] for r in rows.values()} == {"llama-3-8b"}
    assert {r["tenant"] for r in rows.values()} == {"acme"}
    assert {r["request_id"] for r in rows.values()} == {"req-1"}


def test_an_empty_store_has_every_relation_with_no_rows(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    with Store.open(tmp_path / "store") as store:
        for name in ("spans", "requests", "steps", "step_membership", "tokens", "component_calls"):
            assert store.sql(f"SELECT count(*) FROM {name}").fetchall() == [(0,)]
    with pytest.raises(FileNotFoundError):
        Store.open(tmp_path / "absent")


def test_simulate_summary_matches_the_requests_relation(tmp_path: Path) -> None:
    config = EngineConfig()
    requests = synthetic_requests(SyntheticWorkload(rate=3.0), 10.0, seed=5, model=config.model)
    out = tmp_path / "s.jsonl.gz"
    simulate(config, requests, OtlpJsonLinesWriter(out), seed=5)
    ingest_paths(tmp_path / "store", [out])
    with Store.open(tmp_path / "store") as store:
        got = store.sql("SELECT count(*), sum(output_tokens), sum(input_tokens) FROM requests").fetchall()[0]
        tokens = store.sql("SELECT count(*) FROM tokens").fetchall()[0][0]
    assert got == (len(requests), sum(r.output_tokens for r in requests), sum(r.prompt.num_tokens for r in requests))
    assert tokens == got[1]


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3),
                     max_leaves=15)
_junk_line = st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ").decode("latin-1")) | _json.map(json.dumps)


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_lines_never_crash_the_ingester_and_every_span_is_stored_or_quarantined(
        trace_file: Path, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    good = trace_file.read_text().splitlines()[:3]
    mutated = []
    for line in good:
        obj = json.loads(line)
        span = obj["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        span[data.draw(st.sampled_from(["traceId", "spanId", "kind", "startTimeUnixNano", "attributes", "status",
                                        "events", "name"]))] = data.draw(_json)
        mutated.append(json.dumps(obj, allow_nan=True))
    lines = data.draw(st.permutations([*mutated, *data.draw(st.lists(_junk_line, max_size=4))]))
    root = tmp_path_factory.mktemp("fuzz")
    path = root / "in.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = ingest_paths(root / "store", [path])
    kept = [json.loads(x) for q in summary.quarantine for x in q.read_text().splitlines()]
    whole = {k["line"] for k in kept if k["reason"].startswith(("not JSON", "not a TracesData"))}
    spans_per_line = {i + 1: len(json.loads(x)["resourceSpans"][0]["scopeSpans"][0]["spans"])
                      for i, x in enumerate(lines) if x in mutated}
    assert summary.spans_read + summary.rejected_spans == sum(
        n for line, n in spans_per_line.items() if line not in whole)
    assert summary.rejected_lines == len(whole) >= sum(1 for x in lines if x.strip() and x not in mutated)
    with Store.open(root / "store") as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall() == [(summary.spans_new,)]
        store.sql("SELECT count(*) FROM requests").fetchall()


# ------------------------------------------------------------------ the two parsing paths agree
def _both_paths(lines: list[str]) -> tuple[Any, Any]:
    import pyarrow as pa

    from infertrace.store.batch import SpanBatch
    from infertrace.store.columnar import decode_block

    data = "".join(line + "\n" for line in lines).encode()
    decoded = decode_block(data, max(len(line) for line in lines))
    batch = SpanBatch()
    for i, line in enumerate(lines):
        batch.add_traces_data(json.loads(line), "x", i + 1)
    assert not batch.rejections
    slow = batch.table()
    assert decoded is not None
    fast, notes = decoded
    assert isinstance(fast, pa.Table)
    assert notes.counts() == batch.notes.counts()
    return fast, slow


def test_columnar_and_record_by_record_parsing_give_the_same_table(trace_file: Path) -> None:
    fast, slow = _both_paths(trace_file.read_text().splitlines())
    assert fast.schema == slow.schema
    assert fast.equals(slow)


_attribute_value = st.one_of(
    st.text(max_size=8).map(lambda s: {"stringValue": s}),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: {"intValue": str(i)}),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: {"doubleValue": f}),
    st.booleans().map(lambda b: {"boolValue": b}),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4).map(
        lambda xs: {"arrayValue": {"values": [{"intValue": str(x)} for x in xs]}}),
    st.lists(st.text(max_size=5), max_size=4).map(
        lambda xs: {"arrayValue": {"values": [{"stringValue": x} for x in xs]}}),
)
_event_value = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(lambda i: {"intValue": str(i)}),
    st.sampled_from(["007", "-0", "+1"]).map(lambda s: {"intValue": s}),  # not as int() writes them back
    st.text(max_size=5).map(lambda s: {"stringValue": s}),
)
_event = st.fixed_dictionaries(
    {"timeUnixNano": st.integers(0, 2**63 - 1).map(str)},
    optional={"name": st.sampled_from(["first_token", "prefill_chunk", ""]),
              "attributes": st.lists(st.tuples(st.sampled_from(["a", "b", "infertrace.chunk.tokens", 'q"', "é",
                                                                "gen_ai.prompt"]),
                                               _event_value), max_size=3).map(
                  lambda kvs: [{"key": k, "value": v} for k, v in kvs])})
_valid_span = st.fixed_dictionaries({
    "traceId": st.integers(1, 2**128 - 1).map(lambda i: f"{i:032x}"),
    "spanId": st.integers(1, 2**64 - 1).map(lambda i: f"{i:016x}"),
    "name": st.sampled_from(["llm_request", "engine_step", "auth", "x"]),
    "kind": st.integers(0, 5),
    "startTimeUnixNano": st.integers(MIN_START_NS, 2**62).map(str),
    "endTimeUnixNano": st.integers(2**62, 2**63 - 1).map(str),
    "attributes": st.dictionaries(st.sampled_from(["k1", "k2", "k3", sc.REQUEST_ID, "gen_ai.prompt.0.content"]),
                                  _attribute_value,
                                  max_size=4).map(lambda d: [{"key": k, "value": v} for k, v in d.items()]),
}, optional={"parentSpanId": st.integers(1, 2**64 - 1).map(lambda i: f"{i:016x}"),
             "events": st.lists(_event, max_size=3),
             "status": st.fixed_dictionaries({"code": st.integers(0, 2)}, optional={"message": st.text(max_size=5)})})


def test_integer_events_are_built_vectorised_as_the_per_event_path_builds_them() -> None:
    import io

    import pyarrow.json as pj

    from infertrace.store import columnar

    spans = [{"traceId": "1" * 32, "spanId": f"{i + 1:016x}", "name": "llm_request", "startTimeUnixNano": "5",
              "endTimeUnixNano": "9", "events": events} for i, events in enumerate([
                  [{"timeUnixNano": "7", "name": "first_token", "attributes": []}],
                  [{"timeUnixNano": "6", "name": "prefill_chunk", "attributes": [
                      {"key": "infertrace.chunk.tokens", "value": {"intValue": "512"}},
                      {"key": "infertrace.chunk.computed_tokens", "value": {"intValue": "-3"}}]},
                   {"timeUnixNano": "8"}],
                  [], None])]
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode() + b"\n"
    parsed = pj.read_json(io.BytesIO(line), parse_options=columnar._PARSE)
    events = parsed.column("resourceSpans").combine_chunks().flatten().field("scopeSpans").flatten().field(
        "spans").flatten().field("events")
    fast = columnar._integer_events(events)
    assert fast is not None and fast.equals(columnar._events_in_python(events))
    assert fast.to_pylist() == [
        [{"time_ns": 7, "name": "first_token", "attributes": "{}"}],
        [{"time_ns": 6, "name": "prefill_chunk",
          "attributes": '{"infertrace.chunk.tokens":512,"infertrace.chunk.computed_tokens":-3}'},
         {"time_ns": 8, "name": "", "attributes": "{}"}],
        None, None]


@settings(max_examples=100, deadline=None)
@given(spans=st.lists(_valid_span, min_size=1, max_size=6))
def test_both_parsing_paths_agree_or_the_fast_one_defers(spans: list[dict[str, Any]]) -> None:
    from infertrace.store.batch import SpanBatch
    from infertrace.store.columnar import decode_block

    lines = [json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "s"}}]}, "scopeSpans": [{"spans": [s]}]}]}) for s in spans]
    data = "".join(line + "\n" for line in lines).encode()
    decoded = decode_block(data, max(map(len, lines)))
    batch = SpanBatch()
    for i, line in enumerate(lines):
        batch.add_traces_data(json.loads(line), "x", i + 1)
    assert not batch.rejections  # no attribute value rejects a span: converted, or kept as text
    slow = batch.table()
    if decoded is not None:  # mixed value kinds under one key across spans make the fast path defer
        fast, notes = decoded
        assert fast.schema == slow.schema and fast.equals(slow)
        assert notes.counts() == batch.notes.counts()


def test_materialized_relations_answer_like_the_views_and_unknown_names_are_refused(
        trace_file: Path, tmp_path: Path) -> None:
    ingest_paths(tmp_path / "store", [trace_file])
    query = "SELECT request_id, count(*), sum(itl_ns) FROM tokens GROUP BY ALL ORDER BY request_id"
    with Store.open(tmp_path / "store") as store:
        as_views = store.sql(query).fetchall()
        store.materialize(["steps", "tokens"])
        assert store.sql(query).fetchall() == as_views
        assert store.relation("tokens").aggregate("count(*)").fetchall() == [(sum(n for _, n, _ in as_views),)]
        with pytest.raises(KeyError):
            store.relation("nope")
        rid = as_views[0][0]
        assert store.sql("SELECT count(*) FROM tokens WHERE request_id = $rid", {"rid": rid}).fetchall() == [
            (as_views[0][1],)]


def test_an_undeclared_key_with_a_scalar_in_one_span_and_an_empty_list_in_another_is_kept_as_text_in_the_map(
        tmp_path: Path) -> None:
    def span(i: int, value: dict[str, Any]) -> dict[str, Any]:
        return {"traceId": f"{1:032x}", "spanId": f"{i:016x}", "name": "x", "startTimeUnixNano": str(T0),
                "endTimeUnixNano": str(T0 + 1), "attributes": [{"key": "k", "value": value}]}

    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        span(1, {"intValue": "7"}), span(2, {"arrayValue": {}}), span(3, {"arrayValue": {"values": []}})]}]}]})
    (tmp_path / "t.jsonl").write_text(line + "\n")
    summary = ingest_paths(tmp_path / "store", [tmp_path / "t.jsonl"])
    assert summary.spans_read == 3 and summary.skipped == 0
    with Store.open(tmp_path / "store") as store:
        assert store.sql("SELECT span_id, span_attributes['k'] FROM spans ORDER BY span_id").fetchall() == [
            (f"{1:016x}", "7"), (f"{2:016x}", "[]"), (f"{3:016x}", "[]")]


def test_spans_without_events_take_the_columnar_path_and_match_the_record_path(trace_file: Path) -> None:
    lines = []
    for line in trace_file.read_text().splitlines():
        data = json.loads(line)
        for rs in data["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    span.pop("events", None)
        lines.append(json.dumps(data))
    fast, slow = _both_paths(lines)  # asserts that the columnar path took the block (no event times to read)
    assert fast.equals(slow)
    assert fast.column("events").null_count == fast.num_rows


# chunk=1 (a byte per read) is the slowest case of the default run: CI runs it with the slow set
@pytest.mark.parametrize("chunk", [pytest.param(1, marks=pytest.mark.slow), 37, 4096])
def test_lines_cut_across_reads_keep_their_numbers_and_over_long_ones_are_quarantined(
        trace_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    from infertrace.store import ingest

    monkeypatch.setattr(ingest, "_READ_CHUNK", chunk)
    good = trace_file.read_text().splitlines()[:6]
    limit = max(map(len, good)) + 2
    lines = [good[0], "x" * (limit + 1), "", "   ", good[1] + "\r", "{bad", *good[2:], "y" * (3 * limit)]
    path = tmp_path / "lines.jsonl"
    path.write_text("\n".join(lines))  # the last line has no newline
    want = sum(len(ss["spans"]) for line in good for rs in json.loads(line)["resourceSpans"]
               for ss in rs["scopeSpans"])
    for block_bytes in (1, 1 << 20):
        store = tmp_path / f"store-{block_bytes}"
        summary = ingest_paths(store, [path], block_bytes=block_bytes, max_line_bytes=limit)
        assert (summary.lines, summary.spans_read, summary.rejected_lines) == (len(lines), want, 3)
        kept = {k["line"]: k for q in summary.quarantine for k in map(json.loads, q.read_text().splitlines())}
        assert set(kept) == {2, 6, len(lines)}
        assert f"line of {limit + 2} bytes is over the limit" in kept[2]["reason"]
        assert kept[2]["record"].startswith("xxx") and len(kept[2]["record"]) < 1000
        assert "not JSON" in kept[6]["reason"] and kept[6]["record"] == "{bad"
        assert f"line of {3 * limit} bytes is over the limit" in kept[len(lines)]["reason"]
        with Store.open(store) as opened:
            assert opened.sql("SELECT count(*) FROM spans").fetchall() == [(want,)]


@pytest.mark.parametrize("where", ["attribute", "event", "start"])
@pytest.mark.parametrize("text", ["0x1A", "0X1A", "1x"])
def test_integers_arrow_would_read_as_hex_are_left_to_the_record_path(where: str, text: str) -> None:
    from infertrace.store.columnar import decode_block

    span: dict[str, Any] = {"traceId": "1" * 32, "spanId": "2" * 16, "name": "x", "startTimeUnixNano": "1" * 19,
                            "endTimeUnixNano": "2" * 19, "attributes": [{"key": "k", "value": {"intValue": "26"}}],
                            "events": [{"timeUnixNano": "5", "attributes": [{"key": "n", "value": {"intValue": "3"}}]}]}
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    assert decode_block((line + "\n").encode(), len(line) + 1) is not None  # the plain form takes the fast path
    if where == "attribute":
        span["attributes"][0]["value"]["intValue"] = text
    elif where == "event":
        span["events"][0]["attributes"][0]["value"]["intValue"] = text
    else:
        span["startTimeUnixNano"] = text
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    assert decode_block((line + "\n").encode(), len(line) + 1) is None


# ------------------------------------------------------------------ the narrow read of later blocks
def _block(lines: list[str]) -> tuple[bytes, int]:
    return "".join(line + "\n" for line in lines).encode(), max(map(len, lines)) + 1


def _line(spans: list[dict[str, Any]]) -> str:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "s"}}]}, "scopeSpans": [{"spans": spans}]}]},
        allow_nan=True)


def _same_parse(first: list[str], second: list[str]) -> None:
    """A block read after another (narrowly, or again in full) gives what reading it alone in full gives."""
    from infertrace.store.columnar import BlockParser, parse_block

    parser = BlockParser()
    parser.parse(*_block(first))
    got, want = parser.parse(*_block(second)), parse_block(*_block(second))
    assert (got is None) == (want is None)
    if want is not None:
        assert got is not None and got.schema == want.schema and got.equals(want)


@settings(max_examples=60, deadline=None)
@given(first=st.lists(_valid_span, min_size=1, max_size=4), second=st.lists(_valid_span, min_size=1, max_size=4),
       data=st.data())
def test_a_block_read_with_the_previous_blocks_fields_gives_the_table_of_the_full_schema(
        first: list[dict[str, Any]], second: list[dict[str, Any]], data: st.DataObject) -> None:
    if data.draw(st.booleans()):  # a value of any JSON type where the second block's first span has a field
        field = data.draw(st.sampled_from(["traceId", "kind", "startTimeUnixNano", "attributes", "status", "events",
                                           "name", "flags", "links"]))
        second[0][field] = data.draw(_json)
    _same_parse([_line([s]) for s in first], [_line([s]) for s in second])


def test_fields_the_first_block_never_set_are_read_in_full_in_the_next_one() -> None:
    from infertrace.store.columnar import BlockParser

    span = {"traceId": "1" * 32, "spanId": "2" * 16, "name": "x", "startTimeUnixNano": "1" * 19,
            "endTimeUnixNano": "2" * 19, "attributes": [{"key": "k", "value": {"intValue": "26"}}]}
    first = [_line([span])]
    parser = BlockParser()
    parser.parse(*_block(first))
    narrow = parser._narrow
    assert narrow is not None and "doubleValue" not in str(narrow.explicit_schema)  # the narrow read leaves it out
    for value in ({"doubleValue": 2.5}, {"doubleValue": "1e3"}, {"boolValue": 1}, {"arrayValue": {"values": [
            {"intValue": "3"}]}}, {"kvlistValue": {"values": []}}):
        _same_parse(first, [_line([{**span, "attributes": [{"key": "k", "value": value}]}])])
    deep = 100_000  # nesting Arrow's schema inference crashes on; the full schema ignores the field
    _same_parse(first, [_line([span])[:-1] + ', "x": ' + "[" * deep + "]" * deep + "}"])


def test_fields_ingest_does_not_read_keep_the_narrow_read_and_give_the_full_schemas_table() -> None:
    from infertrace.store.columnar import BlockParser, parse_block

    span = {"traceId": "1" * 32, "spanId": "2" * 16, "name": "x", "startTimeUnixNano": "1" * 19,
            "endTimeUnixNano": "2" * 19, "attributes": [{"key": "k", "value": {"intValue": "26"}}]}
    plain, flagged = _block([_line([span])]), _block([_line([{**span, "flags": 256, "traceState": "a=1"}])])
    parser = BlockParser()
    parser.parse(*plain)
    parser.parse(*flagged)  # refused narrowly: read in full, and the narrow schema declares the unread fields
    assert parser._narrow is not None and "flags" in str(parser._narrow.explicit_schema)
    got = parser.parse(*flagged)
    want = parse_block(*flagged)
    assert got is not None and want is not None and got.equals(want)
    assert "flags" not in str(got.schema)
    _same_parse([_line([span])], [_line([{**span, "flags": "256"}])])  # of another type: read in full


def test_ingest_in_many_blocks_stores_what_the_record_path_stores(trace_file: Path, tmp_path: Path) -> None:
    import pyarrow as pa

    def stored(store: Path) -> pa.Table:
        tables = [pq.read_table(p) for p in list_segments(store)]
        return pa.concat_tables(tables).sort_by([("trace_id", "ascending"), ("span_id", "ascending")])

    fast = ingest_paths(tmp_path / "fast", [trace_file], block_bytes=50_000)  # later blocks read narrowly
    slow = ingest_paths(tmp_path / "slow", [trace_file], block_bytes=50_000, columnar=False)
    assert fast.spans_read == slow.spans_read == len(_official_spans(trace_file)) and not fast.skipped
    assert stored(tmp_path / "fast").equals(stored(tmp_path / "slow"))


def test_ingest_pauses_the_garbage_collector_and_leaves_no_cyclic_garbage_per_block(trace_file: Path,
                                                                                     tmp_path: Path) -> None:
    """The collector is paused for the whole ingest (`ingest` module docstring), which is safe only while a
    block leaves no cyclic garbage: what one collection finds afterwards must not grow with the number of
    blocks, and the collector is enabled again afterwards, also when the ingest fails."""
    import gc

    found = {}
    for block_bytes in (1 << 30, 1):  # one block, then one block per line
        gc.collect()
        ingest_paths(tmp_path / f"store-{block_bytes}", [trace_file], block_bytes=block_bytes)
        assert gc.isenabled()
        found[block_bytes] = gc.collect()
    lines = trace_file.read_bytes().count(b"\n")
    assert lines >= 8
    assert found[1] - found[1 << 30] < lines // 2, (found, lines)  # not one cyclic object per block

    def fail(_: int) -> None:
        raise RuntimeError("progress callback failed")

    with pytest.raises(RuntimeError, match="progress callback failed"):
        ingest_paths(tmp_path / "failed", [trace_file], block_bytes=1, on_progress=fail)
    assert gc.isenabled()


_LINE_STARTS = [b'{"a":1}', b"{}", b"null", b"", b" {", b"x", b"\r", b'{"b":"' + b"y" * 40 + b'"}']


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.sampled_from(_LINE_STARTS), max_size=8), newline_at_end=st.booleans(),
       chunk=st.integers(1, 16), block=st.integers(1, 40), limit=st.sampled_from([30, 1000]))
def test_the_line_reader_says_whether_every_line_of_a_block_starts_with_a_brace_as_the_block_check_does(
        lines: list[bytes], newline_at_end: bool, chunk: int, block: int, limit: int) -> None:
    """Ingest gives Arrow's reader only blocks whose every line starts with `{` (a bare `null` crashes it): the
    line reader notes that while it finds the lines, across chunk boundaries and with over-long lines left
    blank, and must agree with the check on the block's bytes."""
    import io

    import infertrace.store.ingest as ingest
    from infertrace.store.columnar import _every_line_an_object

    data = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    saved = ingest._READ_CHUNK
    ingest._READ_CHUNK = chunk
    try:
        reader = ingest._Lines(io.BufferedReader(io.BytesIO(data)), limit, "f.jsonl")
        while (read := reader.block(block)).lines:
            assert read.objects == _every_line_an_object(bytes(read.data)), (data, read.data)
    finally:
        ingest._READ_CHUNK = saved


def test_a_block_read_stays_as_read_until_the_block_after_the_next_one_and_is_then_released() -> None:
    """The line reader reuses two block buffers in turn: a block must not change while ingest still parses it
    or reads it record by record (the next block is read meanwhile), and afterwards is released, not silently
    overwritten."""
    import io

    from infertrace.store.ingest import _Lines

    lines = [b'{"n":%d,"pad":"%s"}\n' % (i, b"x" * (10 * i)) for i in range(6)]
    reader = _Lines(io.BufferedReader(io.BytesIO(b"".join(lines))), 1 << 20, "f.jsonl")
    first, second = reader.block(1), reader.block(1)
    assert (bytes(first.data), bytes(second.data)) == (lines[0], lines[1])
    third = reader.block(1)
    assert (bytes(second.data), bytes(third.data)) == (lines[1], lines[2])
    with pytest.raises(ValueError, match="released"):
        bytes(first.data)
    assert [bytes(reader.block(1).data) for _ in range(3)] == lines[3:]


@pytest.mark.parametrize(("scale", "unit"), [(10**3, "microseconds"), (10**6, "milliseconds"), (10**9, "seconds"),
                                             (None, "before 2000-01-01")])
def test_times_in_another_unit_are_quarantined_under_one_reason_that_names_the_unit(
        tmp_path: Path, scale: int | None, unit: str) -> None:
    spans = [{"traceId": f"{n + 1:032x}", "spanId": f"{n + 1:016x}", "name": "llm_request",
              "startTimeUnixNano": str(T0 // scale + n if scale else 5 + n),
              "endTimeUnixNano": str(T0 // scale + n + 1 if scale else 6 + n)} for n in range(30)]
    path = tmp_path / "units.jsonl"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}) + "\n")
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.rejected_spans == 30 and summary.spans_read == 0
    [(reason, count)] = summary.reasons.items()
    assert count == 30 and unit in reason, reason


def test_a_store_inside_the_directory_it_ingests_never_reads_its_own_quarantine_back(trace_file: Path,
                                                                                     tmp_path: Path) -> None:
    for inside in ("store", "."):  # a store among the exports, and the exports' directory itself
        exports = tmp_path / f"exports-{len(inside)}"
        exports.mkdir()
        (exports / "traces.jsonl").write_bytes(trace_file.read_bytes() + b'{"not": "a trace"}\n')
        store = exports / inside
        first = ingest_paths(store, [exports])
        quarantined = sorted((store / "quarantine").iterdir())
        again = ingest_paths(store, [exports])
        assert (first.store_files, first.rejected_lines, first.spans_read) == (0, 1, again.spans_read)
        assert again.store_files == len(quarantined) == 1 and again.rejected_lines == 1 and again.spans_new == 0
        assert "Left out 1 files inside the store itself" in again.paragraph()
        assert sorted((store / "quarantine").iterdir()) == quarantined
