"""`infertrace collect` over real HTTP on 127.0.0.1: the SDK's OTLP exporter, protobuf and JSON bodies, gzip,
and every refusal the receiver makes."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from google.rpc.status_pb2 import Status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from infertrace.otlp_json import message_to_otlp_json
from infertrace.store.collector import Collector
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.engine.config import EngineConfig
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter, SdkExporterSink
from reference_engine.workload import SyntheticWorkload, synthetic_requests


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(tmp_path / "store", "127.0.0.1", 0, max_body_bytes=256 * 1024, queue_size=2)
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
