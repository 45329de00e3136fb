"""Root-cause families on large, irregular fleets: the incidents that fool a ranker which only asks "whose own
spans changed most?".

The fleets (`large_fleet`) look like production rather than a diagram: 5–6 models of 1–2 replicas; two auth
instances and two or three routers, each serving an overlapping set of models (a request of a model that
several serve goes to one of them by a hash of its id); a rate limiter per tenant; auth and some routers with a
pool of workers shared with untraced background load (calls from other callers), so they queue a little all
the time; traffic that follows a diurnal curve; clients that retry a 429, 503 or 504 after a backoff.

Families (what happens; the root cause; what fools a naive ranker):

- `slow_ramp`: an auth or router instance slows ×3–6 over 3–6 minutes for one tenant's calls (the shard that
  holds its keys degrades); the component; the early ramp looks like baseline, and the component's own change is
  small (most of its calls are other tenants', unchanged) and gradual, while a bystander model's engines step up
  ×2.5–4 partway into the ramp and stay slow past its end: a sharp change, the largest own anomaly in sight.
- `partial_failure`: an auth or router answers 503 to 4–15% of calls, or a tenant's limiter 429 to 10–25%,
  latency unchanged; the component; its change is bounded by the failing share.
- `backpressure`: a router with few workers and jittery service slows ×1.8–2.5; its backlog waits in the global
  queue in front of it; the router; the queue's wait rises far more than the router's time.
- `retry_storm`: an auth instance slows ×2.5–4; calls time out, clients retry, retries trip the tenants' limiters;
  the auth; the limiters' 429s.
- `engine_noise`: a router or auth adds 150–600 ms to one tenant's calls (its keys on a slow replica or cache
  shard); meanwhile, from a little before to a little after, the engines of a model that tenant sends through it
  slow ×2–3.5 on their own (a noisy, innocent engine); the component; the engines' own anomaly (every step
  slower for its work) is larger than the component's (one tenant's share of its calls).
- `overlapping`: two unrelated culprits with onsets 20–150 s apart: a component, and another component or a
  model's engines; both; one of the two is never first.
- `load`: one tenant sends ×4–8 its traffic (to all its models, or one); load from that tenant; its limiter's
  429s and the engines' queueing.

Every scenario also gets the bank's usual confounders (docs/fleet.md). The ground truth names every culprit in
`root_causes` (each with its window) and the components expected to look anomalous without being the cause in
`symptoms`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from reference_engine.fleet.config import (
    AuthSpec,
    DiurnalSpec,
    FaultSpec,
    FleetSpec,
    GlobalQueueSpec,
    ModelDeployment,
    RateLimiterSpec,
    RouterSpec,
    TenantSpec,
)
from reference_engine.workload import SyntheticWorkload

LARGE_FAMILIES = ("slow_ramp", "partial_failure", "backpressure", "retry_storm", "engine_noise", "overlapping",
                  "load")
# Shortest run each family needs (a baseline, the fault, and some of its aftermath, the fault under a third
# of it); a bank's duration is raised to it.
MIN_DURATION_S = {family: 1000.0 if family == "slow_ramp" else 600.0 for family in LARGE_FAMILIES}

# (model, tensor parallel): what the large fleets draw their models from
LARGE_MODEL_CHOICES = (("llama-3-8b", 1), ("qwen-2.5-1.5b", 1), ("mixtral-8x7b", 2), ("llama-3-70b", 4),
                       ("small", 1), ("tiny", 1))


# ------------------------------------------------------------------------------------------ topology
def _overlapping_sets(rng: random.Random, names: list[str], parts: int) -> list[tuple[str, ...]]:
    """`parts` sets of models covering them all, each a partition block plus one or two models of another."""
    shuffled = names[:]
    rng.shuffle(shuffled)
    blocks: list[list[str]] = [shuffled[i::parts] for i in range(parts)]
    for i, block in enumerate(blocks):
        others = [m for j, b in enumerate(blocks) if j != i for m in b]
        for m in rng.sample(others, min(len(others), rng.randint(1, 2))):
            if m not in block:
                block.append(m)
    return [tuple(sorted(b, key=names.index)) for b in blocks if b]


def _traced_rps(fleet_rates: dict[str, float], models: tuple[str, ...], sharing: dict[str, int]) -> float:
    """Requests per second a component serving `models` receives, each model's traffic split evenly over the
    instances of that kind that serve it."""
    return sum(fleet_rates[m] / sharing[m] for m in models)


def _background(rng: random.Random, traced: float, workers: int, latency_ms: float, util: float) -> float:
    """Untraced calls per second that bring the component's workers to `util` of their capacity."""
    return round(max(util * workers / (latency_ms / 1e3) - traced, 0.0), 2)


def model_rates(fleet: FleetSpec) -> dict[str, float]:
    """Requests per second the fleet's synthetic tenants send to each model (at the diurnal mean)."""
    rates = dict.fromkeys(fleet.model_names, 0.0)
    for t in fleet.tenants:
        total = sum(t.models.values())
        for m, w in t.models.items():
            rates[m] += t.synthetic.rate * w / total
    return rates


def _sharing(fleet_models: list[str], groups: tuple[Any, ...]) -> dict[str, int]:
    return {m: max(sum(m in c.models for c in groups), 1) for m in fleet_models}


def large_fleet(rng: random.Random, name: str) -> FleetSpec:
    """A random production-like topology (module docstring)."""
    chosen = sorted(rng.sample(LARGE_MODEL_CHOICES, rng.randint(5, 6)), key=LARGE_MODEL_CHOICES.index)
    models = []
    for model, tp in chosen:
        engine: dict[str, Any] = {"tensor_parallel": tp} if tp > 1 else {}
        if rng.random() < 0.6:
            engine.update(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=rng.choice([1024, 2048]))
        models.append(ModelDeployment(model, rng.choice([1, 1, 2]), "H100-SXM", "us-east-1", engine))
    names = [m.name for m in models]
    load = {m.name: m.replicas * rng.uniform(0.8, 1.6) for m in models}
    tenant_names = [f"tenant-{chr(ord('a') + i)}" for i in range(rng.randint(4, 6))]
    reach: dict[str, set[str]] = {t: set(rng.sample(names, rng.randint(2, 4))) for t in tenant_names}
    for m in names:
        if not any(m in r for r in reach.values()):
            reach[rng.choice(tenant_names)].add(m)
    senders = {m: [t for t in tenant_names if m in reach[t]] for m in names}
    tenants = []
    for t in tenant_names:
        share = {m: load[m] / len(senders[m]) for m in names if m in reach[t]}
        workload = SyntheticWorkload(
            rate=round(sum(share.values()), 3), prompt_mean=float(rng.choice([400, 700, 1000])),
            output_mean=float(rng.choice([80, 120, 180])), max_tokens=1024, tenants=(t,),
            system_prompts_per_tenant=2, system_prompt_tokens=rng.choice([256, 512, 1024]),
            system_prompt_fraction=round(rng.uniform(0.4, 0.8), 2), assistant_prefill_fraction=0.05)
        tenants.append(TenantSpec(t, {m: round(w, 4) for m, w in share.items()}, "synthetic", workload,
                                  retries=rng.choice([2, 3]), retry_backoff_s=round(rng.uniform(0.5, 2.0), 2)))
    fleet = FleetSpec(name, "us-east-1", tuple(models), tuple(tenants))
    rates = model_rates(fleet)

    auth_sets = _overlapping_sets(rng, names, 2)
    auth_sharing = _sharing(names, tuple(AuthSpec("", s) for s in auth_sets))
    auth = []
    for i, served in enumerate(auth_sets):
        latency, workers = round(rng.uniform(10, 25), 2), rng.randint(4, 8)
        background = _background(rng, _traced_rps(rates, served, auth_sharing), workers, latency,
                                 rng.uniform(0.2, 0.4))
        auth.append(AuthSpec(f"auth-{i}", served, latency, workers=workers, background_rps=background,
                             jitter=round(rng.uniform(0.25, 0.4), 2), timeout_ms=2000.0))
    router_sets = _overlapping_sets(rng, names, rng.randint(2, 3))
    router_sharing = _sharing(names, tuple(RouterSpec("", s) for s in router_sets))
    routers = []
    for i, served in enumerate(router_sets):
        latency = round(rng.uniform(1, 6), 2)
        policy = rng.choice(["round_robin", "least_loaded", "prefix_aware"])
        if rng.random() < 0.5:
            latency, workers = round(rng.uniform(8, 20), 2), rng.randint(2, 6)
            background = _background(rng, _traced_rps(rates, served, router_sharing), workers, latency,
                                     rng.uniform(0.2, 0.4))
            routers.append(RouterSpec(f"router-{i}", served, policy, latency, workers=workers,
                                      background_rps=background, jitter=round(rng.uniform(0.25, 0.6), 2)))
        else:
            routers.append(RouterSpec(f"router-{i}", served, policy, latency,
                                      jitter=round(rng.uniform(0.25, 0.6), 2)))
    limiters = tuple(RateLimiterSpec(f"limit-{t.name}", tuple(names), latency_ms=round(rng.uniform(0.3, 1), 2),
                                     requests_per_s=round(t.synthetic.rate * rng.uniform(2.0, 2.6), 2),
                                     burst=round(max(t.synthetic.rate * rng.uniform(4, 8), 10.0), 2),
                                     tenants=(t.name,))
                     for t in fleet.tenants)
    queues: tuple[GlobalQueueSpec, ...] = ()
    if rng.random() < 0.5:
        served = tuple(sorted(rng.sample(names, rng.randint(2, len(names) - 1)), key=names.index))
        queues = (GlobalQueueSpec("global-queue-0", served, max_inflight_per_engine=rng.choice([32, 48, 64])),)
    period = rng.choice([1800.0, 2400.0, 3600.0])
    diurnal = DiurnalSpec(round(rng.uniform(0.15, 0.3), 2), period, round(rng.uniform(0, period), 1))
    return replace(fleet, auth=tuple(auth), rate_limiters=limiters, routers=tuple(routers), global_queues=queues,
                   diurnal=diurnal)


def _resized(fleet: FleetSpec, component: AuthSpec | RouterSpec, util: float, **changes: Any) -> FleetSpec:
    """The fleet with `component` changed (latency, workers, jitter, ...) and its background load re-drawn so
    that its workers run at `util` of their capacity."""
    new = replace(component, **changes)
    kind = "auth" if isinstance(component, AuthSpec) else "routers"
    group = getattr(fleet, kind)
    sharing = _sharing(list(fleet.model_names), group)
    if new.workers:
        traced = _traced_rps(model_rates(fleet), new.models, sharing)
        new = replace(new, background_rps=round(max(util * new.workers / (new.latency_ms / 1e3) - traced, 0.0), 2))
    return replace(fleet, **{kind: tuple(new if c.id == component.id else c for c in group)})


def _component(fleet: FleetSpec, component_id: str) -> Any:
    return next(c for group in (fleet.auth, fleet.routers, fleet.rate_limiters, fleet.global_queues) for c in group
                if c.id == component_id)


def _engines(fleet: FleetSpec, model: str) -> list[str]:
    return [i for i, _ in fleet.engine_instances(model)]


def _cause(fleet: FleetSpec, fault: FaultSpec, kind: str) -> dict[str, Any]:
    """A culprit's ground truth: the instances the spans name, the models it serves, its window (from the
    start), and its ramp when it has one."""
    if kind == "engine":
        instances, models = _engines(fleet, fault.target), [fault.target]
    else:
        c = _component(fleet, fault.target)
        instances, models = [c.id], list(c.models)
    cause: dict[str, Any] = {"kind": kind, "instances": instances, "models": models,
                             "shared": kind in ("auth", "rate_limiter", "router", "scheduler"),
                             "fault": fault.kind, "window_s": [fault.start_s, fault.start_s + fault.duration_s]}
    if float(fault.params.get("ramp_s", 0.0)) > 0:
        cause["ramp_s"] = float(fault.params["ramp_s"])
    return cause


def _onset(rng: random.Random, duration_s: float) -> float:
    return round(rng.uniform(0.35, 0.5) * duration_s, 1)


def _length(rng: random.Random, duration_s: float, onset: float, lo: float = 120.0, hi: float = 200.0) -> float:
    return round(min(rng.uniform(lo, hi), duration_s * 0.9 - onset), 1)


# ------------------------------------------------------------------------------------------ families
@dataclass
class Drawn:
    """What a family draws: the fleet, the culprits' faults and their truth, the components expected to look
    anomalous without being the cause, the family's own confounders, and family-specific details."""

    fleet: FleetSpec
    faults: list[FaultSpec]
    causes: list[dict[str, Any]]
    symptoms: list[str] = field(default_factory=list)
    confounders: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def _slow_ramp(rng: random.Random, fleet: FleetSpec, duration_s: float) -> Drawn:
    component, tenant, share = _one_tenants_calls(rng, fleet)
    factor = round(rng.uniform(3.0, 6.0), 2)
    # A token introspection or a KV-index lookup: slow enough that its slowdown reaches the callers' TTFT.
    latency = round(rng.uniform(30, 60), 1)
    util = rng.uniform(0.12, 0.4)
    fleet = _resized(fleet, component, util, latency_ms=latency)
    component = _component(fleet, component.id)
    if component.workers:
        # the tenant's slower calls hold the workers longer: keep them below 85% busy at the full slowdown
        held = _tenant_rps(fleet, component, tenant) * latency / 1e3 / component.workers
        factor = round(max(2.0, min(factor, 1.0 + (0.85 - util) / max(held, 1e-6))), 2)
    ramp = round(rng.uniform(180, 360), 1)
    onset = round(rng.uniform(300, 400), 1)
    hold = round(min(rng.uniform(60, 120), duration_s * 0.92 - onset - ramp), 1)
    kind = "auth" if isinstance(component, AuthSpec) else "router"
    fault = FaultSpec(f"{kind}_latency", component.id, onset, ramp + hold,
                      {"extra_ms": 0.0, "factor": factor, "ramp_s": ramp, "tenant": tenant})
    # A bystander steps up during the ramp: a model the tenant sends through the component, its engines ×2.5–4 at
    # once from 20–50% into the ramp until after its end (a noisy neighbour on the GPU, a bad kernel autotune),
    # unrelated to the component: a sharp change beside a gradual one.
    model = rng.choice(_tenant_models(fleet, component, tenant))
    at = round(onset + ramp * rng.uniform(0.2, 0.5), 1)
    until = min(onset + ramp + hold + rng.uniform(0, 30), duration_s * 0.95)
    spike = FaultSpec("engine_slowdown", model, at, round(until - at, 1), {"factor": round(rng.uniform(2.5, 4.0), 2)})
    confounder = {"fault": spike, "kind": "engine", "instances": _engines(fleet, model), "models": [model]}
    cause = {**_cause(fleet, fault, kind), "for_tenant": tenant}
    return Drawn(fleet, [fault], [cause], confounders=[confounder],
                 details={"factor": factor, "base_latency_ms": latency, "tenant": tenant,
                          "tenant_share_of_calls": round(share, 3)})


def _partial_failure(rng: random.Random, fleet: FleetSpec, duration_s: float) -> Drawn:
    onset = _onset(rng, duration_s)
    length = _length(rng, duration_s, onset)
    kind = rng.choice(["auth", "router", "rate_limiter"])
    if kind == "rate_limiter":
        busiest = sorted(fleet.tenants, key=lambda t: -t.synthetic.rate)[:3]
        tenant = rng.choice(busiest)
        share = round(rng.uniform(0.10, 0.25), 3)
        fault = FaultSpec("rate_limiter_rejections", f"limit-{tenant.name}", onset, length, {"share": share})
        details = {"rejected_share": share}
    else:
        component = rng.choice(fleet.auth if kind == "auth" else fleet.routers)
        error_rate = round(rng.uniform(0.04, 0.15), 3)
        fault = FaultSpec(f"{kind}_latency", component.id, onset, length, {"extra_ms": 0.0, "error_rate": error_rate})
        details = {"error_rate": error_rate}
    return Drawn(fleet, [fault], [_cause(fleet, fault, kind)], details=details)


def _backpressure(rng: random.Random, fleet: FleetSpec, duration_s: float) -> Drawn:
    router = rng.choice(fleet.routers)
    factor = round(rng.uniform(1.8, 2.5), 2)
    # slowed, its workers run at 85–105% of their capacity: a backlog that grows and drains
    fleet = _resized(fleet, router, rng.uniform(0.85, 1.05) / factor, latency_ms=round(rng.uniform(8, 20), 2),
                     workers=rng.randint(2, 4), jitter=round(rng.uniform(0.5, 0.7), 2))
    queue = GlobalQueueSpec("global-queue-0", router.models, max_inflight_per_engine=64)
    fleet = replace(fleet, global_queues=(queue,))
    onset = _onset(rng, duration_s)
    fault = FaultSpec("router_latency", router.id, onset, _length(rng, duration_s, onset),
                      {"extra_ms": 0.0, "factor": factor})
    return Drawn(fleet, [fault], [_cause(fleet, fault, "router")], [queue.id], details={"factor": factor})


def _retry_storm(rng: random.Random, fleet: FleetSpec, duration_s: float) -> Drawn:
    auth = rng.choice(fleet.auth)
    fleet = _resized(fleet, auth, rng.uniform(0.3, 0.4), latency_ms=round(rng.uniform(15, 30), 1),
                     timeout_ms=round(rng.uniform(800, 1500), -1))
    # Impatient clients, and limits with less headroom: the retries are what trips the limiters.
    tenants = tuple(replace(t, retries=3, retry_backoff_s=round(rng.uniform(0.5, 1.0), 2)) for t in fleet.tenants)
    limiters = tuple(replace(r, requests_per_s=round(next(t.synthetic.rate for t in tenants if t.name in r.tenants)
                                                     * rng.uniform(1.6, 2.0), 2)) for r in fleet.rate_limiters)
    fleet = replace(fleet, tenants=tenants, rate_limiters=limiters)
    onset = _onset(rng, duration_s)
    factor = round(rng.uniform(2.5, 4.0), 2)
    fault = FaultSpec("auth_latency", auth.id, onset, _length(rng, duration_s, onset, 90, 180),
                      {"extra_ms": 0.0, "factor": factor})
    symptoms = [r.id for r in fleet.rate_limiters]
    return Drawn(fleet, [fault], [_cause(fleet, fault, "auth")], symptoms, details={"factor": factor})


def utilization(fleet: FleetSpec, component: AuthSpec | RouterSpec) -> float:
    """Share of its workers' capacity a component's traced and background calls use (at the diurnal mean)."""
    group = fleet.auth if isinstance(component, AuthSpec) else fleet.routers
    traced = _traced_rps(model_rates(fleet), component.models, _sharing(list(fleet.model_names), group))
    return (traced + component.background_rps) * component.latency_ms / 1e3 / max(component.workers, 1)


def _slowdown(rng: random.Random, fleet: FleetSpec, component: AuthSpec | RouterSpec) -> dict[str, Any]:
    """A latency fault's parameters: extra time per call, or for a component with workers (where extra time
    per call would saturate them at once) its service time multiplied enough to bring them to 95–115% of their
    capacity (at least ×2)."""
    if component.workers:
        factor = max(2.0, rng.uniform(0.95, 1.15) / max(utilization(fleet, component), 0.05))
        return {"extra_ms": 0.0, "factor": round(factor, 2)}
    return {"extra_ms": round(rng.uniform(150, 800), 1)}


def _component_latency(rng: random.Random, fleet: FleetSpec, onset: float, length: float) -> tuple[FaultSpec, str]:
    component = rng.choice([*fleet.auth, *fleet.routers])
    kind = "auth" if isinstance(component, AuthSpec) else "router"
    return FaultSpec(f"{kind}_latency", component.id, onset, length, _slowdown(rng, fleet, component)), kind


def _least_served(fleet: FleetSpec, component_id: str) -> str:
    """The model with the least of its traffic through the component (none, where one exists)."""
    component = _component(fleet, component_id)
    group = fleet.auth if isinstance(component, AuthSpec) else fleet.routers
    sharing = _sharing(list(fleet.model_names), group)
    names = list(fleet.model_names)
    return min(names, key=lambda m: ((m in component.models) / sharing[m], names.index(m)))


def _tenant_rps(fleet: FleetSpec, component: AuthSpec | RouterSpec, tenant: str) -> float:
    """Calls per second `tenant` sends through `component` (at the diurnal mean)."""
    group = fleet.auth if isinstance(component, AuthSpec) else fleet.routers
    sharing = _sharing(list(fleet.model_names), group)
    t = next(t for t in fleet.tenants if t.name == tenant)
    total = sum(t.models.values())
    return sum(t.synthetic.rate * w / total / sharing[m] for m, w in t.models.items() if m in component.models)


def _tenant_models(fleet: FleetSpec, component: AuthSpec | RouterSpec, tenant: str) -> list[str]:
    t = next(t for t in fleet.tenants if t.name == tenant)
    return [m for m in fleet.model_names if m in component.models and m in t.models]


def _one_tenants_calls(rng: random.Random, fleet: FleetSpec) -> tuple[AuthSpec | RouterSpec, str, float]:
    """An auth or router instance and one tenant whose calls through it a fault will slow: a tenant with 8–50% of
    the component's traced calls (so the fault is a part of its calls, and enough of them to matter), sending it
    at least two models where one does; (component, tenant, its share of the component's traced calls)."""
    pairs = []
    for component in (*fleet.auth, *fleet.routers):
        group = fleet.auth if isinstance(component, AuthSpec) else fleet.routers
        traced = _traced_rps(model_rates(fleet), component.models, _sharing(list(fleet.model_names), group))
        for t in fleet.tenants:
            share = _tenant_rps(fleet, component, t.name) / max(traced, 1e-9)
            models = len(_tenant_models(fleet, component, t.name))
            if models and 0.08 <= share <= 0.5:
                pairs.append((models >= 2, component, t.name, share))
    if not pairs:  # every tenant of every component outside 8–50%: the one closest to a third
        for component in (*fleet.auth, *fleet.routers):
            group = fleet.auth if isinstance(component, AuthSpec) else fleet.routers
            traced = _traced_rps(model_rates(fleet), component.models, _sharing(list(fleet.model_names), group))
            for t in fleet.tenants:
                if _tenant_models(fleet, component, t.name):
                    share = _tenant_rps(fleet, component, t.name) / max(traced, 1e-9)
                    pairs.append((False, component, t.name, share))
        pairs = [min(pairs, key=lambda p: abs(p[3] - 1 / 3))]
    wider = [p for p in pairs if p[0]] or pairs
    _, component, tenant, share = rng.choice(wider)
    return component, tenant, share


def _engine_noise(rng: random.Random, fleet: FleetSpec, duration_s: float) -> Drawn:
    onset = _onset(rng, duration_s)
    length = _length(rng, duration_s, onset)
    component, tenant, share = _one_tenants_calls(rng, fleet)
    extra = rng.uniform(150, 600)
    if component.workers:
        # the tenant's slower calls hold the workers longer: give the component the workers to keep them below
        # 85% busy (its background load re-drawn to keep its usual utilisation)
        util = utilization(fleet, component)
        held = _tenant_rps(fleet, component, tenant) * extra / 1e3
        workers = max(component.workers, int(held / max(0.85 - util, 0.1)) + 1)
        fleet = _resized(fleet, component, util, workers=workers)
        component = _component(fleet, component.id)
    kind = "auth" if isinstance(component, AuthSpec) else "router"
    fault = FaultSpec(f"{kind}_latency", component.id, onset, length, {"extra_ms": round(extra, 1), "tenant": tenant})
    # The noisy engine: one of the models the tenant sends through the component, so its engines sit on the same
    # requests' path, and its own anomaly (every step slower for its work) is larger than the component's.
    model = rng.choice(_tenant_models(fleet, component, tenant))
    # It is noisy throughout: from a little before the component's fault to a little after it.
    at = round(max(onset - rng.uniform(10, 40), 60.0), 1)
    until = min(onset + length + rng.uniform(20, 60), duration_s * 0.95)
    noise = FaultSpec("engine_slowdown", model, at, round(until - at, 1), {"factor": round(rng.uniform(2.0, 3.5), 2)})
    confounder = {"fault": noise, "kind": "engine", "instances": _engines(fleet, model), "models": [model]}
    cause = {**_cause(fleet, fault, kind), "for_tenant": tenant}
    return Drawn(fleet, [fault], [cause], confounders=[confounder],
                 details={"extra_ms": round(extra, 1), "tenant": tenant, "tenant_share_of_calls": round(share, 3)})


def _overlapping(rng: random.Random, fleet: FleetSpec, duration_s: float) -> Drawn:
    onset = _onset(rng, duration_s)
    length = _length(rng, duration_s, onset)
    first, kind = _component_latency(rng, fleet, onset, length)
    second_onset = round(onset + rng.choice([-1, 1]) * rng.uniform(20, 150), 1)
    second_length = _length(rng, duration_s, second_onset, 100, 180)
    if rng.random() < 0.5:
        model = _least_served(fleet, first.target)
        second = FaultSpec("engine_slowdown", model, second_onset, second_length,
                           {"factor": round(rng.uniform(2.0, 3.5), 2)})
        second_kind = "engine"
    else:
        first_models = set(_component(fleet, first.target).models)
        others = [c for c in (*fleet.auth, *fleet.routers)
                  if c.id != first.target and set(c.models) != first_models]
        component = rng.choice(others or [c for c in (*fleet.auth, *fleet.routers) if c.id != first.target])
        second_kind = "auth" if isinstance(component, AuthSpec) else "router"
        second = FaultSpec(f"{second_kind}_latency", component.id, second_onset, second_length,
                           _slowdown(rng, fleet, component))
    causes = [_cause(fleet, first, kind), _cause(fleet, second, second_kind)]
    return Drawn(fleet, [first, second], causes)


def _load(rng: random.Random, fleet: FleetSpec, duration_s: float) -> Drawn:
    tenant = rng.choice(fleet.tenants)
    factor = round(rng.uniform(4.0, 8.0), 2)
    model = rng.choice(sorted(tenant.models)) if rng.random() < 0.3 else ""
    ramp = round(rng.uniform(30, 90), 1) if rng.random() < 0.3 else 0.0
    onset = _onset(rng, duration_s)
    fault = FaultSpec("traffic_surge", tenant.name, onset, _length(rng, duration_s, onset),
                      {"factor": factor, "model": model, "ramp_s": ramp})
    models = [model] if model else sorted(tenant.models, key=fleet.model_names.index)
    consequences = [f"limit-{tenant.name}"] + [e for m in models for e in _engines(fleet, m)]
    cause = {"kind": "load", "tenant": tenant.name, "model": model or None, "factor": factor, "instances": [],
             "models": models, "shared": False, "fault": fault.kind,
             "window_s": [fault.start_s, fault.start_s + fault.duration_s], "consequences": consequences}
    if ramp:
        cause["ramp_s"] = ramp
    return Drawn(fleet, [fault], [cause], [f"limit-{tenant.name}"], details={"factor": factor})


LARGE_BUILDERS: dict[str, Callable[[random.Random, FleetSpec, float], Drawn]] = {
    "slow_ramp": _slow_ramp,
    "partial_failure": _partial_failure,
    "backpressure": _backpressure,
    "retry_storm": _retry_storm,
    "engine_noise": _engine_noise,
    "overlapping": _overlapping,
    "load": _load,
}
