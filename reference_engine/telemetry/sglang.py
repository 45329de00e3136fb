"""SGLang's request tracing (`--enable-trace`), emulated at its default trace level (3): what
sglang/srt/observability/trace.py and req_time_stats.py export (infertrace/sources/sglang.py cites the commit).

Per request, one trace:

    Req <rid[:8]>                                  tokenizer manager: arrival → finished
      Tokenizer (host:<id> | pid:<pid>)            thread span of the API server process
        tokenize, dispatch
      Scheduler [TP 0]  (host:<id> | pid:<pid>)    thread span of the scheduler process
        request_process, prefill_waiting
        prefill_forward
          chunked_prefill                          one per prefill chunk (level 3)
        decode_waiting, decode_forward
          decode_loop (decode_ct)                  one per decode iteration (level 3)

A slice links to the slice before it. `schedule` events (level 3: `bid`, `batch_size`, `forward_mode`) mark each
batch the request was put in, on the slice that was open then; `retract` marks a preemption. The request span gets
its attributes when it finishes (tokenizer_manager_components/request_tracing.py `make_span_attrs`): prompt,
completion and cached tokens, the request id, max_tokens, the served model, finish reasons as a JSON string, and
TTFT, E2E, decode, inference and prefill seconds on the tokenizer's clock. The resource is `service.name=sglang`
and the SDK's attributes; trace ids are 64-bit (SGLang's own id generator).

The simulated engine is SGLang's scheduler. The tokenizer received the request `frontend_in` before the scheduler
and sees each output `frontend_out` after it (`frontend.FrontendLatency`). A mixed step (prefills and decodes in one
forward, SGLang's mixed chunk) is one `prefill` batch for every request in it.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

from infertrace import semconv as sc
from reference_engine.telemetry.buffer import SpanBuffer
from reference_engine.telemetry.frontend import SDK_RESOURCE, FrontendLatency, finish_reason
from reference_engine.telemetry.otlp import Attributes, SpanRecord, SpanSink
from reference_engine.telemetry.timeline import Journey, StepSeen, Timeline

if TYPE_CHECKING:
    from reference_engine.engine.llm_engine import StepReport
    from reference_engine.engine.sequence import Sequence

SCOPE = "sglang server"


def sglang_resource(instance_id: str | None = None) -> Attributes:
    resource: Attributes = {**SDK_RESOURCE, sc.SERVICE_NAME: "sglang"}
    if instance_id is not None:
        resource[sc.SERVICE_INSTANCE_ID] = instance_id
    return resource


class SglangTracer:
    def __init__(self, sink: SpanSink, resource: Attributes, model: str, host_id: str, pids: tuple[int, int],
                 seed: int = 0, batch_size: int = 2048) -> None:
        self.out = SpanBuffer(sink, resource, SCOPE, batch_size)
        self.model = model
        self.host_id = host_id
        self.tokenizer_pid, self.scheduler_pid = pids
        self._rng = random.Random(f"sglang-{seed}")
        self.frontend = FrontendLatency(rng=random.Random(f"sglang-frontend-{seed}"))
        self.timeline = Timeline()
        self._bids: dict[int, str] = {}  # timeline batch number -> SGLang batch id (uuid4().hex[:8])

    def _id(self, bits: int = 64) -> int:
        return self._rng.getrandbits(bits) or 1

    def _bid(self, batch: int) -> str:
        bid = self._bids.get(batch)
        if bid is None:
            bid = self._bids[batch] = f"{self._rng.getrandbits(32):08x}"
        return bid

    def on_step(self, report: StepReport) -> None:
        self.timeline.on_step(report)
        if len(self._bids) > 65536:  # batch ids of finished steps are no longer needed
            keep = self.timeline.batches - 4096
            self._bids = {k: v for k, v in self._bids.items() if k >= keep}

    def on_finish(self, seq: Sequence) -> None:
        journey = self.timeline.pop(seq.request_id)
        if seq.error is not None or seq.first_token_ns is None:
            return  # aborted before the scheduler ran it: SGLang answers an error and closes no request span
        for span in self._request(seq, journey):
            self.out.emit(span)

    def _request(self, seq: Sequence, journey: Journey) -> list[SpanRecord]:
        req = seq.request
        rid = req.request_id
        delay_in, delay_out = self.frontend.draw()
        recv, scheduled = req.arrival_ns, seq.first_scheduled_ns or req.arrival_ns
        first, finished = seq.first_token_ns or recv, seq.finish_ns or recv
        created = recv - delay_in
        tokenized = created + delay_in // 2
        trace_id, parent = req.trace_parent or (self._id(64), 0)
        root_id = self._id()
        spans: list[SpanRecord] = []

        def span(name: str, parent_id: int, start: int, end: int, attributes: Attributes | None = None,
                 links: int = 0) -> SpanRecord:
            record = SpanRecord(trace_id, self._id(), parent_id, name, start, end, attributes or {})
            if links:
                record.links = [(trace_id, links)]
            spans.append(record)
            return record

        # the API server: tokenize, then dispatch to the scheduler
        tok_thread = span(f"Tokenizer (host:{self.host_id[:8]} | pid:{self.tokenizer_pid})", root_id, created, recv,
                          {sc.SGLANG_HOST_ID: self.host_id, sc.SGLANG_PID: self.tokenizer_pid,
                           sc.SGLANG_THREAD_LABEL: "Tokenizer"})
        tokenize = span("tokenize", tok_thread.span_id, created, tokenized)
        span("dispatch", tok_thread.span_id, tokenized, recv, links=tokenize.span_id)
        # the scheduler
        sched_thread = span(f"Scheduler [TP 0] (host:{self.host_id[:8]} | pid:{self.scheduler_pid})", root_id, recv,
                            finished, {sc.SGLANG_TP_RANK: 0, sc.SGLANG_HOST_ID: self.host_id,
                                       sc.SGLANG_PID: self.scheduler_pid, sc.SGLANG_THREAD_LABEL: "Scheduler"})
        queued = min(recv + 50_000, scheduled)
        process = span("request_process", sched_thread.span_id, recv, queued)
        waiting = span("prefill_waiting", sched_thread.span_id, queued, scheduled, links=process.span_id)
        prefill_steps = [s for s in journey.steps if s.prefill_tokens]
        decode_steps = [s for s in journey.steps if not s.prefill_tokens]
        forward = span("prefill_forward", sched_thread.span_id, scheduled, first, links=waiting.span_id)
        previous = 0
        for step in prefill_steps:
            chunk = span("chunked_prefill", forward.span_id, step.start_ns, step.end_ns, links=previous)
            previous = chunk.span_id
            self._schedule(chunk, step)
        last = forward
        if decode_steps:
            decode_start = decode_steps[0].start_ns
            last = span("decode_waiting", sched_thread.span_id, first, decode_start, links=forward.span_id)
            decode = span("decode_forward", sched_thread.span_id, decode_start, finished, links=last.span_id)
            start, previous = first, 0
            for ct, step in enumerate(decode_steps):
                loop = span("decode_loop", decode.span_id, start, step.end_ns, {sc.SGLANG_DECODE_CT: ct},
                            links=previous)
                self._schedule(loop, step)
                start, previous = step.end_ns, loop.span_id
        for t in journey.preempted_ns:
            sched_thread.events.append((sc.SGLANG_EVENT_RETRACT, t, {}))
        sched_thread.events.sort(key=lambda e: e[1])
        attributes: Attributes = {
            sc.SGLANG_RID: rid,
            sc.SGLANG_MODULE: "sglang::request",
            sc.VLLM_USAGE_COMPLETION_TOKENS: seq.num_output_tokens,
            sc.VLLM_USAGE_PROMPT_TOKENS: seq.num_prompt_tokens,
            sc.VLLM_USAGE_CACHED_TOKENS: max(seq.num_cached_tokens, 0),
            sc.REQUEST_ID: rid,
            sc.REQUEST_MAX_TOKENS: req.max_tokens,
            sc.RESPONSE_MODEL: self.model,
            sc.RESPONSE_FINISH_REASONS: json.dumps([finish_reason(seq)]),
            sc.LATENCY_TIME_TO_FIRST_TOKEN: (first + delay_out - created) / 1e9,
            sc.LATENCY_E2E: (finished + delay_out - created) / 1e9,
            sc.LATENCY_TIME_IN_MODEL_DECODE: (finished - first) / 1e9,
            sc.VLLM_LATENCY_TIME_IN_MODEL_INFERENCE: (finished + delay_out - recv) / 1e9,
            sc.LATENCY_TIME_IN_MODEL_PREFILL: (first + delay_out - recv) / 1e9,
        }
        root = SpanRecord(trace_id, root_id, parent, f"{sc.SGLANG_SPAN_REQUEST_PREFIX}{rid[:8]}", created,
                          finished + delay_out, attributes)
        return [root, *spans]

    def _schedule(self, slice_span: SpanRecord, step: StepSeen) -> None:
        slice_span.events.append((sc.SGLANG_EVENT_SCHEDULE, step.start_ns, {
            "bid": self._bid(step.batch), "batch_size": step.batch_size,
            "forward_mode": "prefill" if step.has_prefill else "decode"}))

    def close(self) -> None:
        self.out.close()
