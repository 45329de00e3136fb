"""`infertrace collect` over real HTTP on 127.0.0.1: the SDK's OTLP exporter, protobuf and JSON bodies, gzip,
and every refusal the receiver makes."""

from __future__ import annotations

import base64
import gzip
import json
import logging
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests
from google.protobuf import json_format
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import Compression as GrpcCompression
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import SpanKind

from infertrace.otlp_json import message_to_otlp_json
from infertrace.store.collector import Collector
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.engine.config import EngineConfig
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter, SdkExporterSink
from reference_engine.workload import SyntheticWorkload, synthetic_requests

T0 = 1_767_225_600_000_000_000


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(tmp_path / "store", "127.0.0.1", 0, max_body_bytes=256 * 1024, queue_size=2,
                  compact_interval_s=None)
    thread = threading.Thread(target=c.serve_forever, daemon=True)
    thread.start()
    yield c
    c.shutdown()
    thread.join(5)


def _url(c: Collector) -> str:
    return f"http://{c.address}/v1/traces"


def _spans_in(root: Path) -> list[tuple]:
    with Store.open(root) as store:
        return store.sql("SELECT * EXCLUDE (scope_version) FROM spans ORDER BY trace_id, span_id").fetchall()


def test_a_simulation_sent_by_the_sdk_otlp_exporter_stores_the_same_spans_as_its_file(
        collector: Collector, tmp_path: Path) -> None:
    config = EngineConfig()
    requests_ = synthetic_requests(SyntheticWorkload(rate=3.0), 8.0, seed=11, model=config.model)
    simulate(config, requests_, SdkExporterSink(OTLPSpanExporter(endpoint=_url(collector))), seed=11)
    simulate(config, requests_, OtlpJsonLinesWriter(tmp_path / "same.jsonl"), seed=11)
    ingest_paths(tmp_path / "from_file", [tmp_path / "same.jsonl"])
    received, from_file = _spans_in(tmp_path / "store"), _spans_in(tmp_path / "from_file")
    assert len(received) == len(from_file) > 100
    assert received == from_file


def test_sdk_tracer_spans_arrive_gzip_compressed_with_a_bearer_token(tmp_path: Path) -> None:
    c = Collector(tmp_path / "store", "127.0.0.1", 0, token="s3cret")
    thread = threading.Thread(target=c.serve_forever, daemon=True)
    thread.start()
    try:
        from opentelemetry.exporter.otlp.proto.http import Compression

        exporter = OTLPSpanExporter(endpoint=_url(c), compression=Compression.Gzip,
                                    headers={"Authorization": "Bearer s3cret"})
        provider = TracerProvider(resource=Resource({"service.name": "gateway"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("test")
        for i in range(25):
            with tracer.start_as_current_span("auth", attributes={"gen_ai.request.id": f"r{i}",
                                                                 "infertrace.component.outcome": "ok"}):
                pass
        provider.shutdown()
        for headers in ({}, {"Authorization": "Bearer nope"}):
            denied = requests.post(_url(c), data=_export_body(), headers={
                "Content-Type": "application/x-protobuf", **headers})
            assert denied.status_code == 401 and denied.headers["WWW-Authenticate"] == "Bearer"
            assert Status.FromString(denied.content).message == "missing or wrong bearer token"
    finally:
        c.shutdown()
    with Store.open(tmp_path / "store") as store:
        rows = store.sql("SELECT component, request_id, outcome, service FROM component_calls").fetchall()
    assert sorted(rows) == sorted(("auth", f"r{i}", "ok", "gateway") for i in range(25))


def _export_body(n: int = 3, name: str = "auth") -> bytes:
    provider = TracerProvider(resource=Resource({"service.name": "auth"}))
    tracer = provider.get_tracer("test")
    spans = []
    for i in range(n):
        span = tracer.start_span(name, attributes={"gen_ai.request.id": f"q{i}"})
        span.end()
        spans.append(span)
    return encode_spans(spans).SerializeToString()  # type: ignore[arg-type]


def test_json_and_protobuf_bodies_are_answered_in_their_own_content_type(collector: Collector) -> None:
    body = _export_body()
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    as_json = message_to_otlp_json(ExportTraceServiceRequest.FromString(body))
    r = requests.post(_url(collector), data=as_json, headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json" and r.json() == {}
    r = requests.post(_url(collector), data=body, headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/x-protobuf"
    assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
    assert collector.spans_stored == 6
    assert len(_spans_in(collector.root)) == 3  # the same spans twice: stored once


@pytest.mark.parametrize("proto_names", [False, True])
def test_a_json_body_in_the_generic_protobuf_mapping_stores_what_otlp_json_stores(tmp_path: Path,
                                                                                 proto_names: bool) -> None:
    """Base64 ids and enum names (`json_format.MessageToJson`, Go's protojson), with or without proto field
    names: a client that serialises OTLP with its protobuf library's JSON mapping instead of OTLP's."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    message = ExportTraceServiceRequest.FromString(_export_body(5))
    generic = json_format.MessageToJson(message, preserving_proto_field_name=proto_names)
    assert '"SPAN_KIND_INTERNAL"' in generic
    stored = {}
    for name, body in (("otlp", message_to_otlp_json(message)), ("generic", generic)):
        c = Collector(tmp_path / name, "127.0.0.1", 0, compact_interval_s=None)
        thread = threading.Thread(target=c.serve_forever, daemon=True)
        thread.start()
        try:
            r = requests.post(_url(c), data=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 200 and r.json() == {}, r.text
        finally:
            c.shutdown()
            thread.join(5)
        stored[name] = _spans_in(tmp_path / name)
    assert len(stored["generic"]) == 5 and stored["generic"] == stored["otlp"]


def test_bad_bodies_get_400_with_a_reason(collector: Collector) -> None:
    for data, content_type, words in [
        (b"\xff\xfe not protobuf", "application/x-protobuf", "not an ExportTraceServiceRequest"),
        (b"{not json", "application/json", "not JSON"),
        (b"[1, 2]", "application/json", "not a JSON object"),
        (b'{"resourceSpans": 7}', "application/json", "resourceSpans is not a list"),
    ]:
        r = requests.post(_url(collector), data=data, headers={"Content-Type": content_type})
        assert r.status_code == 400, data
        message = r.json()["message"] if content_type == "application/json" else Status.FromString(r.content).message
        assert words in message
    r = requests.post(_url(collector), data=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = requests.post(_url(collector), data=b"x", headers={"Content-Type": "application/json",
                                                           "Content-Encoding": "gzip"})
    assert r.status_code == 400 and "gzip" in r.json()["message"]


def test_bad_spans_are_quarantined_and_answered_as_partial_success(collector: Collector) -> None:
    good = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "route",
            "startTimeUnixNano": "1767225600000000000", "endTimeUnixNano": "1767225600000500000"}
    bad = {**good, "spanId": "xyz"}
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [good, bad]}]}]}
    r = requests.post(_url(collector), json=body)
    assert r.status_code == 200
    assert r.json()["partialSuccess"]["rejectedSpans"] == "1"
    quarantined = [json.loads(line) for q in (collector.root / "quarantine").iterdir()
                   for line in q.read_text().splitlines()]
    assert len(quarantined) == 1 and "spanId" in quarantined[0]["reason"]
    assert quarantined[0]["source"].startswith("http 127.0.0.1")
    assert len(_spans_in(collector.root)) == 1


def test_bodies_over_the_cap_get_413_before_and_after_decompression(collector: Collector) -> None:
    big = b"x" * (300 * 1024)
    r = requests.post(_url(collector), data=big, headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 413
    bomb = gzip.compress(b"\0" * (5 * 1024 * 1024))
    assert len(bomb) < 256 * 1024
    r = requests.post(_url(collector), data=bomb, headers={"Content-Type": "application/x-protobuf",
                                                           "Content-Encoding": "gzip"})
    assert r.status_code == 413 and "decompressed" in Status.FromString(r.content).message
    small = gzip.compress(_export_body())
    r = requests.post(_url(collector), data=small, headers={"Content-Type": "application/x-protobuf",
                                                            "Content-Encoding": "gzip"})
    assert r.status_code == 200


def test_a_full_queue_answers_503_with_retry_after_and_recovers(collector: Collector) -> None:
    body = _export_body()
    with collector.receiver.admit(len(body)), collector.receiver.admit(len(body)):  # queue_size=2, both busy
        busy = requests.post(_url(collector), data=body, headers={"Content-Type": "application/x-protobuf"})
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
        assert "queue-size" in Status.FromString(busy.content).message
    again = requests.post(_url(collector), data=body, headers={"Content-Type": "application/x-protobuf"})
    assert again.status_code == 200


def test_clients_still_sending_their_bodies_take_no_write_slot(collector: Collector) -> None:
    body = _export_body()
    host, port = collector.address.split(":")
    slow = []
    for _ in range(4):  # queue_size=2: four requests whose bodies are still arriving
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:5])
        slow.append(s)
    time.sleep(0.3)
    meanwhile = requests.post(_url(collector), data=body, headers={"Content-Type": "application/x-protobuf"})
    assert meanwhile.status_code == 200
    for s in slow:
        s.sendall(body[5:])
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.close()


def test_wrong_path_and_method(collector: Collector) -> None:
    assert requests.post(f"http://{collector.address}/v1/metrics", data=b"").status_code == 404
    assert requests.get(_url(collector)).status_code == 405


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=2048), content_type=st.sampled_from(["application/x-protobuf", "application/json"]),
       gzipped=st.booleans())
@pytest.mark.slow
def test_fuzzed_bodies_never_crash_the_receiver(collector: Collector, body: bytes, content_type: str,
                                                gzipped: bool) -> None:
    headers = {"Content-Type": content_type}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    r = requests.post(_url(collector), data=body, headers=headers)
    assert r.status_code in (200, 400, 413)
    assert requests.post(_url(collector), data=_export_body(1), headers={
        "Content-Type": "application/x-protobuf"}).status_code == 200


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)
_span_like = st.fixed_dictionaries({}, optional={
    "traceId": st.sampled_from(["0af7651916cd43dd8448eb211c80319c", "", "zz", "0" * 32]) | st.text(max_size=33),
    "spanId": st.sampled_from(["b7ad6b7169203331", "0" * 16]) | _json_values,
    "name": _json_values, "kind": _json_values,
    "startTimeUnixNano": st.sampled_from(["1", "-5", "9" * 25]) | _json_values,
    "endTimeUnixNano": _json_values,
    "attributes": st.lists(st.fixed_dictionaries({"key": st.sampled_from(
        ["gen_ai.request.id", "infertrace.step.durations_ns", "x"]) | _json_values, "value": _json_values})),
    "events": _json_values, "status": _json_values, "links": _json_values})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spans=st.lists(_span_like, max_size=4), junk=_json_values)
def test_fuzzed_json_exports_are_stored_or_rejected_never_crash(collector: Collector, spans: list,
                                                               junk: object) -> None:
    for body in ({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": spans}]}]}, junk):
        r = requests.post(_url(collector), data=json.dumps(body), headers={"Content-Type": "application/json"})
        assert r.status_code in (200, 400), r.text


def test_the_same_export_sent_concurrently_is_stored_once(tmp_path: Path) -> None:
    c = Collector(tmp_path / "store", "127.0.0.1", 0, queue_size=16)
    thread = threading.Thread(target=c.serve_forever, daemon=True)
    thread.start()
    body = _export_body(50)
    codes: list[int] = []
    barrier = threading.Barrier(8)

    def send() -> None:
        barrier.wait()
        codes.append(requests.post(_url(c), data=body, headers={"Content-Type": "application/x-protobuf"}).status_code)

    try:
        senders = [threading.Thread(target=send) for _ in range(8)]
        for s in senders:
            s.start()
        for s in senders:
            s.join(30)
    finally:
        c.shutdown()
    assert codes == [200] * 8
    assert len(_spans_in(c.root)) == 50
    assert not list(c.root.rglob("*.tmp"))


# ------------------------------------------------------------------ OTLP/gRPC, vLLM, encodings, logs
def _grpc_collector(tmp_path: Path, **kwargs: Any) -> Collector:
    c = Collector(tmp_path / "store", "127.0.0.1", 0, grpc=("127.0.0.1", 0), compact_interval_s=None, **kwargs)
    c.start()
    return c


def _vllm_v1_llm_request(provider: TracerProvider, request_id: str, arrival_ns: int) -> None:
    """A span shaped as vLLM V1's `OutputProcessor.do_tracing` makes it: SERVER kind, started at the
    frontend's arrival time, the `gen_ai.latency.*` seconds, vLLM's usage names, and the finish reasons as
    a JSON-encoded string (not a string array)."""
    tracer = provider.get_tracer("vllm.v1.engine.output_processor")
    attributes = {
        "gen_ai.latency.time_to_first_token": 0.085, "gen_ai.latency.e2e": 1.25,
        "gen_ai.latency.time_in_queue": 0.012, "gen_ai.usage.prompt_tokens": 812,
        "gen_ai.usage.completion_tokens": 64, "gen_ai.latency.time_in_model_prefill": 0.073,
        "gen_ai.latency.time_in_model_decode": 1.165, "gen_ai.latency.time_in_model_inference": 1.238,
        "gen_ai.request.id": request_id, "gen_ai.request.top_p": 0.9, "gen_ai.request.max_tokens": 128,
        "gen_ai.request.temperature": 0.7, "gen_ai.request.n": 1,
        "gen_ai.response.finish_reasons": json.dumps(["stop"]),
    }
    span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=arrival_ns, attributes=attributes)
    span.end(end_time=arrival_ns + 1_250_000_000)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_vllm_v1_llm_request_spans_are_stored_with_their_json_finish_reasons_converted_not_quarantined(
        tmp_path: Path, transport: str, caplog: pytest.LogCaptureFixture) -> None:
    c = _grpc_collector(tmp_path)
    try:
        if transport == "http":
            exporter = OTLPSpanExporter(endpoint=f"http://{c.address}/v1/traces")
        else:
            exporter = GrpcSpanExporter(endpoint=c.grpc_address, insecure=True)
        provider = TracerProvider(resource=Resource({"service.name": "vllm"}))  # vLLM sets no instance id
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        with caplog.at_level(logging.INFO, logger="infertrace.collect"):
            for i in range(5):
                _vllm_v1_llm_request(provider, f"cmpl-{i}", T0 + i * 2_000_000_000)
            provider.shutdown()
    finally:
        c.shutdown()
    assert not (c.root / "quarantine").exists()
    with Store.open(c.root) as store:
        rows = store.sql("SELECT request_id, finish_reason, input_tokens, output_tokens, ttft_ns, timing_source "
                         "FROM requests ORDER BY request_id").fetchall()
        extra = store.sql('SELECT "attr.gen_ai.latency.time_in_model_inference", span_attributes FROM spans').fetchall()
        notes = store.notes
    assert rows == [(f"cmpl-{i}", "stop", 812, 64, 85_000_000, "gen_ai.latency") for i in range(5)]
    assert extra == [(1.238, {})] * 5  # every key vLLM V1 sets is declared (infertrace.semconv), typed
    assert notes == {"converted": {"gen_ai.response.finish_reasons": 5}}
    lines = [r for r in caplog.records if r.name == "infertrace.collect"]
    assert len(lines) == 5 and all(r.levelno == logging.WARNING for r in lines)  # stored, with a conversion
    assert all(f"{transport} 127.0.0.1 " in r.getMessage() and "stored 1 spans" in r.getMessage() for r in lines)


def test_the_grpc_exporter_stores_a_simulation_as_its_file_does_and_needs_the_token(tmp_path: Path) -> None:
    c = _grpc_collector(tmp_path, token="s3cret")
    try:
        config = EngineConfig()
        requests_ = synthetic_requests(SyntheticWorkload(rate=3.0), 6.0, seed=2, model=config.model)
        exporter = GrpcSpanExporter(endpoint=c.grpc_address, insecure=True, headers={"authorization": "Bearer s3cret"},
                                    compression=GrpcCompression.Gzip)
        simulate(config, requests_, SdkExporterSink(exporter), seed=2)
        simulate(config, requests_, OtlpJsonLinesWriter(tmp_path / "same.jsonl"), seed=2)
        refused = GrpcSpanExporter(endpoint=c.grpc_address, insecure=True, timeout=3)
        provider = TracerProvider()
        span = provider.get_tracer("t").start_span("auth", start_time=T0)
        span.end(end_time=T0 + 1)
        assert refused.export([span]) == SpanExportResult.FAILURE  # UNAUTHENTICATED: not retried, not stored
    finally:
        c.shutdown()
    ingest_paths(tmp_path / "from_file", [tmp_path / "same.jsonl"])
    received, from_file = _spans_in(c.root), _spans_in(tmp_path / "from_file")
    assert len(received) == len(from_file) > 100 and received == from_file


def test_grpc_answers_resource_exhausted_with_retry_info_when_busy_and_the_exporter_retries(tmp_path: Path) -> None:
    c = _grpc_collector(tmp_path, queue_size=1)
    body = ExportTraceServiceRequest.FromString(_export_body(2))
    try:
        channel = grpc.insecure_channel(c.grpc_address)
        stub = TraceServiceStub(channel)
        with c.receiver.admit(10):  # the only write slot is taken
            with pytest.raises(grpc.RpcError) as refused:
                stub.Export(body, timeout=5)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            retry = RetryInfo.FromString(dict(refused.value.trailing_metadata())["google.rpc.retryinfo-bin"])
            assert retry.retry_delay.seconds == 1
        channel.close()
        exporter = GrpcSpanExporter(endpoint=c.grpc_address, insecure=True, timeout=15)
        provider = TracerProvider()
        span = provider.get_tracer("t").start_span("auth", start_time=T0)
        span.end(end_time=T0 + 1)
        slot = c.receiver.admit(10)
        slot.__enter__()
        threading.Timer(1.5, slot.__exit__, (None, None, None)).start()  # frees the slot while it waits
        assert exporter.export([span]) == SpanExportResult.SUCCESS
    finally:
        c.shutdown()
    assert len(_spans_in(c.root)) == 1


def _traces_json(n: int, start: int = 0, name: str = "auth") -> dict[str, Any]:
    spans = [{"traceId": f"{start + i + 1:032x}", "spanId": f"{start + i + 1:016x}", "name": name,
              "startTimeUnixNano": str(T0 + i), "endTimeUnixNano": str(T0 + i + 1000)} for i in range(n)]
    return {"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "gw"}}]},
                               "scopeSpans": [{"spans": spans}]}]}


def test_every_gzip_member_deflate_and_zstd_bodies_are_read(collector: Collector) -> None:
    import pyarrow as pa

    first, second = json.dumps(_traces_json(3)).encode(), None
    two_members = gzip.compress(first[:40]) + gzip.compress(first[40:])  # one body, two gzip members
    r = requests.post(_url(collector), data=two_members, headers={"Content-Type": "application/json",
                                                                  "Content-Encoding": "gzip"})
    assert r.status_code == 200 and len(_spans_in(collector.root)) == 3
    second = json.dumps(_traces_json(2, start=10)).encode()
    r = requests.post(_url(collector), data=zlib.compress(second), headers={
        "Content-Type": "application/json", "Content-Encoding": "deflate"})
    assert r.status_code == 200
    third = json.dumps(_traces_json(2, start=20)).encode()
    zstd = pa.Codec("zstd")
    r = requests.post(_url(collector), data=zstd.compress(third[:50], asbytes=True) + zstd.compress(
        third[50:], asbytes=True), headers={"Content-Type": "application/json", "Content-Encoding": "zstd"})
    assert r.status_code == 200
    assert len(_spans_in(collector.root)) == 7
    r = requests.post(_url(collector), data=b"x", headers={"Content-Type": "application/json",
                                                           "Content-Encoding": "br"})
    assert r.status_code == 415


def test_an_empty_export_is_a_success_and_other_methods_and_paths_get_an_otlp_status(collector: Collector) -> None:
    assert requests.post(_url(collector), data=b"", headers={"Content-Type": "application/x-protobuf"}
                         ).status_code == 200
    assert requests.post(_url(collector), json={}).status_code == 200
    assert requests.post(_url(collector), json={"resourceSpans": []}).status_code == 200
    for method, path, status in [("GET", "/v1/traces", 405), ("PUT", "/v1/traces", 405),
                                 ("POST", "/v1/metrics", 404), ("GET", "/", 404)]:
        r = requests.request(method, f"http://{collector.address}{path}",
                             headers={"Content-Type": "application/x-protobuf"})
        assert r.status_code == status, (method, path)
        assert Status.FromString(r.content).message
    r = requests.get(_url(collector), headers={"Content-Type": "application/json"})
    assert r.status_code == 405 and "POST" in r.json()["message"] and r.headers["Allow"] == "POST"


def test_a_span_with_a_lone_surrogate_is_quarantined_and_the_other_spans_stored(collector: Collector) -> None:
    body = _traces_json(20)
    body["resourceSpans"][0]["scopeSpans"][0]["spans"][7]["name"] = "bad\ud800name"
    r = requests.post(_url(collector), data=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    assert r.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert "not valid Unicode" in r.json()["partialSuccess"]["errorMessage"]
    assert len(_spans_in(collector.root)) == 19


def test_each_request_is_logged_once_at_a_level_that_says_how_it_went(
        collector: Collector, caplog: pytest.LogCaptureFixture) -> None:
    bad = _traces_json(2)
    bad["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["endTimeUnixNano"] = "5"
    with caplog.at_level(logging.INFO, logger="infertrace.collect"):
        requests.post(_url(collector), json=_traces_json(2))
        requests.post(_url(collector), json=bad)
        requests.post(_url(collector), data=b"{oops", headers={"Content-Type": "application/json"})
        with collector.receiver.admit(1), collector.receiver.admit(1):
            requests.post(_url(collector), json=_traces_json(1))
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "infertrace.collect"]
    assert [level for level, _ in got] == [logging.INFO, logging.WARNING, logging.WARNING, logging.ERROR]
    assert " 200 " in got[0][1] and "stored 2 spans" in got[0][1]
    assert "1 spans rejected" in got[1][1] and "before startTimeUnixNano" in got[1][1]
    assert " 400 " in got[2][1] and "not JSON" in got[2][1]
    assert " 503 " in got[3][1] and "queue-size" in got[3][1]


def test_headers_sent_byte_by_byte_are_cut_off_while_other_clients_are_served(tmp_path: Path) -> None:
    c = Collector(tmp_path / "store", "127.0.0.1", 0, header_timeout=0.6, compact_interval_s=None)
    c.start()
    host, port = c.address.split(":")
    try:
        slow = [socket.create_connection((host, int(port))) for _ in range(8)]
        request = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        closed_at: list[float] = []
        started = time.monotonic()
        for i in range(len(request)):
            for s in slow:
                try:
                    s.sendall(request[i:i + 1])
                except OSError:
                    closed_at.append(time.monotonic() - started)
                    slow.remove(s)
            r = requests.post(_url(c), json=_traces_json(1, start=i), timeout=5)
            assert r.status_code == 200
            time.sleep(0.05)
            if not slow:
                break
        for s in slow:  # a closed connection reads as end of stream
            s.settimeout(2)
            assert s.recv(100) == b""
            s.close()
    finally:
        c.shutdown()


def test_over_the_memory_limit_the_answer_is_503_with_retry_after(tmp_path: Path) -> None:
    c = Collector(tmp_path / "store", "127.0.0.1", 0, memory_limit_bytes=10_000, compact_interval_s=None)
    c.start()
    try:
        with c.receiver.admit(500):  # 500 bytes of body ≈ 6 kB to decode: another such request does not fit
            body = json.dumps(_traces_json(3)).encode()
            r = requests.post(_url(c), data=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
            assert "memory limit" in r.json()["message"]
        assert requests.post(_url(c), data=body, headers={"Content-Type": "application/json"}).status_code == 200
    finally:
        c.shutdown()


def test_protobuf_requests_read_field_by_field_store_what_the_generic_json_mapping_stores() -> None:
    from google.protobuf import json_format

    from infertrace.otlp_json import message_to_otlp_dict
    from infertrace.store import protobuf_spans
    from infertrace.store.batch import SpanBatch

    provider = TracerProvider(resource=Resource({"service.name": "gw", "service.instance.id": "gw-1", "n": 3}))
    tracer = provider.get_tracer("scope", "1.2")
    spans = []
    parent = tracer.start_span("gateway", start_time=T0, attributes={"gen_ai.request.id": "r1"})
    link_to = parent.get_span_context()
    child = tracer.start_span(
        "route", context=trace_api.set_span_in_context(parent), start_time=T0 + 5, links=[
            trace_api.Link(link_to, {"weight": 2, "why": "retry"})],
        attributes={"i": -(2**63), "d": 1.5, "b": True, "s": "é", "ints": [1, 2], "strs": ["a"], "bools": [True],
                    "doubles": [0.5], "gen_ai.response.finish_reasons": '["stop"]', "http.response.status_code": 200.0})
    child.add_event("first_token", {"infertrace.chunk.tokens": 12}, timestamp=T0 + 7)
    child.set_status(trace_api.Status(trace_api.StatusCode.ERROR, "boom"))
    child.end(end_time=T0 + 9)
    parent.end(end_time=T0 + 10)
    spans = [parent, child]
    request = encode_spans(spans)
    request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="raw").value.bytes_value = b"\x00\xff"
    kv = request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="kv").value.kvlist_value.values.add()
    kv.key, kv.value.int_value = "inner", 7
    generic, direct = SpanBatch(), SpanBatch()
    generic.add_traces_data(message_to_otlp_dict(request), "x", 0)
    for rs in request.resource_spans:
        for chunk in protobuf_spans.resource_spans(rs, spans_per_chunk=1):
            direct.add_traces_data({"resourceSpans": [chunk]}, "x", 0)
    assert not generic.rejections and not direct.rejections
    assert direct.table().equals(generic.table())
    assert direct.notes.counts() == generic.notes.counts()
    assert json_format.MessageToDict(request)  # the message is valid protobuf


def test_a_collector_with_resource_stores_one_environment_and_logs_what_it_left_out(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`collect --resource deployment.environment.name=production`: spans of another environment, or none named,
    are not stored; the answer is a plain success (they are not the client's error) and the log line counts them.
    The same over gRPC."""
    def export(start: int) -> dict[str, Any]:
        body: dict[str, Any] = {"resourceSpans": []}
        for offset, environment in ((0, "production"), (10, "staging"), (20, None)):
            part = _traces_json(3, start=start + offset)["resourceSpans"][0]
            if environment is not None:
                part["resource"]["attributes"].append(
                    {"key": "deployment.environment.name", "value": {"stringValue": environment}})
            body["resourceSpans"].append(part)
        return body

    c = Collector(tmp_path / "store", "127.0.0.1", 0, compact_interval_s=None, grpc=("127.0.0.1", 0),
                  resource=(("deployment.environment.name", "production"),))
    c.start()
    try:
        with caplog.at_level(logging.INFO, logger="infertrace.collect"):
            r = requests.post(_url(c), json=export(0))
            request = ExportTraceServiceRequest()
            body = export(100)  # protobuf's JSON mapping takes ids as base64, OTLP/JSON as hex
            for part in body["resourceSpans"]:
                for span in part["scopeSpans"][0]["spans"]:
                    for key in ("traceId", "spanId"):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
            json_format.Parse(json.dumps(body), request)
            with grpc.insecure_channel(c.grpc_address) as channel:
                TraceServiceStub(channel).Export(request, timeout=10)
    finally:
        c.shutdown()
    assert r.status_code == 200 and "partialSuccess" not in r.json()
    with Store.open(tmp_path / "store") as store:
        stored = store.sql("SELECT resource_attributes['deployment.environment.name'], count(*) FROM spans "
                           "GROUP BY ALL").fetchall()
    assert stored == [("production", 6)] and c.spans_stored == 6
    lines = [r.getMessage() for r in caplog.records if r.name == "infertrace.collect"]
    assert len(lines) == 2 and all("stored 3 spans, left out 6 of other resources" in line for line in lines)
