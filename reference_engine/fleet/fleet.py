"""A fleet on one virtual clock: the gateway (`gateway.py`) and every engine replica in one event loop.

Each request is one trace. The gateway's server span is its root; auth, rate-limit, global-queue and route
spans are its children, each from its component's own resource; the engine's `llm_request` span is a child
of the route span (for a disaggregated model, both workers' `llm_request` spans and the `kv_transfer` span
are). The gateway decides what happens to a request; this loop decides when.

The loop: a heap of timed events (gateway hops, dispatches to engines, fault on/off) and engines, each
engine due at its own clock while it has work. An engine runs one step, or a run of identical decode
steps up to the earliest time anything could still be added to it, so runs stop where an arrival would
join them: a dispatch already on its way to that engine, or a route (or global-queue release) not yet
decided for its model, which might pick it.

Routing ahead: a round-robin router's choice depends on its own state and the clock, never on the engines.
So before the loop starts, every request of the models behind such routers (when none of them is held in a
global queue) is routed, in the order the loop would have routed them; each engine then only stops for
the requests actually sent to it. The requests are served exactly as if routed one by one in the loop.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from reference_engine.engine.cost_model import StepCostModel
from reference_engine.engine.llm_engine import EngineObserver, LLMEngine
from reference_engine.engine.sequence import Request, Sequence
from reference_engine.fleet.config import FaultWindow, FleetSpec, ModelDeployment
from reference_engine.fleet.disaggregation import DecodeWorkerBlockManager
from reference_engine.fleet.gateway import Call, Dispatch, Emitter, FleetSummary, Gateway, GlobalQueue
from reference_engine.fleet.workload import prefill_failures
from reference_engine.telemetry.otlp import SpanSink
from reference_engine.telemetry.profiles import GatewayNaming, TelemetryRun, TelemetrySpec
from reference_engine.telemetry.tracer import EngineTracer, engine_resource
from reference_engine.workload import DEFAULT_EPOCH_NS

_NEVER = 1 << 62
# Event priorities at equal times: faults switch first, then requests end (so a router deciding at t sees a
# request that ended at t as gone), then gateway hops, then engines step (so a request dispatched at t joins
# the step that starts at t).
_FAULT, _END, _GQ_WAKE, _ROUTE, _GQ_ENTER, _DISPATCH, _ENGINE = range(7)

ObserverFactory = Callable[[str, LLMEngine], Iterable[EngineObserver]]


class _Replica:
    __slots__ = ("cost_model", "dispatches", "engine", "inflight", "instance_id", "model", "role", "scheduled",
                 "toggles")

    def __init__(self, engine: LLMEngine, instance_id: str, role: str, model: str) -> None:
        self.engine = engine
        self.instance_id = instance_id
        self.role = role
        self.model = model
        self.inflight = 0
        self.scheduled = False
        self.dispatches: list[int] = []  # heap: arrival times of requests on their way to this engine
        self.toggles: list[int] = []  # times at which a fault on this engine starts or ends
        self.cost_model: StepCostModel | None = None  # the normal one, while a slowdown is in force


def _slowed(model: StepCostModel, factor: float) -> StepCostModel:
    """The same engine with every step `factor` times slower (e.g. a kernel or driver regression)."""
    p = model.params
    params = replace(p, compute_efficiency=p.compute_efficiency / factor,
                     memory_efficiency=p.memory_efficiency / factor,
                     attention_efficiency=p.attention_efficiency / factor,
                     step_overhead_s=p.step_overhead_s * factor)
    return model.with_params(params)


class Fleet:
    def __init__(self, spec: FleetSpec, sink: SpanSink | None, seed: int = 0, epoch_ns: int = DEFAULT_EPOCH_NS,
                 observers: ObserverFactory | None = None, telemetry: TelemetrySpec | None = None) -> None:
        """`telemetry`: whose spans the engines and the gateway emit (reference_engine.telemetry.profiles); by
        default this project's own."""
        self.spec = spec
        self.sink = sink
        self.telemetry = None if telemetry is None or telemetry.is_native else TelemetryRun(telemetry, sink, seed)
        self.epoch_ns = epoch_ns
        self._seed = seed
        windows: dict[str, list[FaultWindow]] = {}
        for fault in spec.faults:
            start, end = fault.window_ns(epoch_ns)
            windows.setdefault(fault.target, []).append(FaultWindow(start, end, fault))
        self.windows = windows
        self.summary = FleetSummary()
        if self.telemetry is None:
            self.gateway = Gateway(spec, windows, sink, seed, self.summary, epoch_ns)
        else:
            self.gateway = Gateway(spec, windows, sink, seed, self.summary, epoch_ns,
                                   GatewayNaming(self.telemetry.spec.gateway), self.telemetry.emits_kv_transfer)

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
        self._latency_of = {m: link.latency_ns for m, link in self.gateway.link_of.items()}
        # The times of the gateway hops not yet decided for each model (routes, global-queue entries and wakes),
        # and of what may still reach its decode workers (transfers): an engine runs ahead up to the first of
        # them, or of the dispatches on their way to it (`_Replica.dispatches`).
        self._pending: dict[str, list[int]] = {m: [] for m in spec.model_names}
        self._pending_decode: dict[str, list[int]] = {m: [] for m in spec.model_names}
        self._routed_ahead = self._models_routed_ahead()

    def _models_routed_ahead(self) -> set[str]:
        """Models whose routes can all be decided before the loop: every router serving them is round-robin (its
        choice never depends on the engines), and every model those routers route for is too, and none is held in a
        global queue (whose releases route through the same router, at times that do depend on the engines): a
        router's calls then all happen before the loop, in the order the loop would make them (a router that
        queues its calls sees the same order). A model without a router goes to its least loaded engine."""
        ahead = {m for router in self.spec.routers for m in router.models}
        changed = True
        while changed:  # a router with any model not ahead keeps all of its models in the loop
            changed = False
            for router in self.spec.routers:
                if ((router.policy != "round_robin" or any(m in self.gateway.queue or m not in ahead
                                                           for m in router.models))
                        and ahead & set(router.models)):
                    ahead.difference_update(router.models)
                    changed = True
        return ahead

    def _build(self, m: ModelDeployment, instance: str, role: str, seed: int,
               observers: ObserverFactory | None) -> _Replica:
        config = m.engine_config(instance, role)
        engine = LLMEngine(config)
        if role == "decode_worker":
            bm = DecodeWorkerBlockManager(engine.block_manager.num_blocks, config.block_size,
                                          config.enable_prefix_caching)
            engine.block_manager = engine.scheduler.block_manager = bm
        resource = engine_resource(config, kind=role)
        if self.telemetry is not None:
            engine.observers.extend(self.telemetry.engine_observers(config, seed, role))
        elif self.sink is not None:
            tracer = EngineTracer(self.sink, resource, seed=seed)
            engine.observers.append(tracer)
            self.tracers.append(tracer)
        if observers is not None:
            engine.observers.extend(observers(instance, engine))
        replica = _Replica(engine, instance, role, m.name)
        if role == "decode_worker":
            self.gateway.kv_emitters[instance] = Emitter(self.sink, resource)
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
        for w in [*self.windows.get(m.name, []), *self.windows.get(instance, [])]:
            if w.fault.kind in ("engine_slowdown", "instance_slowdown"):
                replica.toggles += [w.start_ns, w.end_ns]
                self._push(w.start_ns, _FAULT, (replica, w.fault.param("factor")))
                self._push(w.end_ns, _FAULT, (replica, 0.0))
        replica.toggles.sort()
        return replica

    # ------------------------------------------------------------------------------------------ loop
    def run(self, requests: list[Request], on_progress: Callable[[int], None] | None = None) -> FleetSummary:
        """Serve the requests (in arrival order, each with a model of this fleet) until all have ended."""
        unknown = {r.model for r in requests} - set(self.targets)
        if unknown:
            raise ValueError(f"requests for models the fleet does not serve: {sorted(unknown)}")
        self.summary.start_ns = requests[0].arrival_ns if requests else self.epoch_ns
        if self.telemetry is not None:
            self.telemetry.expect(requests)
        per_model = dict.fromkeys(self.spec.model_names, 0)
        for r in requests:
            per_model[r.model] += 1
        self.summary.per_model = per_model
        self.gateway.invalid = prefill_failures(self.spec, requests, self._seed, self.epoch_ns)
        heap = self._heap
        handlers = {_ENGINE: self._step, _END: self._ended, _DISPATCH: self._dispatch, _ROUTE: self._route,
                    _GQ_ENTER: self._enter_queue, _GQ_WAKE: self._wake_queue, _FAULT: self._toggle}
        loops = 0
        # The loop keeps every in-flight request alive and makes no reference cycles: the cyclic garbage
        # collector would only rescan them (≈ 15% of the run). Reference counting still frees everything.
        collecting = gc.isenabled()
        gc.disable()
        try:
            ahead: list[tuple[int, int, Call]] = []
            for r in self.gateway.arrivals(requests):
                self._arrive(r, ahead)
            for t, _, call in sorted(ahead, key=lambda a: a[:2]):  # in the order the loop would route them
                self._send(self.gateway.route(call, t, self.targets[call.model]))
            while heap:
                t, kind, _, payload = heapq.heappop(heap)
                handlers[kind](t, payload)
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
        if self.telemetry is not None:
            self.telemetry.close()
        self.gateway.flush()
        self.summary.spans = getattr(self.sink, "spans_written", 0)

    # -------------------------------------------------------------------------------------- events
    def _push(self, t: int, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    def _arrive(self, r: Request, ahead: list[tuple[int, int, Call]]) -> None:
        """Auth and rate limiting depend on the arrivals alone (not on the engines), so every request takes them
        before the loop starts: the loop then knows when each request reaches the router. Requests of models
        routed ahead go to `ahead` instead, with the sequence number their route event would have had."""
        admitted = self.gateway.admit(r)
        if admitted is None:
            return
        call, t = admitted
        if call.model in self._routed_ahead:
            self._seq += 1
            ahead.append((t, self._seq, call))
            return
        heapq.heappush(self._pending[call.model], t)
        self._push(t, _GQ_ENTER if call.model in self.gateway.queue else _ROUTE, call)

    def _route(self, t: int, call: Call) -> None:
        heapq.heappop(self._pending[call.model])
        self._send(self.gateway.route(call, t, self.targets[call.model]))

    def _send(self, dispatch: Dispatch | None) -> None:
        if dispatch is not None:
            target: _Replica = dispatch.target
            if target.role == "decode_worker":
                heapq.heappush(self._pending_decode[target.model], dispatch.at_ns)
            else:
                heapq.heappush(target.dispatches, dispatch.at_ns)
            self._push(dispatch.at_ns, _DISPATCH, dispatch)

    def _enter_queue(self, t: int, call: Call) -> None:
        heapq.heappop(self._pending[call.model])
        self.gateway.hold(call, t)
        self._release(call.model, t)

    def _wake_queue(self, t: int, queue: GlobalQueue) -> None:
        for m in queue.spec.models:
            heapq.heappop(self._pending[m])
        for m in queue.spec.models:
            self._release(m, t)

    def _release(self, m: str, t: int) -> None:
        dispatches, wake = self.gateway.release(m, t, self.targets[m])
        for dispatch in dispatches:
            self._send(dispatch)
        if wake is not None:
            queue = self.gateway.queue[m][0]
            for mm in queue.spec.models:
                heapq.heappush(self._pending[mm], wake)
            self._push(wake, _GQ_WAKE, queue)

    def _dispatch(self, t: int, dispatch: Dispatch) -> None:
        target: _Replica = dispatch.target
        heapq.heappop(self._pending_decode[target.model] if target.role == "decode_worker" else target.dispatches)
        engine = target.engine
        engine.add_request(dispatch.request)
        if not target.scheduled:
            engine.now_ns = max(engine.now_ns, t)
            target.scheduled = True
            self._push(engine.now_ns, _ENGINE, target)

    def _step(self, t: int, replica: _Replica) -> None:
        replica.scheduled = False
        engine = replica.engine
        for seq in engine.step(self._bound(replica)):
            # An engine step can end after later gateway events: the request ends at its own time.
            end = seq.finish_ns if seq.finish_ns is not None else engine.now_ns
            if replica.role == "prefill_worker":
                heapq.heappush(self._pending_decode[replica.model], end + self._latency_of[replica.model])
            self._push(end, _END, (replica, seq))
        if engine.scheduler.has_work and not replica.scheduled:
            replica.scheduled = True
            self._push(engine.now_ns, _ENGINE, replica)

    def _bound(self, replica: _Replica) -> int:
        """Earliest time anything could still be added to the replica's engine (or its speed change)."""
        m = replica.model
        bound = _NEVER
        pending = self._pending[m]
        if pending and pending[0] < bound:
            bound = pending[0]
        dispatches = replica.dispatches
        if dispatches and dispatches[0] < bound:
            bound = dispatches[0]
        if replica.role == "decode_worker":
            decode = self._pending_decode[m]
            if decode and decode[0] < bound:
                bound = decode[0]
            latency = self._latency_of[m]
            for p in self.targets[m]:  # a prefill still running ends at the end of its engine's step at best
                if p.engine.scheduler.has_work and p.engine.now_ns + latency < bound:
                    bound = p.engine.now_ns + latency
                if p.dispatches and p.dispatches[0] < bound:  # or one on its way to a prefill worker
                    bound = p.dispatches[0]
        now = replica.engine.now_ns
        for t in replica.toggles:
            if t > now:
                bound = min(bound, t)
                break
        return bound

    def _ended(self, t: int, ended: tuple[_Replica, Sequence]) -> None:
        replica, seq = ended
        call = self.gateway.call_of(seq.request)
        replica.inflight -= 1
        end = seq.finish_ns if seq.finish_ns is not None else replica.engine.now_ns
        m = call.model
        if replica.role == "prefill_worker":
            heapq.heappop(self._pending_decode[m])  # the bound pushed when the prefill ended
            if seq.error is None:
                self._send(self.gateway.transfer(call, replica, replica.engine.spec, seq, end, self.decoders[m]))
            else:
                self.gateway.complete(call, seq, end)
        else:
            self.gateway.complete(call, seq, end)
        if m in self.gateway.queue:
            self._release(m, end)

    def _toggle(self, t: int, fault: tuple[_Replica, float]) -> None:
        replica, factor = fault
        executor = replica.engine.executor
        if factor:
            replica.cost_model = replica.cost_model or executor.cost_model  # type: ignore[attr-defined]
            executor.cost_model = _slowed(replica.cost_model, factor)  # type: ignore[attr-defined]
        elif replica.cost_model is not None:
            executor.cost_model = replica.cost_model  # type: ignore[attr-defined]
            replica.cost_model = None
