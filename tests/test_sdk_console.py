"""Spans as OpenTelemetry's Python SDK prints them (`ConsoleSpanExporter`, what a server started with
`OTEL_TRACES_EXPORTER=console` writes) ingest as the same spans as the SDK's OTLP encoding of them, but for the
instrumentation scope and the links' flags, which the printout does not carry."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, StatusCode

from infertrace.otlp_json import message_to_otlp_json
from infertrace.store import sdk_console
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from infertrace.store.values import BadRecord

T0 = 1_767_225_600 * 10**9


def _stored(root: Path) -> tuple[pa.Table, list[Any]]:
    """Every column but the scope's, and the links without their flags (the printout carries neither)."""
    with Store.open(root) as store:
        table = store.sql("SELECT * EXCLUDE (scope_name, scope_version) FROM spans ORDER BY span_id").to_arrow_table()
    links = [[{k: v for k, v in link.items() if k != "flags"} for link in json.loads(text)] if text else text
             for text in table.column("links").to_pylist()]
    return table.drop_columns(["links"]), links


def test_spans_printed_by_the_sdks_console_exporter_store_what_their_otlp_encoding_stores(tmp_path: Path) -> None:
    printed, memory = io.StringIO(), InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm", "service.instance.id": "gpu-3"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=printed)))
    tracer = provider.get_tracer("vllm.tracing.otel", "0.11")
    us = 1000  # the printout holds microseconds
    with tracer.start_as_current_span("POST /v1/completions", kind=SpanKind.SERVER, start_time=T0,
                                      end_on_exit=False) as server:
        request = tracer.start_span("llm_request", kind=SpanKind.INTERNAL, start_time=T0 + 17 * us, attributes={
            "gen_ai.request.id": "cmpl-1", "gen_ai.usage.input_tokens": 512, "gen_ai.request.temperature": 0.7,
            "gen_ai.response.finish_reasons": ["stop"], "infertrace.cache.hit": True},
            links=[Link(server.get_span_context(), {"why": "retry"})])
        request.add_event("first token", {"index": 0}, timestamp=T0 + 40_123 * us)
        request.set_status(StatusCode.ERROR, "preempted")
        request.end(end_time=T0 + 250_001 * us)
        server.end(end_time=T0 + 251_999 * us)
    provider.shutdown()
    (tmp_path / "console.txt").write_text(printed.getvalue())
    (tmp_path / "otlp.jsonl").write_text(message_to_otlp_json(encode_spans(memory.get_finished_spans())) + "\n")

    console = ingest_paths(tmp_path / "from-console", [tmp_path / "console.txt"])
    assert console.skipped == 0 and console.spans_read == 2, console.reasons
    ingest_paths(tmp_path / "from-otlp", [tmp_path / "otlp.jsonl"])
    (console_table, console_links), (otlp_table, otlp_links) = (_stored(tmp_path / "from-console"),
                                                                 _stored(tmp_path / "from-otlp"))
    assert console_table.equals(otlp_table) and console_links == otlp_links
    with Store.open(tmp_path / "from-console") as store:
        assert store.sql("SELECT parent_span_id, kind, status_message, start_ns FROM spans WHERE name = 'llm_request'"
                         ).fetchall() == [(f"{server.get_span_context().span_id:016x}", 1, "preempted", T0 + 17 * us)]


def test_a_printed_span_whose_time_is_not_iso_8601_is_rejected_with_its_reason(tmp_path: Path) -> None:
    span = {"name": "x", "context": {"trace_id": "0x" + "1" * 32, "span_id": "0x" + "2" * 16},
            "kind": "SpanKind.INTERNAL", "parent_id": None, "start_time": "yesterday",
            "end_time": "2026-01-01T00:00:00.000001Z", "status": {"status_code": "UNSET"}, "attributes": {},
            "events": [], "links": [], "resource": {"attributes": {"service.name": "s"}, "schema_url": ""}}
    good = {**span, "context": {"trace_id": "0x" + "1" * 32, "span_id": "0x" + "3" * 16},
            "start_time": "2026-01-01T00:00:00.000000Z"}
    (tmp_path / "console.txt").write_text(json.dumps(span, indent=4) + "\n" + json.dumps(good, indent=4) + "\n")
    summary = ingest_paths(tmp_path / "store", [tmp_path / "console.txt"])
    assert (summary.spans_read, summary.rejected_lines) == (1, 1)
    assert list(summary.reasons) == ["not a TracesData: the printed span's start_time 'yesterday' is not an ISO 8601 "
                                     "UTC time"], summary.reasons


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3), max_leaves=8)

_TIME = _JSON | st.from_regex(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z", fullmatch=True)


def test_a_printed_time_that_is_no_date_is_rejected_with_its_reason() -> None:
    """What the fuzz test below found (a ValueError before)."""
    span = {"context": {"trace_id": "0x" + "1" * 32, "span_id": "0x" + "2" * 16},
            "start_time": "0000-00-00T00:00:00Z", "end_time": "2026-01-01T00:00:00Z"}
    with pytest.raises(BadRecord, match="start_time '0000-00-00T00:00:00Z' is not a time"):
        sdk_console.resource_spans(span)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(span=st.fixed_dictionaries({"context": st.just({"trace_id": "0x" + "1" * 32, "span_id": "0x" + "2" * 16}),
                                   "start_time": _TIME, "end_time": _TIME},
                                  optional={k: _JSON for k in ("name", "kind", "parent_id", "status", "attributes",
                                                               "events", "links", "resource")}))
def test_any_json_in_a_printed_spans_fields_is_converted_or_rejected_with_a_reason(span: dict[str, Any]) -> None:
    try:
        [rs] = sdk_console.resource_spans(span)
    except BadRecord as e:
        assert str(e).startswith(("the printed", "a printed"))
        return
    [converted] = rs["scopeSpans"][0]["spans"]
    assert converted["traceId"] == "1" * 32
