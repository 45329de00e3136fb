"""Which candidate each troubled request's trouble came from, following cause and effect along its call path.

A request counts by its weight: 1 when it failed, was rejected or cut at `max_tokens`; for a slow one, its
robust latency score mapped from 0 (at SOFT_Z_LOW) to 1 (at SOFT_Z_HIGH, where a request is anomalous on its
own), so that a moderate slowdown of every request of a model counts as much as a large one of a few. Each
request's weight is spread over candidates:

1. **Where it went wrong.** A request that failed, timed out or was rejected is blamed on the hop that
   answered so (the component whose span says `error`, `timeout` or `rejected`; the engines for an engine error
   or a generation cut at `max_tokens`). A slow request (TTFT) is blamed on the hops whose own time rose, in
   proportion to each one's excess over its baseline median: a component's service time, its wait for a worker,
   a global queue's hold, a KV link's transfer, the engine's time to the first token (a disaggregated model's, per
   leg: the prefill pool's and the decode pool's, `pools.py`). A slow decode (time per output token) is the
   engine's.
2. **Why it went wrong there** (causal direction). A wait is a consequence, passed on to its cause:
   - a wait for a component's workers (and a timeout there) is shared between the component's own slowdown and
     the tenants whose traffic through it rose (load), in proportion to how much each raised the load on its
     workers (the log of its service time's rise; the log of 1 + the extra calls over the rest); with neither,
     it is the component's own (load nobody traces);
   - a global queue's hold goes downstream: to a router the queue releases to (the request's own, or another one
     whose backlog holds the head of the queue) or to the model's engines, whichever slowed for its own reasons
     (the larger effect); else to load on the model; else it is the queue's own (it stalled);
   - an engine's time to the first token goes to its engines (a leg's pool) when their steps are slower for the
     same work; else
     to load on the model; else to a global queue that held the request and released it in a burst;
   - a rate limiter's 429s for a tenant go, as far as the tenant's extra first attempts explain them, to that
     load; as far as retries explain them (one retry per failure of the tenant's requests elsewhere: an auth that
     timed out, a router that failed), to whatever those failures were blamed on; only the rest is the
     limiter's own (a limiter that rejects a tenant's usual traffic).
3. **Only what changed.** Slowness is blamed only on a candidate whose own telemetry changed significantly
   (`BlameContext.changed`); the rest is unexplained and blamed on nobody. A failure is blamed on the hop that
   failed it, always.

A candidate's blame share (blamed weight over the weight of all troubled requests) is what ranks it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from infertrace.analyzers.pools import Pool

ENGINE_QUEUEING = "engine queueing at "  # how blame that came through an engine's (or a pool's) queue is named
COMPONENT_WORDS = {"auth": "auth", "rate_limiter": "rate-limit", "router": "route", "scheduler": "global-queue",
                   "link": "KV-transfer"}
SOFT_Z_LOW = 1.0  # a request's latency score at which it starts to count as slow ...
SOFT_Z_HIGH = 3.5  # ... and where it counts fully (anomalous on its own)

Targets = list[tuple[str, float]]


@dataclass
class BlameContext:
    """What the blame rules need to know about the incident's candidates."""

    engines_of: dict[str, str]  # model -> its engines' candidate id
    significant: dict[str, float]  # candidate id -> effect of its largest significant own signal (not waits)
    changed: set[str] = field(default_factory=set)  # candidates with any significant own signal (waits too)
    loads: dict[str, float] = field(default_factory=dict)  # load candidate id -> extra first attempts (≥ 0)
    load_models: dict[str, set[str]] = field(default_factory=dict)  # load candidate id -> models its traffic rose on
    router_of: dict[int, str] = field(default_factory=dict)  # request row -> router instance it went through
    released_to: dict[str, set[str]] = field(default_factory=dict)  # global queue -> routers it releases to
    # what made a component's workers busier: log of its service time's rise (when significant), and per load
    # through it, log(1 + its extra calls there / the rest of its calls there)
    service_rise: dict[str, float] = field(default_factory=dict)
    load_through: dict[str, dict[str, float]] = field(default_factory=dict)
    strict: bool = True  # blame slowness only on what changed; False: on the hop, whatever (to find candidates)
    pool_of: dict[str, Pool] = field(default_factory=dict)  # engine instance -> its pool (pools.py)


@dataclass(frozen=True)
class Blamed:
    """Blame of an incident's troubled requests: one row per (request, target) with its weight, the hop it
    started at, and how it got to the target."""

    rows: pd.DataFrame  # columns: req (the request's row), target, weight, source, how
    weight: float  # total weight of the troubled requests (the denominator of a share)

    def mass(self) -> dict[str, float]:
        return self.rows.groupby("target")["weight"].sum().to_dict() if len(self.rows) else {}


def soft_weight(score: np.ndarray) -> np.ndarray:
    """How much a slow request counts: 0 up to SOFT_Z_LOW, rising linearly to 1 at SOFT_Z_HIGH."""
    return np.clip((score - SOFT_Z_LOW) / (SOFT_Z_HIGH - SOFT_Z_LOW), 0.0, 1.0)


def _excess(values: np.ndarray, instances: np.ndarray, baseline: dict[str, float]) -> np.ndarray:
    base = np.array([baseline.get(i, np.nan) for i in instances], dtype=float)
    return np.where(np.isfinite(base), np.maximum(values - base, 0.0), 0.0)


def _rows(out: list[dict[str, object]], req: int, targets: Targets, weight: float, source: str, how: str) -> None:
    for target, fraction in targets:
        if weight * fraction > 0:
            out.append({"req": req, "target": target, "weight": weight * fraction, "source": source,
                        "how": "own" if target == source else how})


def blame_requests(troubled: pd.DataFrame, hops: pd.DataFrame, engine_rows: pd.DataFrame,
                   service_base: dict[str, float], wait_base: dict[str, float], engine_base: dict[str, float],
                   rejections: Callable[[str, str], Targets], ctx: BlameContext) -> Blamed:
    """Blame for each troubled request (`troubled`: req, model, tenant, reason, http_status, weight) over its hops
    (`hops`: request_paths rows of those requests, with `req`, the request's row) and engine rows (`engine_rows`:
    engine_requests rows, with `req`), given the baseline medians of each instance's service time, wait and
    engine TTFT. `rejections(limiter, tenant)` says where a limiter's 429s for a tenant go (module docstring)."""
    out: list[dict[str, object]] = []
    comp = hops[hops["kind"] != "engine"]
    req = comp["req"].to_numpy()
    kinds = comp["kind"].to_numpy(dtype=object)
    instances = comp["instance"].to_numpy(dtype=object)
    outcomes = comp["outcome"].to_numpy(dtype=object)
    queue = comp["queue_ns"].to_numpy(dtype=float, na_value=np.nan)
    queue = np.where(np.isfinite(queue), queue, 0.0)
    latency = comp["latency_ns"].to_numpy(dtype=float)
    scheduler = kinds == "scheduler"
    service_excess = np.where(scheduler, 0.0, _excess(latency - queue, instances, service_base))
    wait_excess = _excess(np.where(scheduler, latency, queue), instances, wait_base)
    held_by = {int(r): i for r, i, s, we in zip(req, instances, scheduler, wait_excess, strict=True) if s and we > 0}
    failing_by: dict[int, tuple[str, str, str]] = {}
    hops_by: dict[int, list[tuple[str, str, float, float]]] = defaultdict(list)
    for r, i, k, o, se, we in zip(req.tolist(), instances, kinds, outcomes, service_excess.tolist(),
                                  wait_excess.tolist(), strict=True):
        if o in ("error", "timeout", "rejected"):
            failing_by[r] = (i, k, o)
        hops_by[r].append((i, k, se, we))
    engine_excess: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # req -> pool -> excess
    engine_req = engine_rows["req"].to_numpy()
    engine_instances = engine_rows["instance"].to_numpy(dtype=object)
    excess = _excess(engine_rows["engine_ttft_ns"].to_numpy(dtype=float), engine_instances, engine_base)
    for r, i, e in zip(engine_req.tolist(), engine_instances, excess.tolist(), strict=True):
        pool = ctx.pool_of.get(i)
        engine_excess[r][pool.id if pool else ""] += e  # a disaggregated model's leg: its pool ("": the engines)
    engine_failed = set(engine_req[engine_rows["failed"].to_numpy(dtype=bool, na_value=False)].tolist())

    deferred = []  # rejections: resolved once the failures that trigger retries are known
    columns = (troubled[c].to_numpy(dtype=object) for c in ("req", "model", "tenant", "reason", "http_status",
                                                             "weight"))
    for r, model, tenant, reason, status, weight in zip(*columns, strict=True):
        engines_id = ctx.engines_of.get(model, f"{model} engines")
        if r in failing_by:
            instance, kind, outcome = failing_by[r]
            if outcome == "rejected" and kind == "rate_limiter":
                deferred.append((r, instance, tenant, weight))
            elif outcome == "timeout":
                _rows(out, r, _wait_cause(instance, ctx, direct=True), weight, instance, f"timeouts at {instance}")
            else:
                _rows(out, r, [(instance, 1.0)], weight, instance, "own")
            continue
        if reason == "truncated" or (reason == "error" and (r in engine_failed or status != 504)):
            # an engine error, or an answer the server could not use (no component failed it)
            _rows(out, r, [(engines_id, 1.0)], weight, engines_id, "own")
            continue
        if reason == "tpot":
            _rows(out, r, _engine_cause(model, engines_id, None, ctx), weight, engines_id,
                  f"decode time at {engines_id}")
            continue
        parts: list[tuple[str, str, float]] = []  # (source, mode, excess)
        for instance, kind, s_excess, w_excess in hops_by.get(r, ()):
            if kind == "scheduler":
                parts.append((instance, "hold", w_excess))
            else:
                parts.append((instance, "service", s_excess))
                parts.append((instance, "wait", w_excess))
        parts += [(pool or engines_id, "engine", e) for pool, e in engine_excess.get(r, {}).items()]
        total = sum(p[2] for p in parts)
        if total <= 0:
            continue  # nothing on its path was slower than usual: unexplained, blamed on nobody
        for source, mode, amount in parts:
            if amount <= 0:
                continue
            if mode == "service":
                targets, how = _own(source, ctx), "own"
            elif mode == "wait":
                targets, how = _wait_cause(source, ctx), f"wait at {source}"
            elif mode == "hold":
                targets, how = _hold_cause(source, model, engines_id, ctx.router_of.get(r), ctx), f"hold in {source}"
            else:
                targets = _engine_cause(model, engines_id, held_by.get(r), ctx, pool=source)
                how = ENGINE_QUEUEING + source
            _rows(out, r, targets, weight * amount / total, source, how)

    for r, instance, tenant, weight in deferred:
        _rows(out, r, rejections(instance, tenant), weight, instance, f"429s at {instance}")
    rows = pd.DataFrame(out, columns=["req", "target", "weight", "source", "how"])
    return Blamed(rows, float(troubled["weight"].sum()))


def _own(candidate: str, ctx: BlameContext) -> Targets:
    """Slowness at a candidate's own hop: its own, if its telemetry changed (or when finding candidates)."""
    return [(candidate, 1.0)] if candidate in ctx.changed or not ctx.strict else []


def _loads_on(model: str, ctx: BlameContext) -> Targets:
    loads = [(lid, extra) for lid, extra in ctx.loads.items() if model in ctx.load_models.get(lid, ())]
    total = sum(extra for _, extra in loads)
    return [(lid, extra / total) for lid, extra in loads] if total > 0 else []


def _wait_cause(instance: str, ctx: BlameContext, direct: bool = False) -> Targets:
    """A wait for a component's workers (or a timeout there, `direct`: the component answered it): its own
    slowdown and the loads through it, each by how much it raised the load on the workers; the component itself
    when neither changed."""
    weights = [(instance, ctx.service_rise.get(instance, 0.0)), *ctx.load_through.get(instance, {}).items()]
    total = sum(w for _, w in weights if w > 0)
    if total > 0:
        return [(target, w / total) for target, w in weights if w > 0]
    return [(instance, 1.0)] if direct else _own(instance, ctx)


def _hold_cause(queue: str, model: str, engines_id: str, router: str | None, ctx: BlameContext) -> Targets:
    """A global queue's hold: what downstream slowed for its own reasons, else load, else the queue. The queue
    is first in, first out: a request for one router waits behind the head of the queue bound for another."""
    routers = ctx.released_to.get(queue, set()) | ({router} if router is not None else set())
    downstream = [(c, ctx.significant[c]) for c in (*sorted(routers), engines_id) if c in ctx.significant]
    if downstream:
        return [(max(downstream, key=lambda x: x[1])[0], 1.0)]
    if not ctx.strict and router is not None:
        # finding candidates: the router the queue released the request to may be what held it, though its
        # change shows only over the time it held requests (its calls were few then: the backlog waited here)
        return [(router, 0.5), (queue, 0.5)]
    return _loads_on(model, ctx) or _own(queue, ctx)


def _engine_cause(model: str, engines_id: str, held_in: str | None, ctx: BlameContext,
                  pool: str | None = None) -> Targets:
    """An engine's slow first token or decode: the engines when they are slower for their work (for a
    disaggregated model's leg, the pool that served it, if that pool slowed and its other pool did not: both
    slowed is the model's engines), else load on the model, else a global queue's burst, else unexplained (the
    engines or the pool, when finding candidates)."""
    if pool is not None and pool != engines_id and pool in ctx.significant:
        others = {p.id for p in ctx.pool_of.values() if p.id != pool and p.model == model}
        both = engines_id in ctx.significant and bool(others & ctx.significant.keys())
        return [(engines_id if both else pool, 1.0)]
    if engines_id in ctx.significant:
        return [(engines_id, 1.0)]
    loads = _loads_on(model, ctx)
    if loads:
        return loads
    if held_in is not None and (held_in in ctx.changed or not ctx.strict):
        return [(held_in, 1.0)]
    return _own(pool or engines_id, ctx) if not ctx.strict else []
