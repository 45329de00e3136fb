"""Turns what the engine reports into OpenTelemetry spans with explicit timestamps.

Per request, one trace (or the caller's, when a gateway propagated its context): `llm_request` with
`queue`, `prefill` (one per prefill episode, chunks as events) and `decode` children, carrying vLLM's
`gen_ai.latency.*` attributes. Per engine step, or per run of decode-only steps with unchanged membership,
one `engine_step` span in a trace of its own, from which every token time is derivable.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from infertrace import semconv as sc
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.sequence import Sequence
from reference_engine.telemetry.otlp import (
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    Attributes,
    SpanRecord,
    SpanSink,
    attributes_format,
    encode_array,
    encode_attribute_values,
    encode_span,
    event_format,
    span_format,
    string_attribute,
)

if TYPE_CHECKING:
    from reference_engine.engine.llm_engine import StepReport
    from reference_engine.stats import Summary


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


class StepFacts(NamedTuple):
    """What one engine step (or run of decode steps) did, in plain values: all the tracer reads of a step."""

    index: int  # of the first step
    start_ns: int
    end_ns: int
    durations: list[int]  # ns, one per step
    decode_ids: list[str]  # requests that got a token at every step
    decode_context_tokens: int  # Σ context of the decoding requests at the first step
    prefills: list[tuple[str, int, int, bool]]  # request id, chunk tokens, tokens computed before, samples a token
    preempted_ids: list[str]
    running: int
    waiting: int
    kv_used_blocks: int
    kv_total_blocks: int
    pause_ns: int
    kv_hits: dict[str, tuple[int, int, int, int, int]] | None  # engines with KV tiers: where each newly admitted
    # prompt's cached prefix was found (request id -> device, host, remote, evicted tokens, evicted reuse blocks)
    offload: tuple[int, int, int, int, int] | None  # offloaded experts, per step: host-link bytes, transfer ns,
    # host compute ns, streamed micro-batches, host micro-batches
    kv_load: tuple[int, int, int] | None  # KV copied back from tiers: host tokens, remote tokens, ns


class RequestFacts(NamedTuple):
    """A request that ended, in plain values: all the tracer reads of it."""

    request_id: str
    model: str
    tenant: str
    max_tokens: int
    arrival_ns: int
    trace_parent: tuple[int, int] | None
    system_prompt_id: str | None
    system_prompt_tokens: int
    assistant_prefill_tokens: int
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int  # -1: never admitted
    preemptions: int
    prefill_chunks: int
    error: str | None
    first_scheduled_ns: int | None
    first_token_ns: int | None
    finish_ns: int | None


_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__: these are made per step


def step_facts(report: StepReport) -> StepFacts:
    batch = report.batch
    return _new_tuple(StepFacts, (
        report.index, report.start_ns, report.end_ns, report.durations.tolist(),
        [s.request.request_id for s in batch.decodes],
        batch.decode_context,  # Σ context of the decodes at the first step
        [(s.request.request_id, chunk, s.num_computed_tokens - chunk, s.num_computed_tokens >= s.prefill_target)
         for s, chunk in batch.prefills],
        [s.request.request_id for s in batch.preempted], report.num_running, report.num_waiting,
        report.kv_used_blocks, report.kv_total_blocks, report.pause_ns, *rare_step_facts(report)))


def rare_step_facts(report: StepReport) -> tuple[dict[str, tuple[int, int, int, int, int]] | None,
                                                  tuple[int, int, int, int, int] | None, tuple[int, int, int] | None]:
    """The last three `StepFacts`, which only engines with KV tiers or offloaded experts have (`kv_hits`,
    `offload`, `kv_load`)."""
    batch = report.batch
    return (
        {s.request.request_id: (h.device_tokens, h.host_tokens, h.remote_tokens, h.evicted_tokens,
                                h.evicted_reuse_blocks) for s, h in batch.kv_hits}
        if batch.kv_hits is not None else None,
        None if (o := report.offload) is None else (
            o.host_link_bytes, round(o.transfer_s * 1e9), round(o.host_compute_s * 1e9), o.streamed_microbatches,
            o.host_microbatches),
        None if (k := report.kv_load) is None else (k[0], k[1], round(k[2] * 1e9)))


def request_facts(seq: Sequence) -> RequestFacts:
    r = seq.request
    return _new_tuple(RequestFacts, (
        r.request_id, r.model, r.tenant, r.max_tokens, r.arrival_ns, r.trace_parent, r.system_prompt_id,
        r.system_prompt_tokens, r.assistant_prefill_tokens, seq.num_prompt_tokens, seq.num_output_tokens,
        seq.num_cached_tokens, seq.preemptions, seq.num_prefill_chunks, seq.error, seq.first_scheduled_ns,
        seq.first_token_ns, seq.finish_ns))


# An engine_step span's attributes, in groups that are there or not together, each of one shape (ints, arrays):
# `step_attribute_values` gives which groups a step has and their values.
_STEP_GROUPS: tuple[tuple[tuple[str, type], ...], ...] = (
    ((sc.STEP_INDEX, int), (sc.STEP_COUNT, int), (sc.STEP_DURATIONS_NS, list), (sc.STEP_PREFILL_TOKENS, int),
     (sc.STEP_DECODE_TOKENS, int), (sc.STEP_DECODE_REQUEST_IDS, list), (sc.STEP_DECODE_CONTEXT_TOKENS, int),
     (sc.STEP_RUNNING, int), (sc.STEP_WAITING, int), (sc.STEP_KV_USED_BLOCKS, int), (sc.STEP_KV_TOTAL_BLOCKS, int)),
    ((sc.STEP_PREFILL_REQUEST_IDS, list), (sc.STEP_PREFILL_CHUNK_TOKENS, list),
     (sc.STEP_PREFILL_COMPUTED_TOKENS, list), (sc.STEP_PREFILL_SAMPLES_TOKEN, list)),
    ((sc.STEP_PREEMPTED_REQUEST_IDS, list),),
    ((sc.STEP_PAUSE_NS, int),),
    ((sc.STEP_OFFLOAD_HOST_LINK_BYTES, int), (sc.STEP_OFFLOAD_TRANSFER_NS, int),
     (sc.STEP_OFFLOAD_HOST_COMPUTE_NS, int), (sc.STEP_OFFLOAD_STREAMED_MICROBATCHES, int),
     (sc.STEP_OFFLOAD_HOST_MICROBATCHES, int)),
    ((sc.STEP_KV_LOAD_HOST_TOKENS, int), (sc.STEP_KV_LOAD_REMOTE_TOKENS, int), (sc.STEP_KV_LOAD_NS, int)),
)


def step_attribute_values(step: StepFacts, array: Any = list) -> tuple[int, tuple[Any, ...]]:
    """Which optional groups of `_STEP_GROUPS` an engine_step span has (bit g-1 set: group g there; the index of
    `_STEP_SPANS` and `_STEP_SPAN_KEYS`) and the values of its attributes, every present group's in order; each
    array as `array(values)` (`encode_array`: ready for the groups' formats)."""
    prefills, durations, decode_ids = step.prefills, step.durations, step.decode_ids
    values: tuple[Any, ...] = (
        step.index, len(durations), array(durations), sum([chunk for _, chunk, _, _ in prefills]), len(decode_ids),
        array(decode_ids), step.decode_context_tokens, step.running, step.waiting, step.kv_used_blocks,
        step.kv_total_blocks)
    present = 0
    if prefills:
        values += tuple([array(list(column)) for column in zip(*prefills, strict=True)])
        present = 1
    if step.preempted_ids:
        values += (array(step.preempted_ids),)
        present |= 2
    if step.pause_ns:
        values += (step.pause_ns,)
        present |= 4
    if step.offload is not None:
        values += step.offload
        present |= 8
    if step.kv_load is not None:
        values += step.kv_load
        present |= 16
    return present, values


_STEP_KEYS = tuple(tuple(key for key, _ in group) for group in _STEP_GROUPS)
_STEP_FORMATS = tuple(attributes_format(keys, [kind for _, kind in group])
                      for keys, group in zip(_STEP_KEYS, _STEP_GROUPS, strict=True))


def _step_groups(present: int) -> list[int]:
    """The groups of `_STEP_GROUPS` an engine_step span with optional groups `present` has, in order."""
    return [0, *(g for g in range(1, len(_STEP_GROUPS)) if present >> (g - 1) & 1)]


_STEP_PRESENCES = range(1 << (len(_STEP_GROUPS) - 1))
# For each combination of the optional groups: the span's attribute keys, and the span with its attributes in
# place (one `%` of its ids, times and `step_attribute_values`).
_STEP_SPAN_KEYS = tuple(tuple(key for g in _step_groups(present) for key in _STEP_KEYS[g])
                        for present in _STEP_PRESENCES)
_STEP_SPANS = tuple(span_format(sc.SPAN_STEP, attributes=",".join([_STEP_FORMATS[g] for g in _step_groups(present)]))
                    for present in _STEP_PRESENCES)
_QUEUE_SPAN, _DECODE_SPAN = span_format(sc.SPAN_QUEUE, parent=True), span_format(sc.SPAN_DECODE, parent=True)
_PREFILL_SPAN = span_format(sc.SPAN_PREFILL, parent=True, events=True)
_KV_HIT_KEYS = (sc.PREFILL_KV_DEVICE_TOKENS, sc.PREFILL_KV_HOST_TOKENS, sc.PREFILL_KV_REMOTE_TOKENS,
                sc.PREFILL_KV_EVICTED_TOKENS, sc.PREFILL_KV_EVICTED_REUSE_BLOCKS)
_PREFILL_ATTRIBUTES = attributes_format((sc.PREFILL_CHUNKS,), (int,))
_PREFILL_KV_HIT_ATTRIBUTES = attributes_format((sc.PREFILL_CHUNKS, *_KV_HIT_KEYS), (int,) * 6)
_CHUNK_KEYS = (sc.CHUNK_TOKENS, sc.CHUNK_CACHED_TOKENS, sc.CHUNK_STEP_INDEX)
_CHUNK_EVENT = event_format(sc.EVENT_PREFILL_CHUNK, _CHUNK_KEYS)
# An llm_request span's attribute keys, in order: the facts, the system prompt's (when it has one), then how it ended.
_REQUEST_KEYS = (sc.OPERATION_NAME, sc.PROVIDER_NAME, sc.REQUEST_MODEL, sc.RESPONSE_MODEL, sc.REQUEST_ID,
                 sc.REQUEST_MAX_TOKENS, sc.TENANT_ID, sc.USAGE_INPUT_TOKENS, sc.USAGE_OUTPUT_TOKENS,
                 sc.USAGE_CACHE_READ_INPUT_TOKENS, sc.ASSISTANT_PREFILL_TOKENS, sc.PREEMPTIONS, sc.PREFILL_CHUNKS)
_REQUEST_SYSTEM_PROMPT_KEYS = (*_REQUEST_KEYS, sc.SYSTEM_PROMPT_ID, sc.SYSTEM_PROMPT_TOKENS)
_LATENCY_KEYS = (sc.RESPONSE_FINISH_REASONS, sc.LATENCY_TIME_IN_QUEUE, sc.LATENCY_TIME_TO_FIRST_TOKEN,
                 sc.LATENCY_TIME_IN_MODEL_PREFILL, sc.LATENCY_TIME_IN_MODEL_DECODE, sc.LATENCY_E2E)
_REQUEST_SPAN = span_format(sc.SPAN_REQUEST, SPAN_KIND_SERVER, events=True)
_REQUEST_SPAN_WITH_PARENT = span_format(sc.SPAN_REQUEST, SPAN_KIND_SERVER, parent=True, events=True)
_PREEMPTED_EVENT, _FIRST_TOKEN_EVENT = event_format(sc.EVENT_PREEMPTED, ()), event_format(sc.EVENT_FIRST_TOKEN, ())
_time = itemgetter(0)


@dataclass(slots=True)
class _PrefillEpisode:
    start_ns: int
    end_ns: int = 0
    chunks: list[tuple[int, int, int, int]] = field(default_factory=list)  # time ns, tokens, cached tokens, step
    kv_hit: tuple[int, int, int, int, int] | None = None  # where its cached prefix came from (engines with KV tiers)


class EngineTracer:
    """An engine observer: each step report becomes an `engine_step` span (`add_step`), each ended request its
    `llm_request` span and children (`add_request`), both from plain facts (`step_facts`, `request_facts`)."""

    def __init__(self, sink: SpanSink, resource: Attributes, seed: int = 0, batch_size: int = 2048,
                 summarize: bool = False) -> None:
        self.sink = sink
        self.resource = resource
        self.batch_size = batch_size
        self._rng = random.Random(seed)
        self._random_bits = self._rng.getrandbits
        # A sink that writes OTLP JSON (`export_encoded`) gets spans encoded as they are made, steps straight from
        # their facts; any other gets `SpanRecord`s.
        self._encoded = hasattr(sink, "export_encoded")
        self._pending: list[SpanRecord | str] = []
        self._episodes: dict[str, list[_PrefillEpisode]] = {}
        self._preemptions: dict[str, list[int]] = {}
        self._model = resource.get(sc.ENGINE_MODEL, "")
        # A sink that builds spans in another process takes the facts instead (telemetry/background.py).
        remote = sink.tracer(resource, seed, batch_size, summarize) if hasattr(sink, "tracer") else None
        if remote is not None:  # the engine hands its reports straight to the recorder: one call per step
            self.on_step = remote.on_step  # type: ignore[method-assign]
            self.on_finish = remote.on_finish  # type: ignore[method-assign]
        self._remote_flush = remote.flush if remote is not None else None
        # With `summarize`, a sink in another process also keeps the simulation's summary statistics from the facts
        # it gets (call after `close`); elsewhere None: the caller keeps its own `SimulationStats`.
        self.summary: Callable[[], Summary] | None = remote.summary if remote is not None and summarize else None

    def _id(self, bits: int) -> int:
        return self._random_bits(bits) or 1

    def _emit(self, span: SpanRecord) -> None:
        self._push(encode_span(span) if self._encoded else span)

    def _push(self, span: SpanRecord | str) -> None:
        self._pending.append(span)
        if len(self._pending) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        if self._remote_flush is not None:
            self._remote_flush()
        elif self._pending:
            if self._encoded:
                self.sink.export_encoded(self.resource, self._pending)  # type: ignore[attr-defined]
            else:
                self.sink.export(self.resource, self._pending)  # type: ignore[arg-type]
            self._pending = []

    def on_step(self, report: StepReport) -> None:
        self.add_step(step_facts(report))

    def on_finish(self, seq: Sequence) -> None:
        self.add_request(request_facts(seq))

    # -------------------------------------------------------------------------------------- steps
    def add_step(self, step: StepFacts) -> None:
        start_ns, end_ns = step.start_ns, step.end_ns
        for rid in step.preempted_ids:
            self._preemptions.setdefault(rid, []).append(start_ns)
            open_episodes = self._episodes.get(rid)
            if open_episodes and not open_episodes[-1].end_ns:
                open_episodes[-1].end_ns = start_ns
        hits = step.kv_hits
        prefills = step.prefills
        for rid, chunk, before, done in prefills:
            episodes = self._episodes.setdefault(rid, [])
            if not episodes or episodes[-1].end_ns:
                episodes.append(_PrefillEpisode(start_ns))
                if hits is not None and rid in hits:
                    episodes[-1].kv_hit = hits[rid]
            episodes[-1].chunks.append((end_ns, chunk, before, step.index))
            if done:
                episodes[-1].end_ns = end_ns
        random_bits = self._random_bits
        trace_id, span_id = random_bits(128) or 1, random_bits(64) or 1  # self._id, inlined: a call per span counts
        if self._encoded:  # straight to JSON in one `%`: no attribute dict, no SpanRecord
            present, values = step_attribute_values(step, encode_array)
            pending = self._pending
            pending.append(_STEP_SPANS[present] % (trace_id, span_id, start_ns, end_ns, *values))
            if len(pending) >= self.batch_size:
                self.flush()
            return
        present, values = step_attribute_values(step)
        record: Attributes = dict(zip(_STEP_SPAN_KEYS[present], values, strict=True))
        self._emit(SpanRecord(trace_id, span_id, 0, sc.SPAN_STEP, start_ns, end_ns, record))

    # ------------------------------------------------------------------------------------ requests
    def add_request(self, req: RequestFacts) -> None:
        rid = req.request_id
        episodes = self._episodes.pop(rid, [])
        preemptions = self._preemptions.pop(rid, [])
        trace_id, parent = req.trace_parent or (self._id(128), 0)
        request_span = self._id(64)
        end_ns = req.finish_ns if req.finish_ns is not None else req.arrival_ns

        encoded = self._encoded
        rid_attribute = string_attribute(sc.REQUEST_ID, rid) if encoded else ""

        def child(name: str, start: int, end: int, **extra: object) -> SpanRecord:
            return SpanRecord(trace_id, self._id(64), request_span, name, start, end, {sc.REQUEST_ID: rid, **extra})

        def prefill(episode: _PrefillEpisode) -> SpanRecord | str:
            end = episode.end_ns or end_ns
            hit = episode.kv_hit
            if encoded:
                attributes = rid_attribute + "," + (_PREFILL_ATTRIBUTES % len(episode.chunks) if hit is None else
                                                    _PREFILL_KV_HIT_ATTRIBUTES % (len(episode.chunks), *hit))
                return _PREFILL_SPAN % (trace_id, self._id(64), request_span, episode.start_ns, end, attributes,
                                        ",".join([_CHUNK_EVENT % chunk for chunk in episode.chunks]))
            span = child(sc.SPAN_PREFILL, episode.start_ns, end,
                         **{sc.PREFILL_CHUNKS: len(episode.chunks), **dict(zip(_KV_HIT_KEYS, hit or (), strict=False))})
            span.events = [(sc.EVENT_PREFILL_CHUNK, t, dict(zip(_CHUNK_KEYS, values, strict=True)))
                           for t, *values in episode.chunks]
            return span

        values: tuple[Any, ...] = (
            "text_completion", "infertrace", req.model or self._model, self._model, rid, req.max_tokens, req.tenant,
            req.prompt_tokens, req.output_tokens, max(req.cached_tokens, 0), req.assistant_prefill_tokens,
            req.preemptions, req.prefill_chunks)
        keys = _REQUEST_KEYS
        if req.system_prompt_id is not None:
            values += (req.system_prompt_id, req.system_prompt_tokens)
            keys = _REQUEST_SYSTEM_PROMPT_KEYS
        if req.error is not None:
            attributes = dict(zip(keys, values, strict=True))
            attributes[sc.RESPONSE_FINISH_REASONS] = ["error"]
            attributes[sc.ERROR_TYPE] = req.error
            root = SpanRecord(trace_id, request_span, parent, sc.SPAN_REQUEST, req.arrival_ns, end_ns, attributes,
                              kind=SPAN_KIND_SERVER, events=[(sc.EVENT_PREEMPTED, t, {}) for t in preemptions],
                              status_code=STATUS_ERROR, status_message=req.error)
            self._emit(root)
            return
        arrival, scheduled = req.arrival_ns, req.first_scheduled_ns or req.arrival_ns
        first, finish = req.first_token_ns or end_ns, end_ns
        values += (["length" if req.output_tokens >= req.max_tokens else "stop"], (scheduled - arrival) / 1e9,
                   (first - arrival) / 1e9, (first - scheduled) / 1e9, (finish - first) / 1e9,
                   (finish - arrival) / 1e9)
        keys += _LATENCY_KEYS
        spans: list[SpanRecord | str] = [
            _QUEUE_SPAN % (trace_id, self._id(64), request_span, arrival, scheduled, rid_attribute)
            if encoded else child(sc.SPAN_QUEUE, arrival, scheduled)]
        spans += map(prefill, episodes)
        if req.output_tokens > 1:
            spans.append(_DECODE_SPAN % (trace_id, self._id(64), request_span, first, finish, rid_attribute)
                         if encoded else child(sc.SPAN_DECODE, first, finish))
        if encoded:  # the root straight to JSON too: its events in time order, preemptions first on a tie
            events = _FIRST_TOKEN_EVENT % first
            if preemptions:
                timed = [(t, _PREEMPTED_EVENT % t) for t in preemptions]
                timed.append((first, events))
                timed.sort(key=_time)
                events = ",".join([event for _, event in timed])
            attributes_json = encode_attribute_values(keys, values)
            self._push(_REQUEST_SPAN_WITH_PARENT % (trace_id, request_span, parent, req.arrival_ns, end_ns,
                                                    attributes_json, events) if parent else
                       _REQUEST_SPAN % (trace_id, request_span, req.arrival_ns, end_ns, attributes_json, events))
        else:
            timed_events = [(sc.EVENT_PREEMPTED, t, {}) for t in preemptions]
            timed_events.append((sc.EVENT_FIRST_TOKEN, first, {}))
            if len(timed_events) > 1:
                timed_events.sort(key=lambda e: e[1])
            self._emit(SpanRecord(trace_id, request_span, parent, sc.SPAN_REQUEST, req.arrival_ns, end_ns,
                                  dict(zip(keys, values, strict=True)), kind=SPAN_KIND_SERVER, events=timed_events))
        pending = self._pending
        for span in spans:
            pending.append(span)
            if len(pending) >= self.batch_size:
                self.flush()
                pending = self._pending

    def close(self) -> None:
        self.flush()
