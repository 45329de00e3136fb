"""The gateway in front of the engines: its shared components — auth, a rate limiter (a token bucket per tenant,
shared by every model it serves), a router (round-robin, least-loaded or prefix-aware) and a global queue — and
the decisions they make for each request (`Gateway`).

Each component decides with its own state at a given time on the fleet's virtual clock, and says how long it
took. Faults act here, on the mechanism: a slow component takes longer, a flapping limiter enforces a
lower limit, a stalled queue releases nothing.
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from infertrace import semconv as sc
from reference_engine.engine.models import ModelSpec
from reference_engine.engine.sequence import Request, Sequence
from reference_engine.fleet.config import (
    AuthSpec,
    FaultWindow,
    FleetSpec,
    GlobalQueueSpec,
    RateLimiterSpec,
    RouterSpec,
)
from reference_engine.fleet.disaggregation import Link, kv_transfer_bytes
from reference_engine.telemetry.otlp import SPAN_KIND_SERVER, STATUS_ERROR, Attributes, SpanRecord, SpanSink
from reference_engine.telemetry.profiles import GatewayNaming


def _latency_ns(rng: random.Random, mean_ms: float) -> int:
    """Component latency: log-normal around its mean (σ = 0.25), so it is never exactly constant."""
    if mean_ms <= 0:
        return 0
    return round(rng.lognormvariate(0.0, 0.25) * mean_ms * 0.9697 * 1e6)  # 0.9697 = exp(-σ²/2)


def _hits(w: FaultWindow, t: int, tenant: str) -> bool:
    """Whether the fault window acts on a call of `tenant` at t: a fault with a `tenant` parameter acts on that
    tenant's calls only (e.g. the one replica or cache shard that holds its keys)."""
    only = w.fault.params.get("tenant", "")
    return w.active(t) and (not only or only == tenant)


def _extra_ms(windows: list[FaultWindow], t: int, tenant: str) -> float:
    return sum(w.fault.param("extra_ms") for w in windows if _hits(w, t, tenant))


class Auth:
    def __init__(self, spec: AuthSpec, faults: list[FaultWindow], seed: int) -> None:
        self.spec = spec
        self.faults = faults
        self.denied = frozenset(spec.denied_tenants)
        self._rng = random.Random(seed)

    def check(self, t: int, tenant: str) -> tuple[int, int]:
        """(latency ns, HTTP status: 200 or 401)."""
        mean = self.spec.latency_ms + (_extra_ms(self.faults, t, tenant) if self.faults else 0.0)
        return _latency_ns(self._rng, mean), 401 if tenant in self.denied else 200


class RateLimiter:
    """A token bucket per tenant: `requests_per_s` refill, `burst` capacity; one request takes one token."""

    def __init__(self, spec: RateLimiterSpec, faults: list[FaultWindow], seed: int) -> None:
        self.spec = spec
        self.faults = faults
        self._rng = random.Random(seed)
        self._tokens: dict[str, float] = {}
        self._last: dict[str, int] = {}

    def limit(self, t: int) -> tuple[float, float]:
        """(refill per second, capacity) in force at t. A flapping limiter alternates between its configured
        limit and `limit_fraction` of it (a bad configuration pushed and reverted, a lost counter store)."""
        rate, burst = self.spec.requests_per_s, self.spec.burst
        for w in self.faults:
            if w.active(t) and w.fault.kind == "rate_limiter_flapping":
                period = w.fault.param("period_s") * 1e9
                if ((t - w.start_ns) % period) < w.fault.param("duty") * period:
                    fraction = w.fault.param("limit_fraction")
                    rate, burst = rate * fraction, max(1.0, burst * fraction)
        return rate, burst

    def admit(self, t: int, tenant: str) -> tuple[int, int]:
        """(latency ns, HTTP status: 200 or 429)."""
        rate, burst = self.limit(t) if self.faults else (self.spec.requests_per_s, self.spec.burst)
        last = self._last.get(tenant)
        tokens = burst if last is None else self._tokens[tenant] + max(t - last, 0) * 1e-9 * rate
        tokens = min(tokens, burst)
        status = 200
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            status = 429
        self._tokens[tenant] = tokens
        self._last[tenant] = max(t, last or t)
        return _latency_ns(self._rng, self.spec.latency_ms), status


class Router:
    def __init__(self, spec: RouterSpec, faults: list[FaultWindow], seed: int) -> None:
        self.spec = spec
        self.faults = faults
        self._rng = random.Random(seed)
        self._next: dict[str, int] = {}  # round-robin position per model

    def route(self, t: int, tenant: str = "") -> tuple[int, int]:
        """(latency ns, HTTP status: 200, or 503 when a degraded router fails the request)."""
        mean, error_rate = self.spec.latency_ms, 0.0
        for w in self.faults:
            if _hits(w, t, tenant):
                mean += w.fault.param("extra_ms")
                error_rate = max(error_rate, w.fault.param("error_rate"))
        status = 503 if error_rate and self._rng.random() < error_rate else 200
        return _latency_ns(self._rng, mean), status

    def pick(self, model: str, loads: list[int], prefix_key: str | None) -> int:
        """Index of the replica to send to, given each replica's requests in flight."""
        n = len(loads)
        if n == 1:
            return 0
        policy = self.spec.policy
        if policy == "round_robin":
            i = self._next.get(model, 0)
            self._next[model] = (i + 1) % n
            return i
        least = min(range(n), key=loads.__getitem__)
        if policy == "prefix_aware" and prefix_key is not None:
            # Same prefix, same replica (its prefix cache has the blocks), unless that replica is far busier.
            home = zlib.crc32(prefix_key.encode()) % n
            if loads[home] <= loads[least] + 8:
                return home
        return least


class GlobalQueue:
    """Holds requests, per model in arrival order, until one of the model's engines has fewer than
    `max_inflight_per_engine` requests in flight; a stalled queue releases nothing."""

    def __init__(self, spec: GlobalQueueSpec, faults: list[FaultWindow]) -> None:
        self.spec = spec
        self.faults = faults
        self.max_inflight = int(spec.max_inflight_per_engine)
        self.held: dict[str, deque[object]] = {m: deque() for m in spec.models}

    def stalled_until(self, t: int) -> int | None:
        """End of the stall in force at t, or None."""
        ends = [w.end_ns for w in self.faults if w.active(t)]
        return max(ends) if ends else None


# ----------------------------------------------------------------------------------------- the gateway
class Emitter:
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


class Call:
    """A request's trip through the fleet: its trace, and the span its engine spans hang from."""

    __slots__ = ("arrival_ns", "backend_start_ns", "gq_enter_ns", "model", "parent_span", "request", "span_id",
                 "trace_id")

    def __init__(self, request: Request, trace_id: int, span_id: int) -> None:
        self.request = request
        self.model = request.model
        self.arrival_ns = request.arrival_ns
        self.trace_id = trace_id
        self.span_id = span_id  # the gateway span
        self.parent_span = span_id  # of the engine spans: the route span once routed
        self.gq_enter_ns = 0
        self.backend_start_ns = 0  # a LiteLLM-style gateway: when its call to the engine (`litellm_request`) began


class Target(Protocol):
    """An engine replica as the gateway sees it: where it is and how busy."""

    instance_id: str
    role: str
    inflight: int


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A request on its way to an engine replica, arriving at `at_ns`."""

    target: Any  # a Target
    request: Request
    at_ns: int


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


class Gateway:
    """The shared components in front of the engines and what they decide for each request: admit (auth, rate
    limit), route (to a replica), release (from the global queue), transfer (a prefill's KV to a decode
    worker) and finish (the gateway's answer). Each decision writes its component's span; the fleet's loop
    decides only *when* things happen.

    Requests take HTTP-style outcomes: 401 from auth, 429 from the rate limiter, 503 from a failing router,
    500 when an engine rejects the request or (an assistant-prefill fault in "fail" mode) its output breaks the
    response format, 504 past the gateway's timeout (the engine is not aborted)."""

    def __init__(self, spec: FleetSpec, windows: dict[str, list[FaultWindow]], sink: SpanSink | None, seed: int,
                 summary: FleetSummary, naming: GatewayNaming | None = None, emit_kv_transfer: bool = True) -> None:
        self.spec = spec
        self.naming = naming or GatewayNaming()
        self.emit_kv_transfer = emit_kv_transfer
        self.summary = summary
        self.invalid: set[str] = set()  # requests whose output an assistant-prefill fault breaks (500)
        self._rng = random.Random(f"fleet-{seed}")  # a stream of its own, apart from the engine tracers' ids
        region = spec.region

        def emitter(instance: str, kind: str, service: str) -> Emitter:
            return Emitter(sink if self.naming.emits else None,
                           self.naming.resource(component_resource(instance, kind, service, region)))

        self._gateway = emitter(spec.gateway_id, "gateway", "gateway")
        self.auth: dict[str, tuple[Auth, Emitter]] = {}
        self.limiter: dict[str, tuple[RateLimiter, Emitter]] = {}
        self.router: dict[str, tuple[Router, Emitter]] = {}
        self.queue: dict[str, tuple[GlobalQueue, Emitter]] = {}
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
        self.link_of = {m.name: self.links[m.disaggregation.link] for m in spec.models if m.disaggregation}
        # kv_transfer spans go out with the decode worker's resource (the decode side pulls): its emitter
        self.kv_emitters: dict[str, Emitter] = {}
        self._calls: dict[int, Call] = {}  # id(engine request) -> its call
        self._wakes: set[tuple[str, int]] = set()

    def _span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def _component_span(self, emitter: Emitter, call: Call, name: str, start: int, end: int, status: int,
                        outcome: str, extra: Attributes | None = None) -> int:
        span_id = self._span_id()
        attributes: Attributes = {sc.REQUEST_ID: call.request.request_id, sc.TENANT_ID: call.request.tenant,
                                  sc.HTTP_STATUS_CODE: status, sc.COMPONENT_OUTCOME: outcome}
        if extra:
            attributes.update(extra)
        if not self.naming.native:
            name, attributes = self.naming.component(name, status)
        span = SpanRecord(call.trace_id, span_id, call.span_id, name, start, end, attributes)
        if status >= 500:
            span.status_code = STATUS_ERROR
        emitter.emit(span)
        return span_id

    def admit(self, r: Request) -> tuple[Call, int] | None:
        """Auth and rate limiting: the admitted call and when it reaches the global queue or the router, or
        None when it was rejected (and answered). Both depend on the arrivals alone, not on the engines."""
        m = r.model
        call = Call(r, self._rng.getrandbits(128) or 1, self._span_id())
        t = r.arrival_ns
        auth = self.auth.get(m)
        if auth is not None:
            latency, status = auth[0].check(t, r.tenant)
            outcome = "ok" if status == 200 else "rejected"
            self._component_span(auth[1], call, sc.SPAN_AUTH, t, t + latency, status, outcome)
            t += latency
            if status != 200:
                self.finish(call, t, status, "unauthorized")
                return None
        limiter = self.limiter.get(m)
        if limiter is not None:
            latency, status = limiter[0].admit(t, r.tenant)
            outcome = "ok" if status == 200 else "rejected"
            self._component_span(limiter[1], call, sc.SPAN_RATE_LIMIT, t, t + latency, status, outcome)
            t += latency
            if status != 200:
                self.finish(call, t, status, "rate_limited")
                return None
        return call, t

    def route(self, call: Call, t: int, candidates: list[Any]) -> Dispatch | None:
        """Pick a replica among `candidates` (Targets); None when the router failed the request (answered)."""
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
                self.finish(call, t + latency, status, "router_error")
                return None
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
        if self.naming.profile == "litellm":  # the proxy's own call to the engine wraps the engine's span
            call.parent_span, call.backend_start_ns = self._span_id(), dispatch
        engine_request.trace_parent = (call.trace_id, call.parent_span) if self.naming.emits else None
        self._calls[id(engine_request)] = call
        return Dispatch(target, engine_request, dispatch)

    def hold(self, call: Call, t: int) -> None:
        """The call enters its model's global queue."""
        call.gq_enter_ns = t
        self.queue[call.model][0].held[call.model].append(call)

    def release(self, m: str, t: int, targets: list[Any]) -> tuple[list[Dispatch], int | None]:
        """Route what the global queue can release at t to replicas with room: (the dispatches, and when a
        stalled queue wakes if this call is the first to find it stalled until then)."""
        queue, emitter = self.queue[m]
        held = queue.held[m]
        dispatches: list[Dispatch] = []
        while held:
            stalled = queue.stalled_until(t)
            if stalled is not None:
                if (queue.spec.id, stalled) in self._wakes:
                    return dispatches, None
                self._wakes.add((queue.spec.id, stalled))
                return dispatches, stalled
            free = [c for c in targets if c.inflight < queue.max_inflight]
            if not free:
                break
            call: Call = held.popleft()  # type: ignore[assignment]
            self._component_span(emitter, call, sc.SPAN_GLOBAL_QUEUE, call.gq_enter_ns, t, 200, "ok")
            dispatch = self.route(call, t, free)
            if dispatch is not None:
                dispatches.append(dispatch)
        return dispatches, None

    def call_of(self, request: Request) -> Call:
        return self._calls.pop(id(request))

    def transfer(self, call: Call, source: Target, spec: ModelSpec, seq: Sequence, t: int,
                 decoders: list[Any]) -> Dispatch:
        """Move a finished prefill's KV over the model's link to the least busy decode worker."""
        m, r = call.model, call.request
        link = self.link_of[m]
        nbytes = kv_transfer_bytes(spec, seq.num_prompt_tokens)
        end = link.transfer(t, nbytes)
        target = min(decoders, key=lambda c: c.inflight)
        target.inflight += 1
        if self.emit_kv_transfer:
            span = SpanRecord(call.trace_id, self._span_id(), call.parent_span, sc.SPAN_KV_TRANSFER, t, end, {
                sc.REQUEST_ID: r.request_id, sc.KV_TRANSFER_BYTES: nbytes, sc.KV_TRANSFER_SOURCE: source.instance_id,
                sc.KV_TRANSFER_DESTINATION: target.instance_id, sc.KV_TRANSFER_LINK: link.spec.id})
            self.kv_emitters[target.instance_id].emit(span)
        r.arrival_ns = end
        r.trace_parent = (call.trace_id, call.parent_span) if self.naming.emits else None
        self._calls[id(r)] = call
        return Dispatch(target, r, end)

    def complete(self, call: Call, seq: Sequence, end: int) -> None:
        """The engine (or decode worker) ended the request: answer it."""
        if seq.error is not None:
            self.finish(call, end, 500, seq.error, seq)
        elif call.request.request_id in self.invalid:
            self.finish(call, end, 500, "invalid_response", seq)
        else:
            self.finish(call, end, 200, None, seq)

    def finish(self, call: Call, end: int, status: int, error: str | None = None,
               seq: Sequence | None = None) -> None:
        """The gateway's answer: its server span, the root of the request's trace."""
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
        name = sc.SPAN_GATEWAY
        if not self.naming.native:
            name, attributes = self.naming.root(status, call.model, r.tenant)
            if call.backend_start_ns:
                backend = self.naming.backend_call(call.model, r.tenant, r.prompt.num_tokens,
                                                   seq.num_output_tokens if seq is not None else None)
                call_span = SpanRecord(call.trace_id, call.parent_span, call.span_id, sc.LITELLM_SPAN_REQUEST,
                                       call.backend_start_ns, end, backend)
                if status >= 500:
                    call_span.status_code, call_span.status_message = STATUS_ERROR, error or str(status)
                self._gateway.emit(call_span)
        span = SpanRecord(call.trace_id, call.span_id, 0, name, call.arrival_ns, end, attributes,
                          kind=SPAN_KIND_SERVER)
        if status >= 500:
            span.status_code, span.status_message = STATUS_ERROR, error or str(status)
        self._gateway.emit(span)
        s = self.summary
        s.requests += 1
        s.statuses[status] = s.statuses.get(status, 0) + 1
        s.end_ns = max(s.end_ns, end)

    def flush(self) -> None:
        emitters = [self._gateway, *self.kv_emitters.values()]
        for group in (self.auth, self.limiter, self.router, self.queue):
            emitters += [e for _, e in group.values()]
        seen: set[int] = set()
        for e in emitters:
            if id(e) not in seen:
                seen.add(id(e))
                e.flush()
