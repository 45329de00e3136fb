"""Turns what the engine reports into OpenTelemetry spans with explicit timestamps.

Per request, one trace (or the caller's, when a gateway propagated its context): `llm_request` with
`queue`, `prefill` (one per prefill episode, chunks as events) and `decode` children, carrying vLLM's
`gen_ai.latency.*` attributes. Per engine step, or per run of decode-only steps with unchanged membership,
one `engine_step` span in a trace of its own, from which every token time is derivable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infertrace import semconv as sc
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.sequence import Sequence
from reference_engine.telemetry.otlp import (
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    Attributes,
    SpanRecord,
    SpanSink,
)

if TYPE_CHECKING:
    from reference_engine.engine.llm_engine import StepReport


def engine_resource(config: EngineConfig, executor: str = "simulated",
                    kind: str = "engine") -> Attributes:
    resource: Attributes = {
        sc.SERVICE_NAME: "llm-engine",
        sc.SERVICE_INSTANCE_ID: config.instance_id,
        sc.COMPONENT_KIND: kind,
        sc.HARDWARE: config.hardware,
        sc.HARDWARE_COUNT: config.tensor_parallel,
        sc.CLOUD_REGION: config.region,
        sc.ENGINE_MODEL: config.model,
        sc.ENGINE_POLICY: config.policy,
        sc.ENGINE_MAX_NUM_BATCHED_TOKENS: config.max_num_batched_tokens,
        sc.ENGINE_MAX_NUM_SEQS: config.max_num_seqs,
        sc.ENGINE_CHUNKED_PREFILL: config.chunked_prefill,
        sc.ENGINE_PREFIX_CACHING: config.enable_prefix_caching,
        sc.ENGINE_PREFILL_MICROBATCH: config.prefill_microbatch,
        sc.ENGINE_BLOCK_SIZE: config.block_size,
        sc.ENGINE_EXECUTOR: executor,
    }
    if config.host_expert_layers():
        resource[sc.ENGINE_CPU_MOE_LAYERS] = len(config.host_expert_layers())
    if not config.cuda_graphs:
        resource[sc.ENGINE_CUDA_GRAPHS] = False
    host_blocks, remote_blocks = config.kv_tier_blocks()
    if host_blocks:
        resource[sc.ENGINE_KV_HOST_TIER_BLOCKS] = host_blocks
    if remote_blocks:
        resource[sc.ENGINE_KV_REMOTE_TIER_BLOCKS] = remote_blocks
    if config.kv_reuse_accounting or host_blocks or remote_blocks:  # a tier always counts its evictions
        resource[sc.ENGINE_KV_REUSE_ACCOUNTING] = True
    return resource


@dataclass(slots=True)
class _PrefillEpisode:
    start_ns: int
    end_ns: int = 0
    chunks: list[tuple[str, int, Attributes]] = field(default_factory=list)
    kv_hit: Attributes | None = None  # where its cached prefix came from (engines with KV tiers)


class EngineTracer:
    def __init__(self, sink: SpanSink, resource: Attributes, seed: int = 0, batch_size: int = 2048) -> None:
        self.sink = sink
        self.resource = resource
        self.batch_size = batch_size
        self._rng = random.Random(seed)
        self._pending: list[SpanRecord] = []
        self._episodes: dict[str, list[_PrefillEpisode]] = {}
        self._preemptions: dict[str, list[int]] = {}

    def _id(self, bits: int) -> int:
        return self._rng.getrandbits(bits) or 1

    def _emit(self, span: SpanRecord) -> None:
        self._pending.append(span)
        if len(self._pending) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self.sink.export(self.resource, self._pending)
            self._pending = []

    # -------------------------------------------------------------------------------------- steps
    def on_step(self, report: StepReport) -> None:
        batch = report.batch
        end_ns = report.end_ns
        for seq in batch.preempted:
            self._preemptions.setdefault(seq.request_id, []).append(report.start_ns)
            open_episodes = self._episodes.get(seq.request_id)
            if open_episodes and not open_episodes[-1].end_ns:
                open_episodes[-1].end_ns = report.start_ns
        prefill_ids, chunk_tokens, computed, samples = [], [], [], []
        hits = {seq.request_id: hit for seq, hit in batch.kv_hits} if batch.kv_hits is not None else None
        for seq, chunk in batch.prefills:
            before = seq.num_computed_tokens - chunk
            done = not seq.is_prefilling
            prefill_ids.append(seq.request_id)
            chunk_tokens.append(chunk)
            computed.append(before)
            samples.append(done)
            episodes = self._episodes.setdefault(seq.request_id, [])
            if not episodes or episodes[-1].end_ns:
                episodes.append(_PrefillEpisode(report.start_ns))
                if hits is not None and seq.request_id in hits:
                    hit = hits[seq.request_id]
                    episodes[-1].kv_hit = {
                        sc.PREFILL_KV_DEVICE_TOKENS: hit.device_tokens, sc.PREFILL_KV_HOST_TOKENS: hit.host_tokens,
                        sc.PREFILL_KV_REMOTE_TOKENS: hit.remote_tokens,
                        sc.PREFILL_KV_EVICTED_TOKENS: hit.evicted_tokens,
                        sc.PREFILL_KV_EVICTED_REUSE_BLOCKS: hit.evicted_reuse_blocks}
            episodes[-1].chunks.append((sc.EVENT_PREFILL_CHUNK, end_ns, {
                sc.CHUNK_TOKENS: chunk, sc.CHUNK_CACHED_TOKENS: before, sc.CHUNK_STEP_INDEX: report.index}))
            if done:
                episodes[-1].end_ns = end_ns
        steps = len(report.durations)
        decode_ctx = sum(s.num_computed_tokens - steps + 1 for s in batch.decodes)
        attributes: Attributes = {
            sc.STEP_INDEX: report.index,
            sc.STEP_COUNT: steps,
            sc.STEP_DURATIONS_NS: report.durations.tolist(),
            sc.STEP_PREFILL_TOKENS: sum(chunk_tokens),
            sc.STEP_DECODE_TOKENS: len(batch.decodes),
            sc.STEP_DECODE_REQUEST_IDS: [s.request.request_id for s in batch.decodes],
            sc.STEP_DECODE_CONTEXT_TOKENS: decode_ctx,
            sc.STEP_RUNNING: report.num_running,
            sc.STEP_WAITING: report.num_waiting,
            sc.STEP_KV_USED_BLOCKS: report.kv_used_blocks,
            sc.STEP_KV_TOTAL_BLOCKS: report.kv_total_blocks,
        }
        if prefill_ids:
            attributes[sc.STEP_PREFILL_REQUEST_IDS] = prefill_ids
            attributes[sc.STEP_PREFILL_CHUNK_TOKENS] = chunk_tokens
            attributes[sc.STEP_PREFILL_COMPUTED_TOKENS] = computed
            attributes[sc.STEP_PREFILL_SAMPLES_TOKEN] = samples
        if batch.preempted:
            attributes[sc.STEP_PREEMPTED_REQUEST_IDS] = [s.request_id for s in batch.preempted]
        if report.pause_ns:
            attributes[sc.STEP_PAUSE_NS] = report.pause_ns
        if report.offload is not None:
            o = report.offload
            attributes[sc.STEP_OFFLOAD_HOST_LINK_BYTES] = o.host_link_bytes
            attributes[sc.STEP_OFFLOAD_TRANSFER_NS] = round(o.transfer_s * 1e9)
            attributes[sc.STEP_OFFLOAD_HOST_COMPUTE_NS] = round(o.host_compute_s * 1e9)
            attributes[sc.STEP_OFFLOAD_STREAMED_MICROBATCHES] = o.streamed_microbatches
            attributes[sc.STEP_OFFLOAD_HOST_MICROBATCHES] = o.host_microbatches
        if report.kv_load is not None:
            host, remote, seconds = report.kv_load
            attributes[sc.STEP_KV_LOAD_HOST_TOKENS] = host
            attributes[sc.STEP_KV_LOAD_REMOTE_TOKENS] = remote
            attributes[sc.STEP_KV_LOAD_NS] = round(seconds * 1e9)
        self._emit(SpanRecord(self._id(128), self._id(64), 0, sc.SPAN_STEP, report.start_ns, end_ns, attributes))

    # ------------------------------------------------------------------------------------ requests
    def on_finish(self, seq: Sequence) -> None:
        req = seq.request
        rid = req.request_id
        episodes = self._episodes.pop(rid, [])
        preemptions = self._preemptions.pop(rid, [])
        trace_id, parent = req.trace_parent or (self._id(128), 0)
        request_span = self._id(64)
        end_ns = seq.finish_ns if seq.finish_ns is not None else req.arrival_ns
        common = {sc.REQUEST_ID: rid}

        def child(name: str, start: int, end: int, **extra: object) -> SpanRecord:
            return SpanRecord(trace_id, self._id(64), request_span, name, start, end, {**common, **extra})

        attributes: Attributes = {
            sc.OPERATION_NAME: "text_completion",
            sc.PROVIDER_NAME: "infertrace",
            sc.REQUEST_MODEL: req.model or self.resource.get(sc.ENGINE_MODEL, ""),
            sc.RESPONSE_MODEL: self.resource.get(sc.ENGINE_MODEL, ""),
            sc.REQUEST_ID: rid,
            sc.REQUEST_MAX_TOKENS: req.max_tokens,
            sc.TENANT_ID: req.tenant,
            sc.USAGE_INPUT_TOKENS: seq.num_prompt_tokens,
            sc.USAGE_OUTPUT_TOKENS: seq.num_output_tokens,
            sc.USAGE_CACHE_READ_INPUT_TOKENS: max(seq.num_cached_tokens, 0),
            sc.ASSISTANT_PREFILL_TOKENS: req.assistant_prefill_tokens,
            sc.PREEMPTIONS: seq.preemptions,
            sc.PREFILL_CHUNKS: seq.num_prefill_chunks,
        }
        if req.system_prompt_id is not None:
            attributes[sc.SYSTEM_PROMPT_ID] = req.system_prompt_id
            attributes[sc.SYSTEM_PROMPT_TOKENS] = req.system_prompt_tokens
        events = [(sc.EVENT_PREEMPTED, t, {}) for t in preemptions]
        spans: list[SpanRecord] = []
        if seq.error is not None:
            attributes[sc.RESPONSE_FINISH_REASONS] = ["error"]
            attributes[sc.ERROR_TYPE] = seq.error
        else:
            arrival, scheduled = req.arrival_ns, seq.first_scheduled_ns or req.arrival_ns
            first, finish = seq.first_token_ns or end_ns, end_ns
            finished_by_length = seq.num_output_tokens >= req.max_tokens
            attributes[sc.RESPONSE_FINISH_REASONS] = ["length" if finished_by_length else "stop"]
            attributes[sc.LATENCY_TIME_IN_QUEUE] = (scheduled - arrival) / 1e9
            attributes[sc.LATENCY_TIME_TO_FIRST_TOKEN] = (first - arrival) / 1e9
            attributes[sc.LATENCY_TIME_IN_MODEL_PREFILL] = (first - scheduled) / 1e9
            attributes[sc.LATENCY_TIME_IN_MODEL_DECODE] = (finish - first) / 1e9
            attributes[sc.LATENCY_E2E] = (finish - arrival) / 1e9
            events.append((sc.EVENT_FIRST_TOKEN, first, {}))
            spans.append(child(sc.SPAN_QUEUE, arrival, scheduled))
            for episode in episodes:
                span = child(sc.SPAN_PREFILL, episode.start_ns, episode.end_ns or end_ns,
                             **{sc.PREFILL_CHUNKS: len(episode.chunks), **(episode.kv_hit or {})})
                span.events = episode.chunks
                spans.append(span)
            if seq.num_output_tokens > 1:
                spans.append(child(sc.SPAN_DECODE, first, finish))
        events.sort(key=lambda e: e[1])
        root = SpanRecord(trace_id, request_span, parent, sc.SPAN_REQUEST, req.arrival_ns, end_ns, attributes,
                          kind=SPAN_KIND_SERVER, events=events)
        if seq.error is not None:
            root.status_code, root.status_message = STATUS_ERROR, seq.error
        self._emit(root)
        for span in spans:
            self._emit(span)

    def close(self) -> None:
        self.flush()
