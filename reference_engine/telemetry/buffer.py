"""Spans of one resource (and instrumentation scope) held until a batch is full, then handed to the sink."""

from __future__ import annotations

from reference_engine.telemetry.otlp import Attributes, SpanRecord, SpanSink


class SpanBuffer:
    def __init__(self, sink: SpanSink, resource: Attributes, scope: str, batch_size: int = 2048) -> None:
        self.sink, self.resource, self.scope, self.batch_size = sink, resource, scope, batch_size
        self.spans: list[SpanRecord] = []

    def emit(self, span: SpanRecord) -> None:
        self.spans.append(span)
        if len(self.spans) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        if self.spans:
            self.sink.export(self.resource, self.spans, scope=self.scope)
            self.spans = []

    def close(self) -> None:
        self.flush()
