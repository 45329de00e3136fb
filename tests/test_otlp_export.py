"""Exported traces are OTLP exactly: every line parses with the official opentelemetry-proto parser, ids and
timestamps round-trip, gzip and OTLP/HTTP (the SDK's own exporter, to a real server) carry the same spans."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infertrace import semconv as sc
from reference_engine.engine.config import EngineConfig
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import (
    Attributes,
    OtlpJsonLinesWriter,
    SdkExporterSink,
    SpanRecord,
    encode_attributes,
)
from reference_engine.workload import SyntheticWorkload, synthetic_requests
from tests.otlp_proto import attributes, read_traces, spans

WORKLOAD = SyntheticWorkload(rate=6, prompt_mean=600, output_mean=40, assistant_prefill_fraction=0.2)


class Tee:
    """A sink that keeps what it exports and passes it on."""

    def __init__(self, inner: OtlpJsonLinesWriter | SdkExporterSink) -> None:
        self.inner = inner
        self.records: list[SpanRecord] = []
        self.resources: list[Attributes] = []

    def export(self, resource: Attributes, records: Sequence[SpanRecord]) -> None:
        self.records.extend(records)
        self.resources.append(resource)
        self.inner.export(resource, records)

    def close(self) -> None:
        self.inner.close()


def simulate_to(sink: object, seconds: float = 20, policy: str = "decode_first") -> None:
    config = EngineConfig(policy=policy, chunked_prefill=True, max_num_batched_tokens=512)
    simulate(config, synthetic_requests(WORKLOAD, seconds, seed=3), sink, seed=3)  # type: ignore[arg-type]


def test_every_line_parses_with_the_official_parser_and_ids_and_times_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    tee = Tee(OtlpJsonLinesWriter(path))
    simulate_to(tee)
    parsed = spans(path)
    assert len(parsed) == len(tee.records) > 100
    for record, p in zip(tee.records, parsed, strict=True):
        s = p.span
        assert s.trace_id == record.trace_id.to_bytes(16, "big")
        assert s.span_id == record.span_id.to_bytes(8, "big")
        assert s.parent_span_id == (record.parent_span_id.to_bytes(8, "big") if record.parent_span_id else b"")
        assert (s.start_time_unix_nano, s.end_time_unix_nano) == (record.start_ns, record.end_ns)
        assert s.name == record.name and s.kind == record.kind
        assert p.attrs == {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in record.attributes.items()}
        assert [(e.name, e.time_unix_nano) for e in s.events] == [(n, t) for n, t, _ in record.events]
    assert {p.resource[sc.SERVICE_INSTANCE_ID] for p in parsed} == {"engine-0"}


def test_every_span_and_attribute_name_is_a_documented_convention(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    simulate_to(OtlpJsonLinesWriter(path), policy="decode_first")
    documented = {c.name for c in sc.REGISTRY}
    parsed = spans(path)
    assert {p.span.name for p in parsed} <= documented
    for p in parsed:
        assert set(p.attrs) <= documented, set(p.attrs) - documented
        assert set(p.resource) <= documented, set(p.resource) - documented
        for event in p.span.events:
            assert event.name in documented
            assert set(attributes(event)) <= documented


def test_the_request_span_is_the_parent_of_its_phase_spans_in_one_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    simulate_to(OtlpJsonLinesWriter(path))
    parsed = spans(path)
    roots = {p.span.span_id: p for p in parsed if p.span.name == sc.SPAN_REQUEST}
    children = [p for p in parsed if p.span.name in (sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE)]
    assert children
    for child in children:
        root = roots[child.span.parent_span_id]
        assert child.span.trace_id == root.span.trace_id
        assert child.attrs[sc.REQUEST_ID] == root.attrs[sc.REQUEST_ID]
        assert root.span.start_time_unix_nano <= child.span.start_time_unix_nano
        assert child.span.end_time_unix_nano <= root.span.end_time_unix_nano
    for root in roots.values():
        a = root.attrs
        assert a[sc.LATENCY_E2E] == pytest.approx(
            (root.span.end_time_unix_nano - root.span.start_time_unix_nano) / 1e9)
        assert a[sc.LATENCY_TIME_TO_FIRST_TOKEN] == pytest.approx(
            a[sc.LATENCY_TIME_IN_QUEUE] + a[sc.LATENCY_TIME_IN_MODEL_PREFILL])


def test_gzip_output_holds_the_same_spans_and_is_reproducible(tmp_path: Path) -> None:
    plain, packed, again = tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz", tmp_path / "u.jsonl.gz"
    for path in (plain, packed, again):
        simulate_to(OtlpJsonLinesWriter(path))
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    assert packed.read_bytes() == again.read_bytes(), "same seed, same bytes"
    assert len(read_traces(packed)) == len(read_traces(plain))


def test_no_prompt_text_or_content_key_reaches_the_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    simulate_to(OtlpJsonLinesWriter(path))
    text = path.read_text()
    for request in synthetic_requests(WORKLOAD, 20, seed=3):
        for key, _ in request.prompt.segments:
            if key != request.system_prompt_id:  # a system prompt's id is recorded, never its text
                assert key not in text


def test_the_sdk_exporter_sink_hands_every_span_to_an_sdk_exporter(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    tee = Tee(SdkExporterSink(memory))
    simulate_to(tee, seconds=5)
    finished = memory.get_finished_spans()
    assert len(finished) == len(tee.records) > 10
    for record, span in zip(tee.records, finished, strict=True):
        assert span.context.trace_id == record.trace_id and span.context.span_id == record.span_id
        assert (span.parent.span_id if span.parent else 0) == record.parent_span_id
        assert (span.start_time, span.end_time) == (record.start_ns, record.end_ns)
        assert span.resource.attributes[sc.SERVICE_INSTANCE_ID] == "engine-0"


@pytest.fixture
def otlp_http_server() -> Iterator[tuple[str, list[ExportTraceServiceRequest]]]:
    received: list[ExportTraceServiceRequest] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.append(request)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    server.shutdown()


def test_otlp_http_export_with_the_standard_exporter_delivers_every_span(
        otlp_http_server: tuple[str, list[ExportTraceServiceRequest]]) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint, received = otlp_http_server
    tee = Tee(SdkExporterSink(OTLPSpanExporter(endpoint=endpoint)))
    simulate_to(tee, seconds=5)
    delivered = [s for r in received for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(delivered) == len(tee.records) > 10
    assert sorted(s.span_id for s in delivered) == sorted(r.span_id.to_bytes(8, "big") for r in tee.records)


def test_a_non_finite_double_is_refused_rather_than_written_as_invalid_json() -> None:
    with pytest.raises(ValueError, match="cannot carry"):
        encode_attributes({"x": float("nan")})


def test_strings_needing_escapes_and_extreme_doubles_round_trip_in_any_order_of_one_shape(tmp_path: Path) -> None:
    """Spans of one attribute shape are encoded by a template compiled once; values that need escaping (quotes,
    backslashes, control and non-ASCII characters) or extreme doubles, before or after plain ones, must still reach
    the parser intact."""
    plain = {"s": "req-1", "t": "tenant", "f": 0.25, "g": -0.0, "n": 7, "b": True, "l": ["a", "b"]}
    odd = {"s": 'say "hi"\\', "t": "naïve\n\ttab", "f": 1.7976931348623157e308, "g": 1e308, "n": -3, "b": False,
           "l": ["é", '"']}
    path = tmp_path / "shapes.jsonl"
    writer = OtlpJsonLinesWriter(path)
    records = [SpanRecord(1, k + 1, 0, "s", 0, 1, attrs) for k, attrs in enumerate([plain, odd, plain, odd])]
    writer.export({sc.SERVICE_NAME: "x"}, records)
    writer.close()
    assert [p.attrs for p in spans(path)] == [plain, odd, plain, odd]
