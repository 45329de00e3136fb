"""Zipkin's v2 JSON ingests as the OpenTelemetry Collector's Zipkin receiver converts it, keeping what the
receiver loses (an `error` tag's message, replicas of one service apart), and a span that cannot be converted is
rejected alone; `infertrace collect` takes it on Zipkin's own route, from OpenTelemetry's Zipkin exporter."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.zipkin.json import ZipkinExporter
from opentelemetry.exporter.zipkin.json.v2 import JsonV2Encoder
from opentelemetry.exporter.zipkin.node_endpoint import NodeEndpoint
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from infertrace.analyzers.rca import analyze_incidents, describe
from infertrace.otlp_json import message_to_otlp_json, parse_traces_data
from infertrace.store import zipkin_json
from infertrace.store.clickhouse.store import ClickHouseStore
from infertrace.store.collector import Collector
from infertrace.store.http_server import ZIPKIN_PATH
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from infertrace.store.values import Unconverted
from tests.clickhouse_stores import clickhouse_relation_rows, exported

T0_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds

# One request through a gateway (Envoy-style SERVER span, then a CLIENT span to the engine) and the engine's own
# span, as Zipkin's /api/v2/trace/{id} returns them: a 64-bit trace id, the client span's parent its own id (the
# B3 "shared" style some proxies write), an event written by OpenTelemetry's Zipkin exporter, a link.
TRACE = [
    {"traceId": "1f2e3d4c5b6a7988", "id": "00000000000000a1", "name": "post /v1/chat/completions", "kind": "SERVER",
     "timestamp": T0_US, "duration": 2_500_000,
     "localEndpoint": {"serviceName": "router", "ipv4": "10.0.0.5", "port": 8080},
     "remoteEndpoint": {"ipv4": "192.168.1.9", "port": 51234},
     "annotations": [{"timestamp": T0_US + 100_000, "value": "retry|{\"attempt\":2,\"backoff\":0.5}|0"}],
     "tags": {"http.status_code": "429", "error": "rate limited", "service.instance.id": "router-0",
              "otel.library.name": "envoy", "otel.library.version": "1.31"}},
    {"traceId": "1f2e3d4c5b6a7988", "parentId": "00000000000000a1", "id": "00000000000000b2",
     "name": "llm_request", "kind": "CLIENT", "timestamp": T0_US + 200_000, "duration": 2_000_000,
     "localEndpoint": {"serviceName": "router"}, "remoteEndpoint": {"serviceName": "vllm", "ipv6": "fd00::7"},
     "annotations": [{"timestamp": T0_US + 300_000, "value": "first byte"}],
     "tags": {"service.instance.id": "router-1", "gen_ai.request.model": "llama-3-8b",
              "otlp.link.0": "00000000000000000000000000000abc|0000000000000def|k=v|{\"why\":\"retry\"}|0"}},
    {"traceId": "1f2e3d4c5b6a7988", "parentId": "00000000000000b2", "id": "00000000000000c3", "name": "step",
     "timestamp": T0_US + 250_000, "duration": 30_000, "localEndpoint": {"serviceName": "vllm"},
     "tags": {"span.kind": "internal", "otel.status_code": "ERROR", "otel.status_description": "oom"}},
]


@pytest.mark.parametrize("document", [TRACE, [TRACE[:1], TRACE[1:]]],
                         ids=["/api/v2/trace/{id}: a list of spans", "/api/v2/traces: a list of traces"])
@pytest.mark.parametrize("pretty", [False, True], ids=["one line", "pretty"])
def test_zipkin_spans_ingest_as_the_collectors_zipkin_receiver_converts_them(document: list[Any], pretty: bool,
                                                                            tmp_path: Path) -> None:
    path = tmp_path / "zipkin.json"
    path.write_text(json.dumps(document, indent=2 if pretty else None))
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.skipped == 0 and summary.rejected_spans == 0 and summary.spans_read == 3, summary.reasons
    with Store.open(tmp_path / "store") as store:
        gateway, client, step = store.sql("SELECT * FROM spans ORDER BY span_id").to_arrow_table().to_pylist()
    trace = "0000000000000000" + "1f2e3d4c5b6a7988"  # a 64-bit id, left-padded to 32 hex digits
    assert (gateway["trace_id"], gateway["span_id"], gateway["parent_span_id"]) == (trace, "00000000000000a1", None)
    assert (gateway["kind"], gateway["start_ns"], gateway["end_ns"]) == (2, T0_US * 1000, (T0_US + 2_500_000) * 1000)
    # Any `error` tag fails a Zipkin span, its value the message (the receiver counts only error=true)
    assert (gateway["status_code"], gateway["status_message"]) == (2, "rate limited")
    assert (gateway["scope_name"], gateway["scope_version"]) == ("envoy", "1.31")
    assert (gateway["res.service.name"], gateway["res.service.instance.id"]) == ("router", "router-0")
    # tags are strings (the receiver's default, parse_string_tags off); the endpoints' addresses and ports
    assert dict(gateway["span_attributes"]) == {"http.status_code": "429", "net.host.ip": "10.0.0.5",
                                                "net.host.port": "8080", "net.peer.ip": "192.168.1.9",
                                                "net.peer.port": "51234"}
    [event] = gateway["events"]
    assert (event["name"], event["time_ns"], json.loads(event["attributes"])) == (
        "retry", (T0_US + 100_000) * 1000, {"attempt": 2, "backoff": 0.5})

    assert (client["parent_span_id"], client["kind"], client["status_code"]) == ("00000000000000a1", 3, 0)
    # another replica of the same service is another resource (the receiver would give it router-0's)
    assert (client["res.service.name"], client["res.service.instance.id"]) == ("router", "router-1")
    assert (client["attr.gen_ai.request.model"], client["attr.peer.service"]) == ("llama-3-8b", "vllm")
    assert dict(client["span_attributes"]) == {"net.peer.ip": "fd00::7"}
    assert json.loads(client["links"]) == [{"traceId": "0" * 29 + "abc", "spanId": "0" * 13 + "def",
                                            "traceState": "k=v",
                                            "attributes": [{"key": "why", "value": {"stringValue": "retry"}}]}]
    [first_byte] = client["events"]
    assert (first_byte["name"], first_byte["time_ns"]) == ("first byte", (T0_US + 300_000) * 1000)

    assert (step["kind"], step["status_code"], step["status_message"]) == (1, 2, "oom")
    assert step["res.service.name"] == "vllm" and step["parent_span_id"] == "00000000000000b2"


@pytest.mark.parametrize(("tags", "status"), [
    ({"error": ""}, {"code": 2}),
    ({"error": "true"}, {"code": 2}),
    ({"error": "boom", "otel.status_description": "out of memory"}, {"code": 2, "message": "out of memory"}),
    ({"otel.status_code": "STATUS_CODE_OK"}, {"code": 1}),
    ({"otel.status_code": "OK"}, {"code": 1}),
    ({"http.status_code": "503"}, {"code": 0}),  # Zipkin has no status but the error tag
])
def test_a_zipkin_spans_status_comes_from_its_error_tag_else_otel_status_code(tags: dict[str, str],
                                                                              status: dict[str, Any]) -> None:
    span = {"traceId": "1", "id": "2", "name": "x", "timestamp": T0_US, "duration": 1, "tags": tags}
    [rs] = zipkin_json.resource_spans([span])
    [converted] = rs["scopeSpans"][0]["spans"]
    assert converted["status"] == status
    assert not {a["key"] for a in converted["attributes"]} & {"error", "otel.status_code", "otel.status_description"}


def test_a_zipkin_span_that_cannot_be_converted_is_rejected_alone_with_its_reason(tmp_path: Path) -> None:
    undated = {"traceId": "1", "id": "3", "name": "late fragment", "duration": 5}
    v1 = {"traceId": "1", "id": "4", "name": "v1", "timestamp": T0_US,
          "annotations": [{"timestamp": T0_US, "value": "cs", "endpoint": {"serviceName": "old"}}]}
    path = tmp_path / "zipkin.json"
    path.write_text(json.dumps([TRACE[0], undated, v1, TRACE[2]]))
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.spans_read == 2 and summary.rejected_spans == 2 and summary.rejected_lines == 0
    assert any("without a timestamp" in r for r in summary.reasons), summary.reasons
    assert any("Zipkin v1 JSON" in r for r in summary.reasons), summary.reasons
    kept = [json.loads(x) for q in (tmp_path / "store" / "quarantine").iterdir() for x in q.read_text().splitlines()]
    assert sorted(json.loads(k["record"])["id"] for k in kept) == ["3", "4"]  # the original Zipkin spans


def test_spans_sent_by_opentelemetrys_zipkin_exporter_are_stored_by_collect(collector: Collector) -> None:
    """The SDK's Zipkin JSON exporter POSTs to /api/v2/spans, as an application or proxy sending Zipkin would: 202,
    the spans stored with their service, kind, parent, status (an error's description) and events."""
    exporter = ZipkinExporter(endpoint=f"http://{collector.address}{ZIPKIN_PATH}")
    provider = TracerProvider(resource=Resource.create({"service.name": "router",
                                                        "service.instance.id": "router-3"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("gateway", "2.1")
    with tracer.start_as_current_span("route", kind=SpanKind.SERVER) as route:
        route.set_attribute("http.route", "/v1/chat/completions")
        with tracer.start_as_current_span("call engine", kind=SpanKind.CLIENT) as call:
            call.add_event("retry", {"attempt": 2})
            call.set_status(StatusCode.ERROR, "upstream reset")
    provider.shutdown()
    with Store.open(collector.root) as store:
        call_row, route_row = store.sql("SELECT * FROM spans ORDER BY name").to_arrow_table().to_pylist()
    context = route.get_span_context()
    assert (route_row["trace_id"], route_row["span_id"]) == (f"{context.trace_id:032x}", f"{context.span_id:016x}")
    assert (route_row["kind"], route_row["res.service.name"], route_row["res.service.instance.id"]) == (
        2, "router", "router-3")
    assert (route_row["scope_name"], route_row["scope_version"]) == ("gateway", "2.1")
    assert route_row["start_ns"] == (route.start_time + 500) // 1000 * 1000  # microseconds, rounded
    assert (call_row["kind"], call_row["parent_span_id"]) == (3, f"{context.span_id:016x}")
    assert (call_row["status_code"], call_row["status_message"]) == (2, "upstream reset")
    [event] = call_row["events"]
    assert (event["name"], json.loads(event["attributes"])) == ("retry", {"attempt": 2})


def test_zipkin_bodies_that_are_not_spans_get_a_reason_as_text(collector: Collector) -> None:
    url = f"http://{collector.address}{ZIPKIN_PATH}"
    for data, status, words in [
        (b"{not json", 400, "not JSON"),
        (b'{"resourceSpans": []}', 400, "not a JSON list of Zipkin spans"),
        (b"[1, 2]", 400, "not Zipkin v2 spans"),
        (b"[]", 202, ""),
    ]:
        r = requests.post(url, data=data, headers={"Content-Type": "application/json"})
        assert (r.status_code, r.text) == (status, r.text) and words in r.text, data
    r = requests.post(url, data=b"\x0a", headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 415 and "application/json" in r.text
    undated = [{**TRACE[0], "id": "00000000000000d4"}, {"traceId": "1", "id": "5", "name": "late"}]
    r = requests.post(url, data=gzip.compress(json.dumps(undated).encode()),
                      headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 202 and r.content == b""
    [kept] = [json.loads(x) for q in (collector.root / "quarantine").iterdir() for x in q.read_text().splitlines()]
    assert "without a timestamp" in kept["reason"]
    with Store.open(collector.root) as store:
        assert store.sql("SELECT span_id FROM spans").fetchall() == [("00000000000000d4",)]


GATEWAY = ("gateway", "auth", "rate-limiter", "router")  # the sample fleet's gateway services


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return [_value(v) for v in value.array_value.values] if which == "array_value" else getattr(value, which or "",
                                                                                                None)


def _attributes(pairs: list[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _as_zipkin(rs: ResourceSpans) -> list[dict[str, Any]]:
    """One resource's spans as OpenTelemetry's Zipkin exporter sends them (its own encoder, from SDK spans)."""
    resource = Resource(_attributes(rs.resource.attributes))
    spans = []
    for ss in rs.scope_spans:
        scope = InstrumentationScope(ss.scope.name, ss.scope.version or None)
        for s in ss.spans:
            context = SpanContext(int.from_bytes(s.trace_id, "big"), int.from_bytes(s.span_id, "big"), False,
                                  TraceFlags(1))
            parent = SpanContext(context.trace_id, int.from_bytes(s.parent_span_id, "big"), False) \
                if s.parent_span_id else None
            spans.append(ReadableSpan(
                s.name, context, parent, resource, _attributes(s.attributes),
                [Event(e.name, _attributes(e.attributes), e.time_unix_nano) for e in s.events],
                kind=SpanKind(max(s.kind - 1, 0)),
                status=Status([StatusCode.UNSET, StatusCode.OK, StatusCode.ERROR][s.status.code],
                              s.status.message or None),
                start_time=s.start_time_unix_nano, end_time=s.end_time_unix_nano, instrumentation_scope=scope))
    endpoint = NodeEndpoint()
    endpoint.service_name = resource.attributes["service.name"]
    return json.loads(JsonV2Encoder().serialize(spans, endpoint))


SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "rate_limiter_flapping"


def _sample_with_a_zipkin_gateway(out: Path) -> list[Path]:
    """The sample incident with its gateway's spans as OpenTelemetry's Zipkin exporter sends them (the HTTP status
    renamed `http.status_code`, as the conventions before 1.21 and Envoy name it) and its engines' as OTLP."""
    zipkin: list[dict[str, Any]] = []
    engines = []
    for line in gzip.decompress((SAMPLE / "traces.jsonl.gz").read_bytes()).decode().splitlines():
        data = parse_traces_data(line)
        kept = []
        for rs in data.resource_spans:
            service = _attributes(rs.resource.attributes)["service.name"]
            if service in GATEWAY:
                for span in (s for ss in rs.scope_spans for s in ss.spans):
                    for kv in span.attributes:
                        if kv.key == "http.response.status_code":
                            kv.key = "http.status_code"
                zipkin += _as_zipkin(rs)
            else:
                kept.append(rs)
        if kept:
            del data.resource_spans[:]
            data.resource_spans.extend(kept)
            engines.append(message_to_otlp_json(data))
    assert {span["localEndpoint"]["serviceName"] for span in zipkin} == set(GATEWAY)
    (out / "gateway.json").write_text(json.dumps(zipkin))
    (out / "engines.jsonl").write_text("\n".join(engines) + "\n")
    return [out / "gateway.json", out / "engines.jsonl"]


def test_a_gateway_traced_in_zipkin_gives_root_cause_analysis_what_its_otlp_spans_give(tmp_path: Path) -> None:
    """A sample incident (the rate limiter flapping) with its gateway in Zipkin (every attribute a string tag,
    resource attributes among the tags, microseconds, two router replicas of one service, `http.status_code`)
    and its engines in OTLP: the same ranking, each candidate of the same kind, and the limiter's 429s, as from
    OTLP."""
    rankings, rejected = [], []
    for name, paths in (("otlp", [SAMPLE / "traces.jsonl.gz"]), ("zipkin", _sample_with_a_zipkin_gateway(tmp_path))):
        summary = ingest_paths(tmp_path / name, paths)
        assert summary.skipped == 0 and summary.spans_read == 5556, summary.reasons
        with Store.open(tmp_path / name) as store:
            rankings.append(re.findall(r"#\d+ (.+?) \((\w+)", "\n".join(describe(analyze_incidents(store)))))
            rejected.append(store.sql("SELECT count(*) FROM component_calls WHERE outcome = 'rejected' "
                                      "AND http_status = 429").fetchall())
    truth = json.loads((SAMPLE / "ground_truth.json").read_text())["root_cause"]
    assert rankings[0][0] == (truth["instances"][0], truth["kind"]) == ("ratelimit-0", "rate_limiter")
    assert rankings[1] == rankings[0]
    assert rejected[1] == rejected[0] and rejected[0][0][0] > 40


@pytest.mark.slow
def test_clickhouses_component_calls_read_the_older_http_status_as_duckdbs_do(tmp_path: Path) -> None:
    summary = ingest_paths(tmp_path / "store", _sample_with_a_zipkin_gateway(tmp_path))
    assert summary.skipped == 0
    with Store.open(tmp_path / "store") as local, ClickHouseStore.open(exported(str(tmp_path / "store"),
                                                                                "zipkin_gateway")) as clickhouse:
        expected = local.sql("SELECT * FROM component_calls ORDER BY ALL").to_arrow_table()
        assert expected.column("http_status").null_count < expected.num_rows
        assert clickhouse_relation_rows(clickhouse, "component_calls", expected).equals(expected)


@pytest.mark.parametrize("marked", [True, False], ids=["marked shared", "told by the client span's id"])
def test_the_server_side_of_a_shared_span_keeps_its_own_row_below_the_client_side(marked: bool,
                                                                                  tmp_path: Path) -> None:
    """B3's shared span context (Envoy's default): the caller's CLIENT span and the callee's SERVER span carry one
    id. The SERVER side gets an id of its own under the CLIENT side, and the callee's own calls hang below it;
    the same id on every ingest, so ingesting again adds nothing."""
    shared = "1111111111111111"
    spans = [
        {"traceId": "a" * 32, "id": shared, "parentId": "0" * 15 + "9", "name": "get /v1/chat", "kind": "CLIENT",
         "timestamp": T0_US, "duration": 1000, "localEndpoint": {"serviceName": "front-proxy"}},
        {"traceId": "a" * 32, "id": shared, "parentId": "0" * 15 + "9", "name": "get /v1/chat", "kind": "SERVER",
         "timestamp": T0_US + 100, "duration": 800, "localEndpoint": {"serviceName": "router"},
         **({"shared": True} if marked else {})},
        {"traceId": "a" * 32, "parentId": shared, "id": "2" * 16, "name": "engine call", "kind": "CLIENT",
         "timestamp": T0_US + 200, "duration": 500, "localEndpoint": {"serviceName": "router"}},
    ]
    path = tmp_path / "zipkin.json"
    path.write_text(json.dumps(spans))
    summary = ingest_paths(tmp_path / "store", [path])
    assert (summary.spans_read, summary.spans_new) == (3, 3)
    with Store.open(tmp_path / "store") as store:
        by_id = {span_id: (parent, service, kind) for span_id, parent, service, kind in store.sql(
            'SELECT span_id, parent_span_id, "res.service.name", kind FROM spans').fetchall()}
    assert len(by_id) == 3 and by_id[shared] == ("0" * 15 + "9", "front-proxy", 3)
    [server] = [i for i, (_, service, kind) in by_id.items() if service == "router" and kind == 2]
    assert server != shared and by_id[server][0] == shared  # its own id, below the client side
    assert by_id["2" * 16][0] == server  # the callee's own call hangs below its server side
    assert ingest_paths(tmp_path / "store", [path]).spans_new == 0


def test_zipkin_spans_one_a_line_ingest_as_the_list_of_them_does(tmp_path: Path) -> None:
    """Zipkin's storage backends export spans one JSON object a line (NDJSON)."""
    (tmp_path / "list.json").write_text(json.dumps(TRACE))
    (tmp_path / "lines.jsonl").write_text("".join(json.dumps(span) + "\n" for span in TRACE))
    for name in ("list.json", "lines.jsonl"):
        summary = ingest_paths(tmp_path / name.split(".")[0], [tmp_path / name])
        assert summary.skipped == 0 and summary.spans_read == 3, summary.reasons
    with Store.open(tmp_path / "list") as listed, Store.open(tmp_path / "lines") as lines:
        query = "SELECT * FROM spans ORDER BY span_id"
        assert lines.sql(query).to_arrow_table().equals(listed.sql(query).to_arrow_table())


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                     | st.text(max_size=20), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
_FIELDS = ("traceId", "id", "parentId", "name", "kind", "timestamp", "duration", "localEndpoint", "remoteEndpoint",
           "annotations", "tags", "shared", "debug")


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("annotations", 1.0, "annotations is not a list"),
    ("timestamp", float("inf"), "is not a number of microseconds"),
    ("tags", ["a"], "tags is not an object"),
    ("timestamp", -1, "negative number of microseconds"),
    ("duration", -5, "negative number of microseconds"),
])
def test_a_zipkin_field_of_the_wrong_json_type_rejects_that_span_alone(field: str, value: Any, reason: str) -> None:
    """What the fuzz test below found (each raised through ingest, or made a span end before 1970)."""
    [bad] = [s for rs in zipkin_json.resource_spans([{**TRACE[2], field: value}, TRACE[0]])
             for ss in rs["scopeSpans"] for s in ss["spans"] if isinstance(s, Unconverted)]
    assert reason in bad.reason


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans=st.lists(st.fixed_dictionaries({"traceId": st.just("1"), "id": st.just("2")},
                                            optional={k: _JSON for k in _FIELDS[2:]}), min_size=1, max_size=4))
def test_any_json_in_a_zipkin_spans_fields_is_converted_or_rejected_alone_never_raised(spans: list[Any]) -> None:
    converted = zipkin_json.resource_spans(spans)
    kept = [s for rs in converted for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(kept) == len(spans)
    assert all(isinstance(s, Unconverted) or int(s["endTimeUnixNano"]) >= 0 for s in kept)
