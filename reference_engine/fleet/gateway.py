"""The gateway in front of the engines: its shared components — auth, a rate limiter (a token bucket per tenant,
shared by every model it serves), a router (round-robin, least-loaded or prefix-aware) and a global queue — and
the decisions they make for each request (`Gateway`).

Each component decides with its own state at a given time on the fleet's virtual clock, and says how long it
took. Faults act here, on the mechanism: a slow component takes longer, a flapping limiter enforces a
lower limit, a stalled queue releases nothing.

A component with `workers` serves that many calls at once (`WorkerPool`), shared with its untraced background
load; a call that finds them busy waits. Its span starts when the call arrives and ends when it leaves, so the
wait is inside it, and also set as `infertrace.component.queue_ns`. A router's backlog waits in the global
queue when its model has one (the queue releases a request only to a router with a free worker), else inside
the route span.
"""

from __future__ import annotations

import heapq
import math
import random
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from infertrace import semconv as sc
from reference_engine.engine.models import ModelSpec
from reference_engine.engine.sequence import Request, Sequence
from reference_engine.fleet.config import (
    AuthSpec,
    DiurnalSpec,
    FaultWindow,
    FleetSpec,
    GlobalQueueSpec,
    RateLimiterSpec,
    RouterSpec,
    TenantSpec,
)
from reference_engine.fleet.disaggregation import Link, kv_transfer_bytes
from reference_engine.telemetry.otlp import SPAN_KIND_SERVER, STATUS_ERROR, Attributes, SpanRecord, SpanSink
from reference_engine.telemetry.profiles import GatewayNaming
from reference_engine.workload import DEFAULT_EPOCH_NS

RETRIED_STATUSES = (429, 503, 504)  # what a client retries (a 401 it does not)


def _latency_ns(rng: random.Random, mean_ms: float, sigma: float = 0.25) -> int:
    """Component latency: log-normal around its mean, so it is never exactly constant."""
    if mean_ms <= 0:
        return 0
    # exp(-σ²/2) keeps the mean at mean_ms; for the default σ it is written 0.9697, as traces were first made.
    scale = 0.9697 if sigma == 0.25 else math.exp(-sigma * sigma / 2)
    return round(rng.lognormvariate(0.0, sigma) * mean_ms * scale * 1e6)


def _hits(w: FaultWindow, t: int, tenant: str) -> bool:
    """Whether the fault window acts on a call of `tenant` at t: a fault with a `tenant` parameter acts on that
    tenant's calls only (e.g. the one replica or cache shard that holds its keys)."""
    only = w.fault.params.get("tenant", "")
    return w.active(t) and (not only or only == tenant)


def _degraded(windows: list[FaultWindow], t: int, tenant: str, base_ms: float) -> tuple[float, float]:
    """(mean latency ms, error rate) of a call at t under the latency faults in force: the base service time
    times each fault's `factor`, plus its `extra_ms`, and its `error_rate`, all scaled by how much of the fault
    has ramped in."""
    mean, error_rate = base_ms, 0.0
    for w in windows:
        if _hits(w, t, tenant):
            level = w.level(t)
            mean += base_ms * (w.fault.param("factor") - 1.0) * level + w.fault.param("extra_ms") * level
            error_rate = max(error_rate, w.fault.param("error_rate") * level)
    return mean, error_rate


class WorkerPool:
    """A component's workers, shared by the traced calls and an untraced background stream (Poisson at
    `background_rps`, following the fleet's diurnal curve, drawn ahead in blocks): each call waits, first
    come first served, for the first free worker. Calls must come in time order (auth sees arrivals in order,
    the router the loop's events)."""

    BLOCK = 4096

    def __init__(self, workers: int, background_rps: float, background_ms: Callable[[np.ndarray], np.ndarray],
                 jitter: float, seed: int, diurnal: DiurnalSpec | None, epoch_ns: int) -> None:
        self.free = [0] * workers  # a heap: when each worker is next free
        self._background_ms = background_ms  # mean service time of background calls arriving at given times
        self._jitter = jitter
        self._rng = np.random.default_rng(seed)
        self._diurnal = diurnal
        self._epoch_ns = epoch_ns
        self._peak = background_rps * (1.0 + (diurnal.amplitude if diurnal else 0.0))
        self._drawn_to = epoch_ns
        self._arrivals: list[int] = []
        self._services: list[int] = []
        self._next = 0

    def _draw(self) -> None:
        """The next block of background calls: arrival times (thinned along the diurnal curve) and service times."""
        times = self._drawn_to + np.cumsum(self._rng.exponential(1e9 / self._peak, self.BLOCK)).astype(np.int64)
        self._drawn_to = int(times[-1])
        d = self._diurnal
        if d is not None:
            phase = 2 * np.pi * ((times - self._epoch_ns) / 1e9 + d.phase_s) / d.period_s
            times = times[self._rng.random(len(times)) * (1.0 + d.amplitude) <= 1.0 + d.amplitude * np.sin(phase)]
        scale = math.exp(-self._jitter * self._jitter / 2)
        services = self._rng.lognormal(0.0, self._jitter, len(times)) * self._background_ms(times) * scale * 1e6
        self._arrivals, self._services, self._next = times.tolist(), np.rint(services).astype(np.int64).tolist(), 0

    def _take(self, t: int, service: int) -> int:
        start = max(t, heapq.heappop(self.free))
        heapq.heappush(self.free, start + service)
        return start

    def _background_until(self, t: int) -> None:
        if self._peak <= 0:
            return
        while True:
            if self._next >= len(self._arrivals):
                self._draw()
                continue
            at = self._arrivals[self._next]
            if at > t:
                return
            self._take(at, self._services[self._next])
            self._next += 1

    def serve(self, t: int, service_ns: int, waiting_since: int | None = None) -> int:
        """A call arriving at t that needs `service_ns`: when its service starts. A call that has been waiting
        upstream (in a global queue) since `waiting_since` goes before background calls that came after it."""
        self._background_until(t if waiting_since is None else waiting_since)
        return self._take(t, service_ns)

    def next_free(self, waiting_since: int) -> int:
        """When the first worker is free for a call waiting since `waiting_since` (background calls that came
        later wait behind it)."""
        self._background_until(waiting_since)
        return self.free[0]


def _background_ms(windows: list[FaultWindow], base_ms: float) -> Callable[[np.ndarray], np.ndarray]:
    """Mean service time (ms) of background calls arriving at given times: the latency faults that act on every
    caller (no `tenant`) slow them as they slow traced calls."""
    shared = [w for w in windows if not w.fault.params.get("tenant", "")]

    def mean(times: np.ndarray) -> np.ndarray:
        out = np.full(len(times), base_ms)
        for w in shared:
            ramp = float(w.fault.params.get("ramp_s", 0.0)) * 1e9
            level = np.clip((times - w.start_ns) / ramp, 0.0, 1.0) if ramp > 0 else 1.0
            level = np.where((times >= w.start_ns) & (times < w.end_ns), level, 0.0)
            out += (base_ms * (w.fault.param("factor") - 1.0) + w.fault.param("extra_ms")) * level
        return out

    return mean


class _Served:
    """What auth and the router share: the instance's own service time under its faults, its workers (and
    their background load), and its timeout."""

    def __init__(self, spec: AuthSpec | RouterSpec, faults: list[FaultWindow], seed: int,
                 diurnal: DiurnalSpec | None, epoch_ns: int) -> None:
        self.spec = spec
        self.faults = faults
        self._rng = random.Random(seed)
        self.pool = (WorkerPool(spec.workers, spec.background_rps, _background_ms(faults, spec.latency_ms),
                                spec.jitter, seed, diurnal, epoch_ns) if spec.workers else None)
        self.emitter: Emitter | None = None

    def _served(self, t: int, service: int, status: int, waiting_since: int | None = None) -> tuple[int, int, int]:
        """(span latency ns, time waiting for a worker ns, status) of a call arriving at t: the wait and the
        service, cut at the timeout (504)."""
        start = self.pool.serve(t, service, waiting_since) if self.pool is not None else t
        wait = start - t
        timeout = round(self.spec.timeout_ms * 1e6)
        if timeout and wait + service > timeout:
            return timeout, min(wait, timeout), 504
        return wait + service, wait, status

    def queue_attributes(self, wait: int) -> Attributes:
        return {sc.COMPONENT_QUEUE_NS: wait} if self.pool is not None else {}


class Auth(_Served):
    def __init__(self, spec: AuthSpec, faults: list[FaultWindow], seed: int, diurnal: DiurnalSpec | None = None,
                 epoch_ns: int = DEFAULT_EPOCH_NS) -> None:
        super().__init__(spec, faults, seed, diurnal, epoch_ns)
        self.denied = frozenset(spec.denied_tenants)

    def check(self, t: int, tenant: str) -> tuple[int, int, int]:
        """(latency ns, wait ns, HTTP status: 200, 401, 503 when a degraded auth fails the call, or 504 past its
        timeout)."""
        mean, error_rate = (_degraded(self.faults, t, tenant, self.spec.latency_ms) if self.faults
                            else (self.spec.latency_ms, 0.0))
        status = 503 if error_rate and self._rng.random() < error_rate else 200
        service = _latency_ns(self._rng, mean, self.spec.jitter)
        if tenant in self.denied:
            status = 401
        return self._served(t, service, status)


class RateLimiter:
    """A token bucket per tenant: `requests_per_s` refill, `burst` capacity; one request takes one token."""

    def __init__(self, spec: RateLimiterSpec, faults: list[FaultWindow], seed: int) -> None:
        self.spec = spec
        self.faults = faults
        self._rng = random.Random(seed)
        self._tokens: dict[str, float] = {}
        self._last: dict[str, int] = {}
        self.emitter: Emitter | None = None

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

    def _rejects(self, t: int, tenant: str) -> bool:
        """Whether a rejections fault turns this call away, whatever the bucket holds."""
        share = max((w.fault.param("share") for w in self.faults
                     if w.fault.kind == "rate_limiter_rejections" and _hits(w, t, tenant)), default=0.0)
        return bool(share) and self._rng.random() < share

    def admit(self, t: int, tenant: str) -> tuple[int, int]:
        """(latency ns, HTTP status: 200 or 429)."""
        if self.faults and self._rejects(t, tenant):
            return _latency_ns(self._rng, self.spec.latency_ms), 429
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


class Router(_Served):
    def __init__(self, spec: RouterSpec, faults: list[FaultWindow], seed: int, diurnal: DiurnalSpec | None = None,
                 epoch_ns: int = DEFAULT_EPOCH_NS) -> None:
        super().__init__(spec, faults, seed, diurnal, epoch_ns)
        self._next: dict[str, int] = {}  # round-robin position per model

    def route(self, t: int, tenant: str = "", waiting_since: int | None = None) -> tuple[int, int, int]:
        """(latency ns, wait ns, HTTP status: 200, 503 when a degraded router fails the request, or 504 past its
        timeout). `waiting_since`: when a request released by a global queue entered it."""
        mean, error_rate = _degraded(self.faults, t, tenant, self.spec.latency_ms)
        status = 503 if error_rate and self._rng.random() < error_rate else 200
        return self._served(t, _latency_ns(self._rng, mean, self.spec.jitter), status, waiting_since)

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

    Requests take HTTP-style outcomes: 401 from auth, 429 from the rate limiter, 503 from a failing auth or
    router, 504 past a component's timeout or the gateway's (the engine is not aborted), 500 when an engine
    rejects the request or (an assistant-prefill fault in "fail" mode) its output breaks the response format.
    Several instances of a kind serving a request's model (and tenant) share its requests by a hash of the
    request id. A tenant whose clients retry sends a 429, 503 or 504 answered before the router again after a
    backoff: a new request (and trace) whose gateway span carries `http.request.resend_count`."""

    def __init__(self, spec: FleetSpec, windows: dict[str, list[FaultWindow]], sink: SpanSink | None, seed: int,
                 summary: FleetSummary, epoch_ns: int = DEFAULT_EPOCH_NS, naming: GatewayNaming | None = None,
                 emit_kv_transfer: bool = True) -> None:
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
        # model -> the instances of each kind that serve it
        self.auth: dict[str, list[Auth]] = {}
        self.limiter: dict[str, list[RateLimiter]] = {}
        self.router: dict[str, list[Router]] = {}
        self.queue: dict[str, tuple[GlobalQueue, Emitter]] = {}
        for i, a in enumerate(spec.auth):
            auth = Auth(a, windows.get(a.id, []), seed * 100 + i, spec.diurnal, epoch_ns)
            auth.emitter = emitter(a.id, "auth", "auth")
            for m in a.models:
                self.auth.setdefault(m, []).append(auth)
        for i, r in enumerate(spec.rate_limiters):
            limiter = RateLimiter(r, windows.get(r.id, []), seed * 100 + 20 + i)
            limiter.emitter = emitter(r.id, "rate_limiter", "rate-limiter")
            for m in r.models:
                self.limiter.setdefault(m, []).append(limiter)
        for i, r in enumerate(spec.routers):
            router = Router(r, windows.get(r.id, []), seed * 100 + 40 + i, spec.diurnal, epoch_ns)
            router.emitter = emitter(r.id, "router", "router")
            for m in r.models:
                self.router.setdefault(m, []).append(router)
        for q in spec.global_queues:
            queue = (GlobalQueue(q, windows.get(q.id, [])), emitter(q.id, "scheduler", "global-queue"))
            self.queue.update(dict.fromkeys(q.models, queue))
        self.links = {link.id: Link(link, windows.get(link.id, [])) for link in spec.links}
        self.link_of = {m.name: self.links[m.disaggregation.link] for m in spec.models if m.disaggregation}
        # kv_transfer spans go out with the decode worker's resource (the decode side pulls): its emitter
        self.kv_emitters: dict[str, Emitter] = {}
        self._calls: dict[int, Call] = {}  # id(engine request) -> its call
        self._wakes: set[tuple[str, int]] = set()
        self._clients: dict[str, TenantSpec] = {t.name: t for t in spec.tenants if t.retries}
        self._retry_rng = random.Random(f"retries-{seed}")
        self._retries: list[tuple[int, int, Request]] = []  # a heap of retries not yet arrived
        self._attempt: dict[str, int] = {}  # retry's request id -> its resend count

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

    @staticmethod
    def _serving(group: dict[str, list[Any]], r: Request) -> Any:
        """The instance of a kind that serves the request: those serving its model and tenant share requests by a
        hash of the request id (a load balancer in front of them); None when none serves it."""
        serving = [c for c in group.get(r.model, ()) if not c.spec.tenants or r.tenant in c.spec.tenants]
        if len(serving) <= 1:
            return serving[0] if serving else None
        return serving[zlib.crc32(r.request_id.encode()) % len(serving)]

    def arrivals(self, requests: list[Request]) -> Iterator[Request]:
        """The requests in arrival order, with the retries their clients decide on (at `admit`) merged in."""
        for r in requests:
            while self._retries and self._retries[0][0] <= r.arrival_ns:
                yield self._retried()
            yield r
        while self._retries:
            yield self._retried()

    def _retried(self) -> Request:
        retry = heapq.heappop(self._retries)[2]
        self.summary.per_model[retry.model] = self.summary.per_model.get(retry.model, 0) + 1
        return retry

    def _retry(self, r: Request, t: int, status: int) -> None:
        """The client may send the request again after a 429, 503 or 504: after its backoff, doubling with each
        attempt, with ±50% jitter."""
        client = self._clients.get(r.tenant)
        attempt = self._attempt.get(r.request_id, 0)
        if client is None or status not in RETRIED_STATUSES or attempt >= client.retries:
            return
        delay = client.retry_backoff_s * 2 ** attempt * self._retry_rng.uniform(0.5, 1.5)
        origin = r.request_id.rsplit("-retry", 1)[0] if attempt else r.request_id
        retry = Request(f"{origin}-retry{attempt + 1}", t + round(delay * 1e9), r.prompt, r.output_tokens,
                        r.max_tokens, tenant=r.tenant, model=r.model, system_prompt_id=r.system_prompt_id,
                        system_prompt_tokens=r.system_prompt_tokens,
                        assistant_prefill_tokens=r.assistant_prefill_tokens)
        self._attempt[retry.request_id] = attempt + 1
        heapq.heappush(self._retries, (retry.arrival_ns, len(self._attempt), retry))

    def admit(self, r: Request) -> tuple[Call, int] | None:
        """Auth and rate limiting: the admitted call and when it reaches the global queue or the router, or
        None when it was rejected (and answered). Both depend on the arrivals alone, not on the engines."""
        call = Call(r, self._rng.getrandbits(128) or 1, self._span_id())
        t = r.arrival_ns
        auth: Auth | None = self._serving(self.auth, r)
        if auth is not None:
            latency, wait, status = auth.check(t, r.tenant)
            outcome = {200: "ok", 401: "rejected", 504: "timeout"}.get(status, "error")
            assert auth.emitter is not None
            self._component_span(auth.emitter, call, sc.SPAN_AUTH, t, t + latency, status, outcome,
                                 auth.queue_attributes(wait))
            t += latency
            if status != 200:
                self.finish(call, t, status, {401: "unauthorized", 504: "timeout"}.get(status, "auth_error"))
                self._retry(r, t, status)
                return None
        limiter: RateLimiter | None = self._serving(self.limiter, r)
        if limiter is not None:
            latency, status = limiter.admit(t, r.tenant)
            outcome = "ok" if status == 200 else "rejected"
            assert limiter.emitter is not None
            self._component_span(limiter.emitter, call, sc.SPAN_RATE_LIMIT, t, t + latency, status, outcome)
            t += latency
            if status != 200:
                self.finish(call, t, status, "rate_limited")
                self._retry(r, t, status)
                return None
        return call, t

    def route(self, call: Call, t: int, candidates: list[Any]) -> Dispatch | None:
        """Pick a replica among `candidates` (Targets); None when the router failed the request (answered)."""
        r, m = call.request, call.model
        router: Router | None = self._serving(self.router, r)
        prefix = r.system_prompt_id or r.prompt.segments[0][0]
        if router is None:
            target = min(candidates, key=lambda c: c.inflight)
            dispatch = t
        else:
            assert router.emitter is not None
            latency, wait, status = router.route(t, r.tenant, call.gq_enter_ns if self.queue.get(m) else None)
            queued = router.queue_attributes(wait)
            if status != 200:
                outcome = "timeout" if status == 504 else "error"
                self._component_span(router.emitter, call, sc.SPAN_ROUTE, t, t + latency, status, outcome, queued)
                self.finish(call, t + latency, status, "timeout" if status == 504 else "router_error")
                return None
            target = candidates[router.pick(m, [c.inflight for c in candidates], prefix)]
            call.parent_span = self._component_span(router.emitter, call, sc.SPAN_ROUTE, t, t + latency, 200, "ok",
                                                    {sc.ROUTE_TARGET: target.instance_id, **queued})
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

    def _blocked_until(self, queue: GlobalQueue, call: Call, t: int) -> int | None:
        """When the queue can next release `call` if it cannot at t: the end of a stall, or when a worker of the
        router it goes to is free (backpressure: the router's backlog waits in the queue)."""
        stalled = queue.stalled_until(t)
        if stalled is not None:
            return stalled
        router: Router | None = self._serving(self.router, call.request)
        if router is not None and router.pool is not None:
            free = router.pool.next_free(call.gq_enter_ns)
            return free if free > t else None
        return None

    def release(self, m: str, t: int, targets: list[Any]) -> tuple[list[Dispatch], int | None]:
        """Route what the global queue can release at t to replicas with room: (the dispatches, and when a
        blocked queue wakes if this call is the first to find it blocked until then)."""
        queue, emitter = self.queue[m]
        held = queue.held[m]
        dispatches: list[Dispatch] = []
        while held:
            blocked = self._blocked_until(queue, held[0], t)  # type: ignore[arg-type]
            if blocked is not None:
                if (queue.spec.id, blocked) in self._wakes:
                    return dispatches, None
                self._wakes.add((queue.spec.id, blocked))
                return dispatches, blocked
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
        attempt = self._attempt.get(r.request_id)
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
        if attempt:
            attributes[sc.HTTP_RESEND_COUNT] = attempt
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
        for group in (self.auth, self.limiter, self.router):
            emitters += [c.emitter for instances in group.values() for c in instances]
        emitters += [e for _, e in self.queue.values()]
        seen: set[int] = set()
        for e in emitters:
            if id(e) not in seen:
                seen.add(id(e))
                e.flush()
