"""A fleet on one virtual clock: the gateway's components and every engine replica in one event loop.

Each request is one trace. The gateway's server span is its root; auth, rate-limit, global-queue and route
spans are its children, each from its component's own resource; the engine's `llm_request` span is a child
of the route span (for a disaggregated model, both workers' `llm_request` spans and the `kv_transfer` span
are). Requests take HTTP-style outcomes: 401 from auth, 429 from the rate limiter, 503 from a failing
router, 500 when an engine rejects the request or (an assistant-prefill fault in "fail" mode) its output
breaks the response format, 504 past the gateway's timeout (the engine is not aborted).

The loop: a heap of timed events (gateway hops, dispatches to engines, fault on/off) and engines, each
engine due at its own clock while it has work. An engine runs one step, or a run of identical decode
steps up to the earliest time anything could still be added to it, so runs stop where an arrival would
join them.
"""

from __future__ import annotations

import gc
import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from infertrace import semconv as sc
from reference_engine.cost_model import StepCostModel
from reference_engine.disaggregation import DecodeWorkerBlockManager, Link, kv_transfer_bytes
from reference_engine.engine import EngineObserver, LLMEngine
from reference_engine.fleet_config import FleetSpec, ModelDeployment
from reference_engine.fleet_workload import prefill_failures
from reference_engine.gateway import Auth, FaultWindow, GlobalQueue, RateLimiter, Router
from reference_engine.otlp import SPAN_KIND_SERVER, STATUS_ERROR, Attributes, SpanRecord, SpanSink
from reference_engine.sequence import Request, Sequence
from reference_engine.tracer import EngineTracer, engine_resource
from reference_engine.workload import DEFAULT_EPOCH_NS

_NEVER = 1 << 62
# Event priorities at equal times: faults switch first, then requests end (so a router deciding at t sees a
# request that ended at t as gone), then gateway hops, then engines step (so a request dispatched at t joins
# the step that starts at t).
_FAULT, _END, _GQ_WAKE, _ROUTE, _GQ_ENTER, _DISPATCH, _ENGINE = range(7)

ObserverFactory = Callable[[str, LLMEngine], Iterable[EngineObserver]]


class _Emitter:
    """Buffers one resource's spans and hands them to the sink in batches."""

    def __init__(self, sink: SpanSink | None, resource: Attributes, batch_size: int = 2048) -> None:
        self.sink, self.resource, self.batch_size = sink, resource, batch_size
        self.spans: list[SpanRecord] = []

    def emit(self, span: SpanRecord) -> None:
        if self.sink is None:
            return
        self.spans.append(span)
        if len(self.spans) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        if self.sink is not None and self.spans:
            self.sink.export(self.resource, self.spans)
            self.spans = []


def component_resource(instance_id: str, kind: str, service: str, region: str) -> Attributes:
    return {sc.SERVICE_NAME: service, sc.SERVICE_INSTANCE_ID: instance_id, sc.COMPONENT_KIND: kind,
            sc.CLOUD_REGION: region}


class _Call:
    """A request's trip through the fleet."""

    __slots__ = ("arrival_ns", "gq_enter_ns", "model", "parent_span", "request", "span_id", "trace_id")

    def __init__(self, request: Request, trace_id: int, span_id: int) -> None:
        self.request = request
        self.model = request.model
        self.arrival_ns = request.arrival_ns
        self.trace_id = trace_id
        self.span_id = span_id  # the gateway span
        self.parent_span = span_id  # of the engine spans: the route span once routed
        self.gq_enter_ns = 0


class _Replica:
    __slots__ = ("cost_model", "engine", "inflight", "instance_id", "kv_emitter", "model", "role", "scheduled",
                 "toggles")

    def __init__(self, engine: LLMEngine, instance_id: str, role: str, model: str) -> None:
        self.engine = engine
        self.instance_id = instance_id
        self.role = role
        self.model = model
        self.inflight = 0
        self.scheduled = False
        self.toggles: list[int] = []  # times at which a fault on this engine starts or ends
        self.cost_model: StepCostModel | None = None  # the normal one, while a slowdown is in force
        self.kv_emitter: _Emitter | None = None  # decode workers: kv_transfer spans (the decode side pulls)


@dataclass
class FleetSummary:
    requests: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    per_model: dict[str, int] = field(default_factory=dict)
    output_tokens: int = 0
    start_ns: int = 0
    end_ns: int = 0
    spans: int = 0

    @property
    def simulated_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def paragraph(self) -> str:
        statuses = ", ".join(f"{n} × {code}" for code, n in sorted(self.statuses.items()))
        models = ", ".join(f"{m}: {n}" for m, n in self.per_model.items())
        return (f"{self.requests} requests over {self.simulated_s:.1f} simulated s ({statuses}); per model: "
                f"{models}; {self.output_tokens} tokens generated.")


def _slowed(model: StepCostModel, factor: float) -> StepCostModel:
    """The same engine with every step `factor` times slower (e.g. a kernel or driver regression)."""
    p = model.params
    params = replace(p, compute_efficiency=p.compute_efficiency / factor,
                     memory_efficiency=p.memory_efficiency / factor,
                     attention_efficiency=p.attention_efficiency / factor,
                     step_overhead_s=p.step_overhead_s * factor)
    return StepCostModel(model.model, model.hw, tensor_parallel=model.tp, prefill_microbatch=model.microbatch,
                         offload_experts=model.offload_experts, params=params)


class Fleet:
    def __init__(self, spec: FleetSpec, sink: SpanSink | None, seed: int = 0, epoch_ns: int = DEFAULT_EPOCH_NS,
                 observers: ObserverFactory | None = None) -> None:
        self.spec = spec
        self.sink = sink
        self.epoch_ns = epoch_ns
        self._seed = seed
        self._invalid: set[str] = set()  # requests whose output an assistant-prefill fault breaks (500)
        self._rng = random.Random(f"fleet-{seed}")  # a stream of its own, apart from the engine tracers' ids
        windows: dict[str, list[FaultWindow]] = {}
        for fault in spec.faults:
            start, end = fault.window_ns(epoch_ns)
            windows.setdefault(fault.target, []).append(FaultWindow(start, end, fault))
        self.windows = windows
        region = spec.region

        def emitter(instance: str, kind: str, service: str) -> _Emitter:
            return _Emitter(sink, component_resource(instance, kind, service, region))

        self._gateway = emitter(spec.gateway_id, "gateway", "gateway")
        self.auth: dict[str, tuple[Auth, _Emitter]] = {}
        self.limiter: dict[str, tuple[RateLimiter, _Emitter]] = {}
        self.router: dict[str, tuple[Router, _Emitter]] = {}
        self.queue: dict[str, tuple[GlobalQueue, _Emitter]] = {}
        for i, a in enumerate(spec.auth):
            pair = (Auth(a, windows.get(a.id, []), seed * 100 + i), emitter(a.id, "auth", "auth"))
            self.auth.update(dict.fromkeys(a.models, pair))
        for i, r in enumerate(spec.rate_limiters):
            limiter = (RateLimiter(r, windows.get(r.id, []), seed * 100 + 20 + i),
                       emitter(r.id, "rate_limiter", "rate-limiter"))
            self.limiter.update(dict.fromkeys(r.models, limiter))
        for i, r in enumerate(spec.routers):
            router = (Router(r, windows.get(r.id, []), seed * 100 + 40 + i), emitter(r.id, "router", "router"))
            self.router.update(dict.fromkeys(r.models, router))
        for q in spec.global_queues:
            queue = (GlobalQueue(q, windows.get(q.id, [])), emitter(q.id, "scheduler", "global-queue"))
            self.queue.update(dict.fromkeys(q.models, queue))
        self.links = {link.id: Link(link, windows.get(link.id, [])) for link in spec.links}

        self._heap: list[tuple[int, int, int, object]] = []
        self._seq = 0
        self.replicas: list[_Replica] = []
        self.targets: dict[str, list[_Replica]] = {}  # model -> replicas the router sends to
        self.decoders: dict[str, list[_Replica]] = {}  # model -> decode workers (disaggregated models)
        self.tracers: list[EngineTracer] = []
        for k, m in enumerate(spec.models):
            for j, (instance, role) in enumerate(spec.engine_instances(m.name)):
                replica = self._build(m, instance, role, seed * 10_000 + k * 100 + j, observers)
                (self.decoders if role == "decode_worker" else self.targets).setdefault(m.name, []).append(replica)
                self.replicas.append(replica)
        self._link_of = {m.name: self.links[m.disaggregation.link] for m in spec.models if m.disaggregation}
        self._pending: dict[str, list[int]] = {m: [] for m in spec.model_names}  # gateway hops per model
        self._pending_decode: dict[str, list[int]] = {m: [] for m in spec.model_names}
        self._calls: dict[int, _Call] = {}
        self._wakes: set[tuple[str, int]] = set()
        self.summary = FleetSummary()

    def _build(self, m: ModelDeployment, instance: str, role: str, seed: int,
               observers: ObserverFactory | None) -> _Replica:
        config = m.engine_config(instance, role)
        engine = LLMEngine(config)
        if role == "decode_worker":
            bm = DecodeWorkerBlockManager(engine.block_manager.num_blocks, config.block_size,
                                          config.enable_prefix_caching)
            engine.block_manager = engine.scheduler.block_manager = bm
        resource = engine_resource(config, kind=role)
        if self.sink is not None:
            tracer = EngineTracer(self.sink, resource, seed=seed)
            engine.observers.append(tracer)
            self.tracers.append(tracer)
        if observers is not None:
            engine.observers.extend(observers(instance, engine))
        replica = _Replica(engine, instance, role, m.name)
        if role == "decode_worker":
            replica.kv_emitter = _Emitter(self.sink, resource)
        rng = np.random.default_rng(seed)
        for w in self.windows.get(instance, []):
            if w.fault.kind == "host_pauses":
                gap, pause = w.fault.param("every_s") * 1e9, round(w.fault.param("pause_ms") * 1e6)
                t = w.start_ns + rng.exponential(gap)
                pauses = []
                while t < w.end_ns:
                    pauses.append((int(t), pause))
                    t += pause + rng.exponential(gap)
                engine.executor.pauses = sorted([*getattr(engine.executor, "pauses", []), *pauses])
        for w in self.windows.get(m.name, []):
            if w.fault.kind == "engine_slowdown":
                replica.toggles += [w.start_ns, w.end_ns]
                self._push(w.start_ns, _FAULT, (replica, w.fault.param("factor")))
                self._push(w.end_ns, _FAULT, (replica, 0.0))
        replica.toggles.sort()
        return replica

    # ---------------------------------------------------------------------------------------- helpers
    def _push(self, t: int, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    def _span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def _component_span(self, emitter: _Emitter, call: _Call, name: str, start: int, end: int, status: int,
                        outcome: str, extra: Attributes | None = None) -> int:
        span_id = self._span_id()
        attributes: Attributes = {sc.REQUEST_ID: call.request.request_id, sc.TENANT_ID: call.request.tenant,
                                  sc.HTTP_STATUS_CODE: status, sc.COMPONENT_OUTCOME: outcome}
        if extra:
            attributes.update(extra)
        span = SpanRecord(call.trace_id, span_id, call.span_id, name, start, end, attributes)
        if status >= 500:
            span.status_code = STATUS_ERROR
        emitter.emit(span)
        return span_id

    def _finish(self, call: _Call, end: int, status: int, error: str | None = None,
                seq: Sequence | None = None) -> None:
        r = call.request
        if status == 200 and end - call.arrival_ns > self.spec.timeout_s * 1e9:
            status, error, end = 504, "timeout", call.arrival_ns + round(self.spec.timeout_s * 1e9)
        attributes: Attributes = {sc.REQUEST_ID: r.request_id, sc.REQUEST_MODEL: call.model, sc.TENANT_ID: r.tenant,
                                  sc.HTTP_STATUS_CODE: status, sc.USAGE_INPUT_TOKENS: r.prompt.num_tokens}
        if seq is not None:
            attributes[sc.USAGE_OUTPUT_TOKENS] = seq.num_output_tokens
            self.summary.output_tokens += seq.num_output_tokens
        if error is not None:
            attributes[sc.ERROR_TYPE] = error
        span = SpanRecord(call.trace_id, call.span_id, 0, sc.SPAN_GATEWAY, call.arrival_ns, end, attributes,
                          kind=SPAN_KIND_SERVER)
        if status >= 500:
            span.status_code, span.status_message = STATUS_ERROR, error or str(status)
        self._gateway.emit(span)
        s = self.summary
        s.requests += 1
        s.statuses[status] = s.statuses.get(status, 0) + 1
        s.end_ns = max(s.end_ns, end)

    def _bound(self, replica: _Replica) -> int:
        """Earliest time anything could still be added to the replica's engine (or its speed change)."""
        m = replica.model
        bound = _NEVER
        pending = self._pending[m]
        if pending and pending[0] < bound:
            bound = pending[0]
        if replica.role == "decode_worker":
            decode = self._pending_decode[m]
            if decode and decode[0] < bound:
                bound = decode[0]
            latency = self._link_of[m].latency_ns
            for p in self.targets[m]:  # a prefill still running ends at the end of its engine's step at best
                if p.engine.scheduler.has_work and p.engine.now_ns + latency < bound:
                    bound = p.engine.now_ns + latency
        now = replica.engine.now_ns
        for t in replica.toggles:
            if t > now:
                bound = min(bound, t)
                break
        return bound

    # ----------------------------------------------------------------------------------- gateway hops
    def _arrive(self, r: Request) -> None:
        """Auth and rate limiting. They depend on the arrivals alone (not on the engines), so every request
        takes them before the loop starts: the loop then knows when each request reaches the router."""
        m = r.model
        call = _Call(r, self._rng.getrandbits(128) or 1, self._span_id())
        t = r.arrival_ns
        auth = self.auth.get(m)
        if auth is not None:
            latency, status = auth[0].check(t, r.tenant)
            outcome = "ok" if status == 200 else "rejected"
            self._component_span(auth[1], call, sc.SPAN_AUTH, t, t + latency, status, outcome)
            t += latency
            if status != 200:
                return self._finish(call, t, status, "unauthorized")
        limiter = self.limiter.get(m)
        if limiter is not None:
            latency, status = limiter[0].admit(t, r.tenant)
            outcome = "ok" if status == 200 else "rejected"
            self._component_span(limiter[1], call, sc.SPAN_RATE_LIMIT, t, t + latency, status, outcome)
            t += latency
            if status != 200:
                return self._finish(call, t, status, "rate_limited")
        heapq.heappush(self._pending[m], t)
        self._push(t, _GQ_ENTER if m in self.queue else _ROUTE, call)
        return None

    def _route(self, call: _Call, t: int, candidates: list[_Replica]) -> None:
        r, m = call.request, call.model
        router = self.router.get(m)
        prefix = r.system_prompt_id or r.prompt.segments[0][0]
        if router is None:
            target = min(candidates, key=lambda c: c.inflight)
            dispatch = t
        else:
            latency, status = router[0].route(t, r.tenant)
            if status != 200:
                self._component_span(router[1], call, sc.SPAN_ROUTE, t, t + latency, status, "error")
                return self._finish(call, t + latency, status, "router_error")
            target = candidates[router[0].pick(m, [c.inflight for c in candidates], prefix)]
            call.parent_span = self._component_span(router[1], call, sc.SPAN_ROUTE, t, t + latency, 200, "ok",
                                                    {sc.ROUTE_TARGET: target.instance_id})
            dispatch = t + latency
        target.inflight += 1
        if target.role == "prefill_worker":  # the prefill worker generates the first token only
            engine_request = Request(r.request_id, dispatch, r.prompt, 1, 1, tenant=r.tenant, model=m,
                                     system_prompt_id=r.system_prompt_id, system_prompt_tokens=r.system_prompt_tokens,
                                     assistant_prefill_tokens=r.assistant_prefill_tokens)
        else:
            engine_request = r
            r.arrival_ns = dispatch
        engine_request.trace_parent = (call.trace_id, call.parent_span)
        self._calls[id(engine_request)] = call
        heapq.heappush(self._pending[m], dispatch)
        self._push(dispatch, _DISPATCH, (target, engine_request))
        return None

    def _release(self, m: str, t: int) -> None:
        queue, emitter = self.queue[m]
        held = queue.held[m]
        while held:
            stalled = queue.stalled_until(t)
            if stalled is not None:
                if (queue.spec.id, stalled) not in self._wakes:
                    self._wakes.add((queue.spec.id, stalled))
                    for mm in queue.spec.models:
                        heapq.heappush(self._pending[mm], stalled)
                    self._push(stalled, _GQ_WAKE, queue)
                return
            free = [c for c in self.targets[m] if c.inflight < queue.max_inflight]
            if not free:
                return
            call: _Call = held.popleft()  # type: ignore[assignment]
            self._component_span(emitter, call, sc.SPAN_GLOBAL_QUEUE, call.gq_enter_ns, t, 200, "ok")
            self._route(call, t, free)

    # -------------------------------------------------------------------------------------- engines
    def _dispatch(self, target: _Replica, request: Request, t: int) -> None:
        heapq.heappop(self._pending_decode[target.model] if target.role == "decode_worker"
                      else self._pending[target.model])
        engine = target.engine
        engine.add_request(request)
        if not target.scheduled:
            engine.now_ns = max(engine.now_ns, t)
            target.scheduled = True
            self._push(engine.now_ns, _ENGINE, target)

    def _ended(self, replica: _Replica, seq: Sequence) -> None:
        call = self._calls.pop(id(seq.request))
        replica.inflight -= 1
        end = seq.finish_ns if seq.finish_ns is not None else replica.engine.now_ns
        m = call.model
        if seq.error is not None:
            if replica.role == "prefill_worker":
                heapq.heappop(self._pending_decode[m])
            self._finish(call, end, 500, seq.error, seq)
        elif replica.role == "prefill_worker":
            heapq.heappop(self._pending_decode[m])  # the bound pushed when the prefill ended
            self._transfer(call, replica, seq, end)
        elif call.request.request_id in self._invalid:
            self._finish(call, end, 500, "invalid_response", seq)
        else:
            self._finish(call, end, 200, None, seq)
        if m in self.queue:
            self._release(m, end)

    def _transfer(self, call: _Call, source: _Replica, seq: Sequence, t: int) -> None:
        m, r = call.model, call.request
        disaggregation = self.spec.deployment(m).disaggregation
        assert disaggregation is not None
        link = self.links[disaggregation.link]
        nbytes = kv_transfer_bytes(source.engine.spec, seq.num_prompt_tokens)
        end = link.transfer(t, nbytes)
        decoders = self.decoders[m]
        target = min(decoders, key=lambda c: c.inflight)
        target.inflight += 1
        span = SpanRecord(call.trace_id, self._span_id(), call.parent_span, sc.SPAN_KV_TRANSFER, t, end, {
            sc.REQUEST_ID: r.request_id, sc.KV_TRANSFER_BYTES: nbytes, sc.KV_TRANSFER_SOURCE: source.instance_id,
            sc.KV_TRANSFER_DESTINATION: target.instance_id, sc.KV_TRANSFER_LINK: link.spec.id})
        target.kv_emitter.emit(span)  # type: ignore[union-attr]
        r.arrival_ns = end
        r.trace_parent = (call.trace_id, call.parent_span)
        self._calls[id(r)] = call
        heapq.heappush(self._pending_decode[m], end)
        self._push(end, _DISPATCH, (target, r))

    def _toggle(self, replica: _Replica, factor: float) -> None:
        executor = replica.engine.executor
        if factor:
            replica.cost_model = replica.cost_model or executor.cost_model  # type: ignore[attr-defined]
            executor.cost_model = _slowed(replica.cost_model, factor)  # type: ignore[attr-defined]
        elif replica.cost_model is not None:
            executor.cost_model = replica.cost_model  # type: ignore[attr-defined]
            replica.cost_model = None

    # ------------------------------------------------------------------------------------------ loop
    def run(self, requests: list[Request], on_progress: Callable[[int], None] | None = None) -> FleetSummary:
        """Serve the requests (in arrival order, each with a model of this fleet) until all have ended."""
        unknown = {r.model for r in requests} - set(self.targets)
        if unknown:
            raise ValueError(f"requests for models the fleet does not serve: {sorted(unknown)}")
        self.summary.start_ns = requests[0].arrival_ns if requests else self.epoch_ns
        per_model = dict.fromkeys(self.spec.model_names, 0)
        for r in requests:
            per_model[r.model] += 1
        self.summary.per_model = per_model
        self._invalid = prefill_failures(self.spec, requests, self._seed, self.epoch_ns)
        heap = self._heap
        loops = 0
        # The loop keeps every in-flight request alive and makes no reference cycles: the cyclic garbage
        # collector would only rescan them (≈ 15% of the run). Reference counting still frees everything.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for r in requests:
                self._arrive(r)
            while heap:
                t, kind, _, payload = heapq.heappop(heap)
                if kind == _ENGINE:
                    replica: _Replica = payload  # type: ignore[assignment]
                    replica.scheduled = False
                    engine = replica.engine
                    for seq in engine.step(self._bound(replica)):
                        # An engine step can end after later gateway events: the request ends at its own time.
                        end = seq.finish_ns if seq.finish_ns is not None else engine.now_ns
                        if replica.role == "prefill_worker":
                            heapq.heappush(self._pending_decode[replica.model], end + self._link_of[replica.model]
                                           .latency_ns)
                        self._push(end, _END, (replica, seq))
                    if engine.scheduler.has_work and not replica.scheduled:
                        replica.scheduled = True
                        self._push(engine.now_ns, _ENGINE, replica)
                elif kind == _END:
                    self._ended(*payload)  # type: ignore[misc]
                elif kind == _DISPATCH:
                    target, request = payload  # type: ignore[misc]
                    self._dispatch(target, request, t)
                elif kind == _ROUTE:
                    call: _Call = payload  # type: ignore[assignment]
                    heapq.heappop(self._pending[call.model])
                    self._route(call, t, self.targets[call.model])
                elif kind == _GQ_ENTER:
                    call = payload  # type: ignore[assignment]
                    heapq.heappop(self._pending[call.model])
                    call.gq_enter_ns = t
                    self.queue[call.model][0].held[call.model].append(call)
                    self._release(call.model, t)
                elif kind == _GQ_WAKE:
                    queue: GlobalQueue = payload  # type: ignore[assignment]
                    for m in queue.spec.models:
                        heapq.heappop(self._pending[m])
                    for m in queue.spec.models:
                        self._release(m, t)
                else:
                    self._toggle(*payload)  # type: ignore[misc]
                loops += 1
                if on_progress is not None and loops % 2048 == 0:
                    on_progress(t)
        finally:
            if collecting:
                gc.enable()
            self.close()
        return self.summary

    def close(self) -> None:
        for tracer in self.tracers:
            tracer.close()
        emitters = [self._gateway, *(r.kv_emitter for r in self.replicas if r.kv_emitter is not None)]
        for group in (self.auth, self.limiter, self.router, self.queue):
            emitters += [e for _, e in group.values()]
        seen: set[int] = set()
        for e in emitters:
            if id(e) not in seen:
                seen.add(id(e))
                e.flush()
        self.summary.spans = getattr(self.sink, "spans_written", 0)

