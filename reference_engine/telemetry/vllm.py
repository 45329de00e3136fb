"""vLLM's telemetry, emulated: exactly the `llm_request` span vLLM exports per request (nothing per step), with
vLLM's own clocks, and the iteration-detail log lines of `--enable-logging-iteration-details`.

What vLLM emits, read from vllm-project/vllm (infertrace/sources/vllm.py cites file and commit):

- V1 (`OutputProcessor.do_tracing`, vllm/v1/engine/output_processor.py): one `llm_request` span (SERVER), made when
  the request finishes in the API-server process. It starts at the frontend's arrival time and ends when it is
  made. `time_to_first_token` and `e2e` are frontend wall-clock; `time_in_queue` (scheduled − queued),
  `time_in_model_prefill`, `_decode` and `_inference` are engine-core monotonic durations. No response model, no
  cached tokens; `gen_ai.response.finish_reasons` is `json.dumps([...])`, a string. `top_p`, `max_tokens`,
  `temperature` and `n` only when truthy. The resource is `Resource.create` of `vllm.instrumenting_module_name` and
  `vllm.process_id` (a string): `service.name` only from OTEL_SERVICE_NAME, `service.instance.id` only from
  OTEL_RESOURCE_ATTRIBUTES.
- V0 (`LLMEngine.create_trace_span`, vllm/engine/llm_engine.py): one `llm_request` span per finished request, all
  on one wall clock: response model (the `--model` value), request id, temperature, top_p, max_tokens, n,
  num_sequences, prompt and completion tokens, time_in_queue, time_to_first_token, e2e, time_in_scheduler. No
  finish reasons. The provider is `TracerProvider()`: the SDK's default resource.

Requests vLLM rejects at input validation (e.g. a prompt longer than the model's context) get no span.

The simulated engine is vLLM V1's engine core: its arrival is the core's `queued_ts`. The API server received the
request `frontend_in` earlier (tokenisation, IPC) and learns of each output `frontend_out` later; both are drawn per
request (a few milliseconds, see `FrontendLatency`).
"""

from __future__ import annotations

import bisect
import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from infertrace import semconv as sc
from reference_engine.telemetry.buffer import SpanBuffer
from reference_engine.telemetry.frontend import SDK_RESOURCE, FrontendLatency, finish_reason
from reference_engine.telemetry.otlp import SPAN_KIND_SERVER, Attributes, SpanRecord, SpanSink

if TYPE_CHECKING:
    from reference_engine.engine.llm_engine import StepReport
    from reference_engine.engine.sequence import Sequence

V1_SCOPE = "vllm.tracing.otel"  # manual_instrument_otel: trace.get_tracer(__name__)
V0_SCOPE = "vllm.llm_engine"  # init_tracer("vllm.llm_engine", ...)


def vllm_resource(version: str, service_name: str, pid: int, instance_id: str | None = None) -> Attributes:
    """What vLLM's tracer provider puts in the resource, for a server started with OTEL_SERVICE_NAME set (and
    OTEL_RESOURCE_ATTRIBUTES=service.instance.id=… when `instance_id` is given)."""
    resource: Attributes = {**SDK_RESOURCE, sc.SERVICE_NAME: service_name}
    if version == "v1":
        resource[sc.VLLM_RES_MODULE] = "vllm.llm_engine"
        resource[sc.VLLM_RES_PROCESS_ID] = str(pid)
    if instance_id is not None:
        resource[sc.SERVICE_INSTANCE_ID] = instance_id
    return resource


class VllmTracer:
    """One `llm_request` span per finished request, as vLLM `version` ("v1" or "v0") makes it."""

    def __init__(self, sink: SpanSink, resource: Attributes, version: str, model: str, seed: int = 0,
                 batch_size: int = 2048) -> None:
        if version not in ("v1", "v0"):
            raise ValueError(f"vLLM version must be v1 or v0, got {version!r}")
        self.version, self.model = version, model
        self.out = SpanBuffer(sink, resource, V1_SCOPE if version == "v1" else V0_SCOPE, batch_size)
        self._rng = random.Random(f"vllm-{seed}")
        self.frontend = FrontendLatency(rng=random.Random(f"vllm-frontend-{seed}"))

    def _id(self, bits: int) -> int:
        return self._rng.getrandbits(bits) or 1

    def on_step(self, report: StepReport) -> None:
        pass

    def on_finish(self, seq: Sequence) -> None:
        if seq.error is not None or seq.first_token_ns is None:
            return  # rejected at validation: vLLM answers 400 and makes no span
        self.out.emit(self._v1(seq) if self.version == "v1" else self._v0(seq))

    def _v1(self, seq: Sequence) -> SpanRecord:
        req = seq.request
        delay_in, delay_out = self.frontend.draw()
        queued, scheduled = req.arrival_ns, seq.first_scheduled_ns or req.arrival_ns
        first, last = seq.first_token_ns or queued, seq.finish_ns or queued
        arrival = queued - delay_in  # RequestStateStats.arrival_time: the API server's time.time()
        attributes: Attributes = {
            sc.LATENCY_TIME_TO_FIRST_TOKEN: (first + delay_out - arrival) / 1e9,
            sc.LATENCY_E2E: (last + delay_out - arrival) / 1e9,
            sc.LATENCY_TIME_IN_QUEUE: (scheduled - queued) / 1e9,
            sc.VLLM_USAGE_PROMPT_TOKENS: seq.num_prompt_tokens,
            sc.VLLM_USAGE_COMPLETION_TOKENS: seq.num_output_tokens,
            sc.LATENCY_TIME_IN_MODEL_PREFILL: (first - scheduled) / 1e9,
            sc.LATENCY_TIME_IN_MODEL_DECODE: (last - first) / 1e9,
            sc.VLLM_LATENCY_TIME_IN_MODEL_INFERENCE: (last - scheduled) / 1e9,
            sc.REQUEST_ID: req.request_id,
            sc.RESPONSE_FINISH_REASONS: json.dumps([finish_reason(seq)]),
            sc.VLLM_REQUEST_TOP_P: 1.0,
            sc.REQUEST_MAX_TOKENS: req.max_tokens,
            sc.VLLM_REQUEST_N: 1,
        }
        trace_id, parent = req.trace_parent or (self._id(128), 0)
        return SpanRecord(trace_id, self._id(64), parent, sc.SPAN_REQUEST, arrival, last + delay_out, attributes,
                          kind=SPAN_KIND_SERVER)

    def _v0(self, seq: Sequence) -> SpanRecord:
        req = seq.request
        arrival, scheduled = req.arrival_ns, seq.first_scheduled_ns or req.arrival_ns
        first, last = seq.first_token_ns or arrival, seq.finish_ns or arrival
        attributes: Attributes = {
            sc.RESPONSE_MODEL: self.model,
            sc.REQUEST_ID: req.request_id,
            sc.VLLM_REQUEST_TEMPERATURE: 0.0,
            sc.VLLM_REQUEST_TOP_P: 1.0,
            sc.REQUEST_MAX_TOKENS: req.max_tokens,
            sc.VLLM_REQUEST_N: 1,
            sc.VLLM_USAGE_NUM_SEQUENCES: 1,
            sc.VLLM_USAGE_PROMPT_TOKENS: seq.num_prompt_tokens,
            sc.VLLM_USAGE_COMPLETION_TOKENS: seq.num_output_tokens,
            sc.LATENCY_TIME_IN_QUEUE: (scheduled - arrival) / 1e9,
            sc.LATENCY_TIME_TO_FIRST_TOKEN: (first - arrival) / 1e9,
            sc.LATENCY_E2E: (last - arrival) / 1e9,
            sc.VLLM_LATENCY_TIME_IN_SCHEDULER: round(self._rng.uniform(0.2, 1.0) * seq.num_output_tokens) / 1e6,
        }
        trace_id, parent = req.trace_parent or (self._id(128), 0)
        # The span is made (and ended) by do_tracing right after the step that finished the request.
        return SpanRecord(trace_id, self._id(64), parent, sc.SPAN_REQUEST, arrival, last, attributes,
                          kind=SPAN_KIND_SERVER)

    def close(self) -> None:
        self.out.close()


# ------------------------------------------------------------------------------------------ iteration log
@dataclass(slots=True)
class _Iteration:
    end_ns: int
    ctx_requests: int
    ctx_tokens: int
    gen_requests: int
    gen_tokens: int
    elapsed_ns: int
    dummy: bool = False


class IterationLog:
    """vLLM V1's `--enable-logging-iteration-details` lines of one engine core (`EngineCore.log_iteration_details`):

        (EngineCore_DP0 pid=2378) INFO 01-15 10:23:45 [core.py:397] Iteration(17): 1 context requests, 2048
        context tokens, 12 generation requests, 12 generation tokens, iteration elapsed time: 61.50 ms

    (one line). The timer starts after the step was scheduled and handed to the executor and stops when its result
    is in, so `elapsed` is the step less the scheduler's own CPU time (drawn, 0.1–0.4 ms). The time stamp is the
    logging process's local wall clock (UTC here) in whole seconds. Engines of one model form a data-parallel
    group (`rank` = DP rank): a rank with nothing to run while another steps runs a dummy batch, logged with
    zero counts and ` (dummy)` (`IterationLogGroup`)."""

    def __init__(self, rank: int, pid: int, seed: int = 0) -> None:
        self.rank, self.pid = rank, pid
        self._rng = random.Random(f"iterations-{seed}-{rank}")
        self.iterations: list[_Iteration] = []

    def on_step(self, report: StepReport) -> None:
        batch = report.batch
        ctx_requests = len(batch.prefills)
        ctx_tokens = sum(n for _, n in batch.prefills)
        gen = len(batch.decodes)
        ends = report.start_ns + report.durations.cumsum()
        for duration, end in zip(report.durations.tolist(), ends.tolist(), strict=True):
            scheduling = round(self._rng.uniform(0.1, 0.4) * 1e6)
            self.iterations.append(_Iteration(int(end), ctx_requests, ctx_tokens, gen, gen,
                                              max(int(duration) - scheduling, 0)))

    def on_finish(self, seq: Sequence) -> None:
        pass

    def dummy(self, end_ns: int) -> _Iteration:
        """The dummy batch a DP rank with nothing to run executes while another rank steps (a fraction of a ms)."""
        return _Iteration(end_ns, 0, 0, 0, 0, round(self._rng.uniform(0.05, 0.2) * 1e6), True)

    def lines(self) -> list[str]:
        return [_line(self.rank, self.pid, i, it) for i, it in enumerate(sorted(self.iterations,
                                                                                 key=lambda x: x.end_ns))]


class IterationLogGroup:
    """The iteration logs of one model's engines, a data-parallel group: each rank's log gets a dummy iteration
    at every step of another rank during which it had nothing to run. Written as `<dir>/<instance>.log`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.members: dict[str, list[tuple[str, IterationLog]]] = {}  # model -> [(instance, log)]

    def add(self, model: str, instance: str, pid: int, seed: int) -> IterationLog:
        group = self.members.setdefault(model, [])
        log = IterationLog(len(group), pid, seed)
        group.append((instance, log))
        return log

    def close(self) -> list[Path]:
        self.directory.mkdir(parents=True, exist_ok=True)
        written = []
        for group in self.members.values():
            for instance, log in group:
                busy = sorted((it.end_ns - it.elapsed_ns, it.end_ns) for it in log.iterations)
                others = sorted({it.end_ns for _, other in group if other is not log for it in other.iterations})
                log.iterations += [log.dummy(t) for t in others if not _covered(busy, t)]
                path = self.directory / f"{instance}.log"
                path.write_text("".join(line + "\n" for line in log.lines()), encoding="utf-8")
                written.append(path)
        return written


def _covered(intervals: list[tuple[int, int]], t: int) -> bool:
    """Whether t falls in one of the sorted (start, end) intervals."""
    i = bisect.bisect_right(intervals, (t, 1 << 62)) - 1
    return i >= 0 and intervals[i][0] <= t <= intervals[i][1]


def _line(rank: int, pid: int, index: int, it: _Iteration) -> str:
    stamp = datetime.fromtimestamp(it.end_ns // 10**9, UTC).strftime("%m-%d %H:%M:%S")
    return (f"(EngineCore_DP{rank} pid={pid}) INFO {stamp} [core.py:397] Iteration({index}): {it.ctx_requests} "
            f"context requests, {it.ctx_tokens} context tokens, {it.gen_requests} generation requests, "
            f"{it.gen_tokens} generation tokens, iteration elapsed time: {it.elapsed_ns / 1e6:.2f} ms"
            + (" (dummy)" if it.dummy else ""))
