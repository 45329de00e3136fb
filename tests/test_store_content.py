"""Prompt and completion text never reaches the store. GenAI instrumentations record message text by default
(OpenLLMetry's span attributes, the earlier OpenTelemetry GenAI events, OpenInference's `input.value`); ingest,
from a file or over OTLP/HTTP, keeps every other attribute, leaves those out of spans, events and quarantined
records, and counts what it left out so the report says so."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from infertrace.otlp_json import message_to_otlp_json
from infertrace.report import ReportOptions, build_report
from infertrace.store.collector import Collector
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store

SECRET = "the patient's diagnosis is"
CALLS = 12


def _instrumented(provider: TracerProvider) -> None:
    """An application's calls to a model as OpenLLMetry and OpenInference record them, message text included."""
    tracer = provider.get_tracer("opentelemetry.instrumentation.openai")
    for i in range(CALLS):
        with tracer.start_as_current_span("openai.chat", kind=SpanKind.CLIENT, attributes={
                "gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 900 + i,
                "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": f"{SECRET} {i} " * 400,
                "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": f"{SECRET} {i}, answered",
                "gen_ai.completion.0.finish_reason": "stop", "input.value": f"{SECRET} {i}",
                "llm.input_messages.0.message.content": f"{SECRET} {i}"}) as span:
            span.add_event("gen_ai.content.prompt", {"gen_ai.prompt": f"{SECRET} {i}", "turn": i})


def _stored_text(root: Path) -> list[str]:
    """Every stored span row and every quarantined record, as text."""
    with Store.open(root) as store:
        rows = [str(row) for row in store.sql("SELECT * FROM spans_raw").fetchall()]
    return rows + [f.read_text() for f in (root / "quarantine").glob("*.jsonl")]


def test_a_file_of_instrumented_spans_is_stored_without_its_message_text_and_says_so(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "chat-app"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _instrumented(provider)
    spans = exporter.get_finished_spans()
    line = message_to_otlp_json(encode_spans(spans))
    bad_span = json.loads(line)
    bad_span["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "not-an-id"
    not_traces = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "gen_ai.prompt", "value": {"stringValue": SECRET}}]}, "scopeSpans": "not a list"}]}
    (tmp_path / "app.jsonl").write_text("\n".join([line, json.dumps(bad_span), json.dumps(not_traces)]) + "\n")

    summary = ingest_paths(tmp_path / "store", [tmp_path / "app.jsonl"])

    assert summary.skipped == 2  # the span with a bad id and the line that is no TracesData: quarantined
    stored = _stored_text(tmp_path / "store")
    assert not [text for text in stored if "diagnosis" in text]
    with Store.open(tmp_path / "store") as store:
        kept = store.sql("SELECT span_attributes['gen_ai.prompt.0.role'], span_attributes['gen_ai.completion.0."
                         "finish_reason'], \"attr.gen_ai.request.model\", events[1].attributes "
                         "FROM spans_raw").fetchall()
        document = build_report(store, ReportOptions(sections=("slo",)))
    assert len(kept) == CALLS + CALLS - 1  # the first line's spans, and the second's but the one with a bad id
    assert {(role, reason, model) for role, reason, model, _ in kept} == {("user", "stop", "gpt-4o")}
    assert {tuple(json.loads(attributes)) for *_, attributes in kept} == {("turn",)}
    said = document["coverage"]["stored_with_changes"]
    assert said.startswith(f"removed {len(kept) * 5} prompt or completion texts (")  # 4 attributes, 1 in an event
    assert "gen_ai.prompt.0.content" in said


def test_spans_sent_over_otlp_http_are_stored_without_their_message_text(tmp_path: Path) -> None:
    collector = Collector(tmp_path / "store", "127.0.0.1", 0, compact_interval_s=None)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "chat-app"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
            endpoint=f"http://{collector.address}/v1/traces")))
        _instrumented(provider)
        provider.shutdown()
    finally:
        collector.shutdown()
        thread.join(5)
    stored = _stored_text(tmp_path / "store")
    assert len(stored) == CALLS
    assert not [text for text in stored if "diagnosis" in text]
    assert all("gen_ai.prompt.0.role" in text for text in stored)


def test_an_event_whose_only_attribute_is_a_number_under_a_message_key_is_left_out_on_both_paths() -> None:
    """The columnar path builds integer-only events (the engine's prefill chunks) without looking at each value:
    it defers a block whose events carry a message-text key, so the two paths store the same."""
    from infertrace.store.batch import SpanBatch
    from infertrace.store.columnar import decode_block

    span = {"traceId": "1" * 32, "spanId": "2" * 16, "name": "x", "startTimeUnixNano": "2000000000000000000",
            "endTimeUnixNano": "2000000000000000005", "events": [{"timeUnixNano": "7", "name": "e", "attributes": [
                {"key": "gen_ai.prompt", "value": {"intValue": "5"}}, {"key": "turn", "value": {"intValue": "1"}}]}]}
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    batch = SpanBatch()
    batch.add_traces_data(json.loads(line), "x", 1)
    assert batch.table().column("events").to_pylist() == [[{"time_ns": 7, "name": "e", "attributes": '{"turn":1}'}]]
    assert batch.notes.counts() == {"redacted": {"gen_ai.prompt": 1}}
    assert decode_block((line + "\n").encode(), len(line)) is None  # deferred to the record path
