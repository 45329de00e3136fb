"""Text Generation Inference's traces (`--otlp-endpoint`), emulated: what TGI's router exports through
tracing-opentelemetry (router/src/server.rs, router/src/infer/mod.rs, backends/v3/src/backend.rs and queue.rs;
infertrace/sources/tgi.py cites the commit).

Per request, one trace:

    chat_completions                     the HTTP handler; total_time, validation_time, queue_time,
      generate_stream                    inference_time, time_per_token and seed as Rust `Duration` Debug strings
        validate
        schedule                         the backend's entry span
          queued                         enqueued → picked into a batch
          infer                          one per step the request took part in, linked to that step's batch span
            send_generation              one per token sent

and per engine step one trace of its own: `batch` (`batch_size`) with a `prefill` or `decode` child, linked to the
`infer` spans of its requests. Every span is INTERNAL and carries `code.namespace`, `code.filepath` and
`code.lineno` (tracing-opentelemetry); none carries a request id or token counts (TGI puts those in response
headers), and `send_generation`'s `generation` field (token ids and text) is left out here, as this project
records no completion text. The resource is `service.name` alone (`--otlp-service-name`; TGI builds it with
`Resource::new`, so OTEL_RESOURCE_ATTRIBUTES is not read).

The simulated engine is TGI's batching task: its arrival is the queue append; the HTTP handler started
`frontend_in` earlier (validation, tokenisation) and hands each token to the client `frontend_out` later.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from infertrace import semconv as sc
from reference_engine.telemetry.buffer import SpanBuffer
from reference_engine.telemetry.frontend import FrontendLatency
from reference_engine.telemetry.otlp import Attributes, SpanRecord, SpanSink
from reference_engine.telemetry.timeline import Journey, Timeline

if TYPE_CHECKING:
    from reference_engine.engine.llm_engine import StepReport
    from reference_engine.engine.sequence import Sequence

SCOPE = "opentelemetry-otlp"
SERVER = ("text_generation_router::server", "router/src/server.rs", 1168)
INFER = ("text_generation_router::infer", "router/src/infer/mod.rs", 99)
BACKEND = ("text_generation_router_v3::backend", "backends/v3/src/backend.rs", 78)
QUEUE = ("text_generation_router_v3::queue", "backends/v3/src/queue.rs", 228)
VALIDATION = ("text_generation_router::validation", "router/src/validation.rs", 450)


def tgi_resource(service_name: str) -> Attributes:
    return {sc.SERVICE_NAME: service_name}


def rust_duration(ns: int) -> str:
    """A duration as Rust's `{:?}` prints it: `1.234567891s`, `12.5ms`, `850µs`, `40ns`."""
    for unit, size in (("s", 10**9), ("ms", 10**6), ("µs", 10**3)):
        if ns >= size:
            whole, rest = divmod(ns, size)
            digits = len(str(size)) - 1
            fraction = f"{rest:0{digits}d}".rstrip("0")
            return f"{whole}.{fraction}{unit}" if fraction else f"{whole}{unit}"
    return f"{ns}ns"


def _code(where: tuple[str, str, int]) -> Attributes:
    namespace, path, line = where
    return {sc.CODE_NAMESPACE: namespace, "code.filepath": path, "code.lineno": line}


class TgiTracer:
    def __init__(self, sink: SpanSink, resource: Attributes, seed: int = 0, batch_size: int = 2048) -> None:
        self.out = SpanBuffer(sink, resource, SCOPE, batch_size)
        self._rng = random.Random(f"tgi-{seed}")
        self.frontend = FrontendLatency(rng=random.Random(f"tgi-frontend-{seed}"))
        self.timeline = Timeline()
        self._batch_spans: dict[int, tuple[int, int]] = {}  # timeline batch number -> (trace id, span id)

    def _id(self, bits: int = 64) -> int:
        return self._rng.getrandbits(bits) or 1

    def on_step(self, report: StepReport) -> None:
        first = self.timeline.batches
        self.timeline.on_step(report)
        batch = report.batch
        size = len(batch.prefills) + len(batch.decodes)
        ends = report.start_ns + report.durations.cumsum()
        for i, (duration, end) in enumerate(zip(report.durations.tolist(), ends.tolist(), strict=True)):
            trace_id, span_id = self._id(128), self._id()
            start = int(end) - int(duration)
            work = sc.SPAN_PREFILL if batch.prefills else sc.SPAN_DECODE
            self.out.emit(SpanRecord(trace_id, span_id, 0, "batch", start, int(end),
                                     {sc.TGI_BATCH_SIZE: size, **_code(BACKEND)}))
            self.out.emit(SpanRecord(trace_id, self._id(), span_id, work, start, int(end), _code(BACKEND)))
            self._batch_spans[first + i] = (trace_id, span_id)
        if len(self._batch_spans) > 65536:
            keep = self.timeline.batches - 4096
            self._batch_spans = {k: v for k, v in self._batch_spans.items() if k >= keep}

    def on_finish(self, seq: Sequence) -> None:
        journey = self.timeline.pop(seq.request_id)
        if seq.error is not None or seq.first_token_ns is None:
            return  # refused at validation: TGI answers 422 before anything is queued
        for span in self._request(seq, journey):
            self.out.emit(span)

    def _request(self, seq: Sequence, journey: Journey) -> list[SpanRecord]:
        req = seq.request
        delay_in, delay_out = self.frontend.draw()
        queued, scheduled = req.arrival_ns, seq.first_scheduled_ns or req.arrival_ns
        finished = seq.finish_ns or queued
        start = queued - delay_in
        validated = start + delay_in * 3 // 4
        trace_id, parent = req.trace_parent or (self._id(128), 0)
        handler_id, infer_id, schedule_id = self._id(), self._id(), self._id()
        spans: list[SpanRecord] = []
        tokens = max(seq.num_output_tokens, 1)
        inference = finished - scheduled
        handler = SpanRecord(trace_id, handler_id, parent, "chat_completions", start, finished + delay_out, {
            **_code(SERVER),
            sc.TGI_TOTAL_TIME: rust_duration(finished + delay_out - start),
            "validation_time": rust_duration(validated - start),
            sc.TGI_QUEUE_TIME: rust_duration(scheduled - queued),
            sc.TGI_INFERENCE_TIME: rust_duration(inference),
            sc.TGI_TIME_PER_TOKEN: rust_duration(inference // tokens),
            "seed": "None"})
        spans.append(handler)
        spans.append(SpanRecord(trace_id, infer_id, handler_id, "generate_stream", start, finished + delay_out,
                                _code(INFER)))
        spans.append(SpanRecord(trace_id, self._id(), infer_id, "validate", start, validated, _code(VALIDATION)))
        spans.append(SpanRecord(trace_id, schedule_id, infer_id, "schedule", queued, finished, _code(BACKEND)))
        spans.append(SpanRecord(trace_id, self._id(), schedule_id, "queued", queued, scheduled, _code(QUEUE)))
        tokens_at = iter(journey.token_ns)
        next_token = next(tokens_at, None)
        for step in journey.steps:
            infer = SpanRecord(trace_id, self._id(), schedule_id, "infer", step.start_ns, step.end_ns, _code(BACKEND))
            batch_span = self._batch_spans.get(step.batch)
            if batch_span is not None:
                infer.links = [batch_span]
            spans.append(infer)
            while next_token is not None and next_token <= step.end_ns:
                spans.append(SpanRecord(trace_id, self._id(), infer.span_id, "send_generation", next_token,
                                        next_token + 2_000, _code(BACKEND)))
                next_token = next(tokens_at, None)
        return spans

    def close(self) -> None:
        self.out.close()
