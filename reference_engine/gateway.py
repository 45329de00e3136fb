"""The shared components in front of the engines: auth, a rate limiter (a token bucket per tenant, shared by
every model it serves), a router (round-robin, least-loaded or prefix-aware) and a global queue.

Each component decides with its own state at a given time on the fleet's virtual clock, and says how long it
took. Faults act here, on the mechanism: a slow component takes longer, a flapping limiter enforces a
lower limit, a stalled queue releases nothing.
"""

from __future__ import annotations

import random
import zlib
from collections import deque
from dataclasses import dataclass

from reference_engine.fleet_config import (
    AuthSpec,
    FaultSpec,
    GlobalQueueSpec,
    RateLimiterSpec,
    RouterSpec,
)


@dataclass(frozen=True, slots=True)
class FaultWindow:
    start_ns: int
    end_ns: int
    fault: FaultSpec

    def active(self, t: int) -> bool:
        return self.start_ns <= t < self.end_ns


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
