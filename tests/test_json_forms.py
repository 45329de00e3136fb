"""Trace JSON as other tools print it ingests as the same spans as OTLP JSON lines.

The forms are made by the official protobuf library from the same messages: its generic JSON mapping (base64
ids, enum names, with or without proto field names, pretty-printed or not), and the wrappers of Tempo's and
Jaeger's query APIs around it. Each is ingested and the stored spans compared, every column, with those of the
OTLP JSON lines (hex ids, integer enums) of the same messages, which take the columnar path."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import json_format
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status, TracesData

from infertrace.otlp_json import message_to_otlp_json, parse_traces_data
from infertrace.store import jaeger_json
from infertrace.store.ingest import ingest_paths
from infertrace.store.json_forms import base64_id
from infertrace.store.store import Store
from infertrace.store.values import Unconverted
from tests.engine_runs import write_trace


@pytest.fixture(scope="module")
def messages(tmp_path_factory: pytest.TempPathFactory) -> list[TracesData]:
    """Five simulated seconds as `TracesData` messages of 25 spans, some spans made client spans and some
    errors (the engine writes neither), so that both enums take every form."""
    path = write_trace(tmp_path_factory.mktemp("trace") / "engine.jsonl", 5.0, seed=9, batch_size=25)
    out = [parse_traces_data(line) for line in path.read_text().splitlines() if line]
    for n, span in enumerate(s for m in out for rs in m.resource_spans for ss in rs.scope_spans for s in ss.spans):
        if n % 5 == 0:
            span.kind = Span.SPAN_KIND_CLIENT
        if n % 7 == 0:
            span.status.code, span.status.message = Status.STATUS_CODE_ERROR, f"failed {n}"
    return out


def _generic(m: TracesData, proto_names: bool = False) -> dict[str, Any]:
    """The protobuf library's own JSON mapping: base64 ids, enum names."""
    return json_format.MessageToDict(m, preserving_proto_field_name=proto_names)


def _pretty(value: Any) -> bytes:
    return json.dumps(value, indent=2).encode() + b"\n"


def _lines(values: list[Any]) -> bytes:
    return b"".join(json.dumps(v).encode() + b"\n" for v in values)


def _pre_015(m: TracesData) -> dict[str, Any]:
    """OTLP JSON as written before 0.15: instrumentationLibrarySpans / instrumentationLibrary."""
    data = json.loads(message_to_otlp_json(m))
    for rs in data["resourceSpans"]:
        rs["instrumentationLibrarySpans"] = [
            {("instrumentationLibrary" if k == "scope" else k): v for k, v in ss.items()}
            for ss in rs.pop("scopeSpans")]
    return data


FORMS: dict[str, Callable[[list[TracesData]], bytes]] = {
    "generic mapping, a line per message": lambda ms: _lines([_generic(m) for m in ms]),
    "generic mapping with proto field names": lambda ms: _lines([_generic(m, proto_names=True) for m in ms]),
    "MessageToJson, pretty, one after another (jq .)": lambda ms: b"".join(
        json_format.MessageToJson(m).encode() + b"\n" for m in ms),
    "Tempo v1 API: one pretty {batches}": lambda ms: _pretty(
        {"batches": [rs for m in ms for rs in _generic(m)["resourceSpans"]]}),
    "Tempo v2 API: {trace}, with a byte-order mark": lambda ms: b"\xef\xbb\xbf" + _pretty(
        {"trace": {"resourceSpans": [rs for m in ms for rs in _generic(m)["resourceSpans"]]}}),
    "Jaeger v3 API: a stream of {result}": lambda ms: _lines([{"result": _generic(m)} for m in ms]),
    "a JSON array of OTLP JSON messages, on one line": lambda ms: json.dumps(
        [json.loads(message_to_otlp_json(m)) for m in ms]).encode(),
    "OTLP before 0.15, pretty": lambda ms: b"".join(_pretty(_pre_015(m)) for m in ms),
    "OTLP before 0.15, a line per message": lambda ms: _lines([_pre_015(m) for m in ms]),
    "length-prefixed messages, each pretty-printed": lambda ms: b"".join(
        len(body).to_bytes(4, "big") + body for body in (json_format.MessageToJson(m).encode() for m in ms)),
}


def _spans(store: Path) -> pa.Table:
    with Store.open(store) as s:
        return s.sql("SELECT * FROM spans ORDER BY trace_id, span_id").to_arrow_table()


@pytest.fixture(scope="module")
def otlp_spans(messages: list[TracesData], tmp_path_factory: pytest.TempPathFactory) -> pa.Table:
    root = tmp_path_factory.mktemp("otlp")
    path = root / "otlp.jsonl"
    path.write_text("".join(message_to_otlp_json(m) + "\n" for m in messages))
    summary = ingest_paths(root / "store", [path])
    assert summary.skipped == 0
    return _spans(root / "store")


@pytest.mark.parametrize("form", FORMS)
def test_each_form_ingests_the_same_spans_as_otlp_json_lines(messages: list[TracesData], otlp_spans: pa.Table,
                                                            tmp_path: Path, form: str) -> None:
    text = FORMS[form](messages)
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(text))
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.skipped == 0, summary.reasons
    if not form.startswith("length-prefixed"):  # as many lines read as the file has
        assert summary.lines == text.count(b"\n") + (not text.endswith(b"\n"))
    assert otlp_spans.num_rows > 100
    assert set(otlp_spans.column("kind").to_pylist()) >= {1, 3} and 2 in otlp_spans.column("status_code").to_pylist()
    assert _spans(tmp_path / "store").equals(otlp_spans)


def test_a_value_that_is_not_json_in_a_pretty_file_is_rejected_at_its_first_line_and_the_others_are_kept(
        messages: list[TracesData], tmp_path: Path) -> None:
    first, second, third = (json_format.MessageToJson(m) + "\n" for m in messages[:3])
    broken = second.replace('"spanId"', '"spanId" "', 1)
    path = tmp_path / "three.json"
    path.write_text(first + broken + third)
    summary = ingest_paths(tmp_path / "store", [path])
    wanted = sum(len(ss.spans) for m in (messages[0], messages[2]) for rs in m.resource_spans for ss in rs.scope_spans)
    assert summary.spans_read == wanted and summary.rejected_lines == 1 and summary.rejected_spans == 0
    assert summary.lines == (first + broken + third).count("\n")
    [kept] = [json.loads(x) for q in summary.quarantine for x in q.read_text().splitlines()]
    assert (kept["line"], kept["record"]) == (first.count("\n") + 1, "{")
    assert kept["reason"].startswith("not JSON")


def test_a_json_lines_file_whose_first_line_is_not_json_is_read_line_by_line(messages: list[TracesData],
                                                                             tmp_path: Path) -> None:
    lines = [message_to_otlp_json(m) for m in messages[:3]]
    for junk in ("[", "{garbage", "[1, 2", '{"unterminated'):  # a start of JSON, or not even that
        path = tmp_path / "junk.jsonl"
        path.write_text("\n".join([junk, *lines]) + "\n")
        summary = ingest_paths(tmp_path / f"store-{len(junk)}", [path])
        assert summary.rejected_lines == 1 and summary.lines == 4, (junk, summary.reasons)
        assert summary.spans_read == sum(len(ss.spans) for m in messages[:3] for rs in m.resource_spans
                                         for ss in rs.scope_spans)


def test_a_rejected_span_of_a_pretty_file_is_kept_with_the_line_its_value_starts_on(
        messages: list[TracesData], tmp_path: Path) -> None:
    values = [_generic(m) for m in messages[:3]]
    values[2]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "not an id"
    text = "".join(json.dumps(v, indent=1) + "\n" for v in values)
    path = tmp_path / "three.json"
    path.write_text(text)
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.rejected_spans == 1 and summary.rejected_lines == 0
    starts = [n + 1 for n, line in enumerate(text.splitlines()) if line == "{"]
    [kept] = [json.loads(x) for q in (tmp_path / "store" / "quarantine").iterdir() for x in q.read_text().splitlines()]
    assert kept["line"] == starts[2]
    assert "'not an id' is neither 32 hex digits nor base64 of 16 bytes" in kept["reason"]


def test_json_that_is_not_a_trace_is_named_by_its_keys_in_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"scenario": "x", "culprit": "router-0"}, indent=2))
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.rejected_lines == 1 and summary.spans_read == 0
    assert list(summary.reasons) == ["not a TracesData: no resourceSpans (an object of scenario, culprit: not a trace "
                                     "export)"], summary.reasons


def test_a_jaeger_span_that_cannot_be_converted_is_rejected_alone_and_kept_as_it_was(tmp_path: Path) -> None:
    orphan = {"traceID": "1f2e3d4c5b6a7988", "spanID": "c3", "operationName": "x", "processID": "p9",
              "startTime": 1767225600000000, "duration": 1}
    undated = {**orphan, "spanID": "d4", "processID": "p1", "startTime": "yesterday"}
    trace = {**JAEGER_TRACE, "spans": [*JAEGER_TRACE["spans"], orphan, undated]}
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps({"data": [trace]}, indent=2))
    summary = ingest_paths(tmp_path / "store", [path])
    assert (summary.spans_read, summary.rejected_spans, summary.rejected_lines) == (2, 2, 0)
    assert set(summary.reasons) == {"a Jaeger span names process 'p9', which the trace does not have",
                                    "Jaeger startTime 'yesterday' is not a number of microseconds"}
    kept = [json.loads(x) for q in (tmp_path / "store" / "quarantine").iterdir() for x in q.read_text().splitlines()]
    assert sorted(json.loads(k["record"])["spanID"] for k in kept) == ["c3", "d4"]


def test_base64_ids_are_never_taken_for_hex_nor_hex_for_base64() -> None:
    assert base64_id("W47/95gDgQPSabYzgT/GDA==", 16) == "5b8efff798038103d269b633813fc60c"
    assert base64_id("W47_95gDgQPSabYzgT_GDA", 16) == "5b8efff798038103d269b633813fc60c"  # URL-safe, unpadded
    assert base64_id("7uGbfsPBsXQ=", 8) == "eee19b7ec3c1b174"
    assert base64_id("5b8efff798038103d269b633813fc60c", 16) is None  # valid base64, but of 24 bytes
    assert base64_id("eee19b7ec3c1b174", 8) is None
    assert base64_id("7uGbfsPBsXQ=", 16) is None


def test_a_trace_piped_to_ingest_dash_is_read_from_standard_input(messages: list[TracesData], otlp_spans: pa.Table,
                                                                  tmp_path: Path) -> None:
    """As `curl -s $TEMPO/api/v2/traces/<id> | infertrace ingest --store DIR -` does it: a gzip'd pretty document
    (told by its first bytes, as a file is), then a line that is not a trace, named `<stdin>` in the quarantine."""
    def ingest(data: bytes, *dash: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "infertrace", "ingest", "--store", str(tmp_path / "store"),
                               "--no-materialize", "--no-progress", *dash], input=data, capture_output=True,
                              timeout=300)

    piped = ingest(gzip.compress(FORMS["Tempo v2 API: {trace}, with a byte-order mark"](messages)), "-")
    assert piped.returncode == 0, piped.stderr
    assert _spans(tmp_path / "store").equals(otlp_spans)
    again = ingest(b'{"status": "not found"}\n', "-")
    assert again.returncode == 1 and b"Skipped 1 lines" in again.stderr, again.stderr  # nothing stored: a failure
    [kept] = [json.loads(x) for q in (tmp_path / "store" / "quarantine").iterdir() for x in q.read_text().splitlines()]
    assert (kept["source"], kept["line"]) == ("<stdin>", 1)
    twice = ingest(b"", "-", "-")
    assert twice.returncode == 2 and b"standard input" in twice.stderr


JAEGER_TRACE = {  # as Jaeger's query API returns a trace (ids with leading zeros dropped, times in µs)
    "traceID": "1f2e3d4c5b6a7988",
    "spans": [
        {"traceID": "1f2e3d4c5b6a7988", "spanID": "a1", "operationName": "POST /v1/chat/completions",
         "references": [], "startTime": 1767225600000000, "duration": 2500000,
         "tags": [{"key": "span.kind", "type": "string", "value": "server"},
                  {"key": "http.route", "type": "string", "value": "/v1/chat/completions"},
                  {"key": "http.response.status_code", "type": "int64", "value": 429},
                  {"key": "error", "type": "bool", "value": True},
                  {"key": "otel.status_description", "type": "string", "value": "rate limited"},
                  {"key": "otel.scope.name", "type": "string", "value": "gateway"}],
         "logs": [{"timestamp": 1767225600100000, "fields": [{"key": "event", "type": "string", "value": "retry"},
                                                            {"key": "attempt", "type": "int64", "value": 2}]}],
         "processID": "p1", "warnings": None},
        {"traceID": "1f2e3d4c5b6a7988", "spanID": "b2", "operationName": "llm_request",
         "references": [{"refType": "FOLLOWS_FROM", "traceID": "ff", "spanID": "ff"},
                        {"refType": "CHILD_OF", "traceID": "1f2e3d4c5b6a7988", "spanID": "a1"}],
         "startTime": 1767225600200000, "duration": 2000000,
         "tags": [{"key": "gen_ai.request.model", "type": "string", "value": "llama-3-8b"},
                  {"key": "gen_ai.usage.input_tokens", "type": "int64", "value": 512},
                  {"key": "blob", "type": "binary", "value": "AAAwOQ=="}],
         "logs": [], "processID": "p2", "warnings": None}],
    "processes": {"p1": {"serviceName": "gateway", "tags": []},
                  "p2": {"serviceName": "vllm", "tags": [{"key": "host.name", "type": "string", "value": "gpu-7"}]}},
    "warnings": None}


@pytest.mark.parametrize("document", [{"data": [JAEGER_TRACE], "total": 0, "limit": 0, "offset": 0, "errors": None},
                                      JAEGER_TRACE], ids=["query API /api/traces", "UI download of one trace"])
def test_jaeger_json_ingests_as_the_collectors_jaeger_translator_converts_it(document: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps(document, indent=2))
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.skipped == 0 and summary.spans_read == 2, summary.reasons
    with Store.open(tmp_path / "store") as store:
        entry, engine = store.sql("SELECT * FROM spans ORDER BY span_id").to_arrow_table().to_pylist()
    trace = "0000000000000000" + "1f2e3d4c5b6a7988"  # left-padded to 32 hex digits
    assert (entry["trace_id"], entry["span_id"], entry["parent_span_id"]) == (trace, "00000000000000a1", None)
    assert (entry["kind"], entry["start_ns"], entry["end_ns"]) == (2, 1767225600 * 10**9, 1767225602500 * 10**6)
    assert (entry["status_code"], entry["status_message"], entry["scope_name"]) == (2, "rate limited", "gateway")
    assert (entry["attr.http.response.status_code"], entry["res.service.name"]) == (429, "gateway")
    [event] = entry["events"]
    assert (event["name"], event["time_ns"], json.loads(event["attributes"])) == (
        "retry", 1767225600100 * 10**6, {"attempt": 2})
    assert (engine["parent_span_id"], engine["kind"], engine["status_code"]) == ("00000000000000a1", 0, 0)
    assert json.loads(engine["links"]) == [{"traceId": "0" * 30 + "ff", "spanId": "0" * 14 + "ff"}]
    assert (engine["attr.gen_ai.request.model"], engine["attr.gen_ai.usage.input_tokens"]) == ("llama-3-8b", 512)
    assert (engine["res.service.name"], engine["res.host.name"]) == ("vllm", "gpu-7")
    assert dict(engine["span_attributes"]) == {"blob": '{"bytesValue":"AAAwOQ=="}'}


def test_jaeger_spans_one_a_line_with_their_process_ingest_as_the_trace_does(tmp_path: Path) -> None:
    """Jaeger's storage backends (Elasticsearch, Kafka) hold one span a document, its process inside it."""
    processes = JAEGER_TRACE["processes"]
    lines = [{k: v for k, v in span.items() if k != "processID"} | {"process": processes[span["processID"]]}
             for span in JAEGER_TRACE["spans"]]
    (tmp_path / "trace.json").write_text(json.dumps(JAEGER_TRACE))
    (tmp_path / "spans.jsonl").write_text("".join(json.dumps(span) + "\n" for span in lines))
    for name in ("trace.json", "spans.jsonl"):
        summary = ingest_paths(tmp_path / name.split(".")[0], [tmp_path / name])
        assert summary.skipped == 0 and summary.spans_read == 2, summary.reasons
    with Store.open(tmp_path / "trace") as whole, Store.open(tmp_path / "spans") as one_a_line:
        query = "SELECT * FROM spans ORDER BY span_id"
        assert one_a_line.sql(query).to_arrow_table().equals(whole.sql(query).to_arrow_table())


@pytest.mark.parametrize(("tags", "status", "attributes"), [
    ([("error", "bool", True), ("otel.status_description", "string", "boom")], {"code": 2, "message": "boom"}, []),
    ([("error", "bool", False)], {"code": 0}, ["error"]),
    ([("otel.status_code", "string", "OK")], {"code": 1}, []),
    ([("error", "bool", True), ("otel.status_code", "string", "OK")], {"code": 2}, []),
    ([("span.kind", "string", "server"), ("http.status_code", "int64", 503)], {"code": 2}, ["http.status_code"]),
    ([("span.kind", "string", "server"), ("http.status_code", "int64", 404)], {"code": 0}, ["http.status_code"]),
    ([("span.kind", "string", "client"), ("http.status_code", "int64", 404), ("http.status_message", "string", "nf")],
     {"code": 2, "message": "nf"}, ["http.status_code", "http.status_message"]),
    ([("http.status_code", "string", "404")], {"code": 2}, ["http.status_code"]),  # no kind: any code outside 1xx–3xx
    ([("span.kind", "string", "server"), ("http.status_code", "int64", 302)], {"code": 0}, ["http.status_code"]),
])
def test_a_jaeger_spans_status_is_read_as_the_collectors_translator_reads_it(
        tags: list[tuple[str, str, Any]], status: dict[str, Any], attributes: list[str]) -> None:
    trace = {"traceID": "1", "processes": {"p": {"serviceName": "s"}}, "spans": [
        {"traceID": "1", "spanID": "2", "operationName": "x", "startTime": 1767225600000000, "duration": 1,
         "processID": "p", "tags": [{"key": k, "type": t, "value": v} for k, t, v in tags]}]}
    [rs] = jaeger_json.resource_spans([trace])
    [span] = rs["scopeSpans"][0]["spans"]
    assert span["status"] == status
    assert [a["key"] for a in span["attributes"]] == attributes


def test_a_jaeger_reference_to_the_parent_is_not_also_a_link_and_follows_from_is_the_parent_without_child_of() -> None:
    def converted(references: list[tuple[str, str, str]]) -> dict[str, Any]:
        trace = {"traceID": "1", "processes": {"p": {"serviceName": "s"}}, "spans": [
            {"traceID": "1", "spanID": "9", "operationName": "x", "startTime": 1767225600000000, "duration": 1,
             "processID": "p", "references": [{"refType": r, "traceID": t, "spanID": s} for r, t, s in references]}]}
        [rs] = jaeger_json.resource_spans([trace])
        return rs["scopeSpans"][0]["spans"][0]

    both = converted([("FOLLOWS_FROM", "1", "a"), ("CHILD_OF", "1", "a")])
    assert both["parentSpanId"] == "000000000000000a" and "links" not in both
    follows = converted([("FOLLOWS_FROM", "2", "b"), ("FOLLOWS_FROM", "1", "c")])
    assert follows["parentSpanId"] == "000000000000000c"
    assert follows["links"] == [{"traceId": "0" * 31 + "2", "spanId": "0" * 15 + "b"}]


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3), max_leaves=8)


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("logs", True, "a Jaeger logs is not a list"),
    ("tags", 7, "a Jaeger tags is not a list"),
    ("startTime", float("inf"), "is not a number of microseconds"),
    ("duration", -5, "negative number of microseconds"),
])
def test_a_jaeger_field_of_the_wrong_json_type_rejects_that_span_alone(field: str, value: Any, reason: str) -> None:
    """What the fuzz test below found (a TypeError through the whole ingest before)."""
    span = {"traceID": "1", "spanID": "2", "processID": "p", "operationName": "x", "startTime": 1767225600000000}
    converted = jaeger_json.resource_spans([{"traceID": "1", "spans": [{**span, field: value}, span],
                                             "processes": {"p": {"serviceName": "s"}}}])
    [bad] = [s for rs in converted for ss in rs["scopeSpans"] for s in ss["spans"] if isinstance(s, Unconverted)]
    assert reason in bad.reason


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(spans=st.lists(st.fixed_dictionaries(
    {"traceID": st.just("1"), "spanID": st.just("2"), "processID": st.just("p"), "startTime": _JSON | st.integers()},
    optional={k: _JSON for k in ("operationName", "references", "duration", "tags", "logs", "flags")}),
    min_size=1, max_size=3))
def test_any_json_in_a_jaeger_spans_fields_is_converted_or_rejected_alone_never_raised(spans: list[Any]) -> None:
    converted = jaeger_json.resource_spans([{"traceID": "1", "spans": spans, "processes": {"p": {"serviceName": "s"}}}])
    kept = [s for rs in converted for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(kept) == len(spans)
    assert all(isinstance(s, Unconverted) or s["traceId"] == "0" * 31 + "1" for s in kept)
