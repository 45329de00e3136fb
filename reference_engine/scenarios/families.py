"""Incident scenario families: a fleet, and a fault that acts through the simulated mechanism. Running a
scenario and writing its ground truth apart from its traces is `reference_engine.scenarios.bank`.

Families (what the fault does, and which analysis the scenario exercises):

| family | fault (mechanism) | tasks |
|---|---|---|
| prefill_storm | a tenant sends long prompts to a prefill-first model: long prefills stall its decodes | itl |
| router_degradation | a router adds latency to its route spans (and may answer 503) | rca (shared) |
| rate_limiter_flapping | a limiter flaps to a fraction of its limit: 429s across its models | rca (shared) |
| auth_slowdown | an auth instance answers slowly | rca (shared) |
| global_queue_stall | the global queue releases nothing for a while, then drains | rca (shared) |
| engine_regression | one model's engines run every step slower | rca (single model: negative control) |
| preemption_storm | long generations exhaust a small KV cache: preemptions, recomputation | itl (negative control) |
| host_pauses | one engine's host stops now and then (GC, swapping) | itl (negative control) |
| cache_busting | a tenant puts fresh tokens before its system prompt: no prefix hits | cache |
| prefill_microbatch_misconfig | a model prefills in micro-batches of 128 tokens instead of 1024 | roofline |
| kv_transfer_congestion | the link between prefill and decode workers loses bandwidth | rca, ttft |
| assistant_prefill_runaway | requests with an assistant prefill generate to max_tokens (or fail) | lift |
| cpu_decode_host | CPU-only hosts serve a model: prompts prefill for minutes (fix: one GPU prefill host in front of
  them, idle for one host, 55–85% busy when several share it) | pd |
| cross_dc_read_write | prefill and decode pools in two data centres over fibre: the link congests, a surge of long
  prompts saturates the prefill pool, or the prefill pool's machine slows | rca, ttft |

Every scenario's ground truth also carries the ITL truth (stalled steps with victims and culprits,
preemptions, host pauses) recorded by the simulator, whatever the family.

Confounders (`make_scenario(..., confounders=True)`, as the bank draws its root-cause scenarios): real
incidents are not clean, so besides the root cause the scenario draws one or two smaller, shorter, unrelated
faults that overlap its window — a latency blip on another auth or router instance (often for one tenant's
requests only), a short flap of another rate limiter, a short slowdown or host pauses on an engine of a model
the root cause does not serve. They act through the same mechanisms and are recorded in the ground truth as
`confounders`, never as the root cause.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from reference_engine.engine.cost_model import StepCostModel
from reference_engine.engine.hardware import hardware as hardware_spec
from reference_engine.engine.models import model as model_spec
from reference_engine.fleet.config import (
    AuthSpec,
    DisaggregationSpec,
    FaultSpec,
    FleetSpec,
    GlobalQueueSpec,
    LinkSpec,
    ModelDeployment,
    RateLimiterSpec,
    RouterSpec,
    TenantSpec,
)
from reference_engine.scenarios.large_fleets import (
    LARGE_BUILDERS,
    LARGE_FAMILIES,
    MIN_DURATION_S,
    large_fleet,
    utilization,
)
from reference_engine.workload import SyntheticWorkload

FAMILIES = ("prefill_storm", "router_degradation", "rate_limiter_flapping", "auth_slowdown", "global_queue_stall",
            "engine_regression", "preemption_storm", "host_pauses", "cache_busting", "prefill_microbatch_misconfig",
            "kv_transfer_congestion", "assistant_prefill_runaway", "cpu_decode_host", "cross_dc_read_write")
# Every family `make_scenario` knows: the ones above (the default bank) and the root-cause families on large
# fleets (`large_fleets.py`), which a bank draws only when asked for them.
ALL_FAMILIES = FAMILIES + LARGE_FAMILIES

# Workload families for ITL attribution (not in the default bank's cycle: `--family` picks them): no fault,
# steady traffic whose prefills collide with decodes, under prefill-first or decode-first chunked scheduling.
ITL_FAMILIES = ("code_completion", "conversation")
ALL_FAMILIES = ALL_FAMILIES + ITL_FAMILIES

# (model, hardware, tensor parallel): what the bank draws its models from
MODEL_CHOICES = (("llama-3-8b", "H100-SXM", 1), ("qwen-2.5-1.5b", "H100-SXM", 1), ("mixtral-8x7b", "H100-SXM", 2),
                 ("llama-3-70b", "H100-SXM", 4))


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    seed: int
    duration_s: float
    fleet: FleetSpec
    tasks: tuple[str, ...]
    negative_control: tuple[str, ...] = ()  # analyses for which the scenario is a negative control
    root_cause: dict[str, Any] = field(default_factory=dict)
    window_s: tuple[float, float] | None = None  # the fault's window from the start; None: the whole run
    details: dict[str, Any] = field(default_factory=dict)  # family-specific truth
    # unrelated faults overlapping the root cause: {"fault": FaultSpec, "kind", "instances", "models"}
    confounders: tuple[dict[str, Any], ...] = ()
    # every culprit when there are several (or any has its own window: large-fleet families), the first being
    # root_cause; and the components expected to look anomalous without being a cause
    root_causes: tuple[dict[str, Any], ...] = ()
    symptoms: tuple[str, ...] = ()
    # the same traffic on another deployment, run beside the scenario (no spans): the ground truth records what it
    # measured, e.g. the TTFT a recommended fix gives (bank.run_scenario, `details["twin"]`)
    twin: FleetSpec | None = None

    @property
    def fault(self) -> FaultSpec | None:
        return self.fleet.faults[0] if self.fleet.faults else None


# ------------------------------------------------------------------------------------------ topology
def _partition(rng: random.Random, items: list[str], parts: int) -> list[list[str]]:
    shuffled = items[:]
    rng.shuffle(shuffled)
    groups: list[list[str]] = [[] for _ in range(parts)]
    for i, item in enumerate(shuffled):
        groups[i % parts].append(item)
    return [sorted(g, key=items.index) for g in groups if g]


def random_fleet(rng: random.Random, name: str, num_models: int | None = None) -> FleetSpec:
    """A random topology: 2–4 models of 1–2 replicas; auth, rate limiters and routers each shared by a
    random partition of the models; sometimes a global queue; 3–4 tenants at moderate load."""
    n = num_models or rng.randint(2, 4)
    chosen = sorted(rng.sample(MODEL_CHOICES, n), key=MODEL_CHOICES.index)
    models = []
    for model, hw, tp in chosen:
        engine: dict[str, Any] = {"tensor_parallel": tp} if tp > 1 else {}
        if rng.random() < 0.5:
            engine.update(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=rng.choice([512, 2048]))
        models.append(ModelDeployment(model, rng.randint(1, 2), hw, "us-east-1", engine))
    names = [m.name for m in models]
    auth = tuple(AuthSpec(f"auth-{i}", tuple(g), latency_ms=round(rng.uniform(1, 4), 2))
                 for i, g in enumerate(_partition(rng, names, rng.randint(1, min(2, n)))))
    routers = tuple(RouterSpec(f"router-{i}", tuple(g), rng.choice(["round_robin", "least_loaded", "prefix_aware"]),
                               latency_ms=round(rng.uniform(0.5, 2), 2))
                    for i, g in enumerate(_partition(rng, names, rng.randint(1, min(3, n)))))
    # tenants: every model gets traffic; about 1–2.5 requests/s per replica
    num_tenants = rng.randint(3, 4)
    tenant_names = [f"tenant-{chr(ord('a') + i)}" for i in range(num_tenants)]
    reach: dict[str, set[str]] = {t: set() for t in tenant_names}
    for m in names:
        reach[rng.choice(tenant_names)].add(m)
    for t in tenant_names:
        reach[t] |= set(rng.sample(names, rng.randint(1, n)))
    load = {m.name: m.replicas * rng.uniform(1.0, 2.5) for m in models}
    senders = {m: [t for t in tenant_names if m in reach[t]] for m in names}
    tenants = []
    max_rate = 0.0
    for t in tenant_names:
        share = {m: load[m] / len(senders[m]) for m in names if m in reach[t]}
        rate = sum(share.values())
        max_rate = max(max_rate, rate)
        workload = SyntheticWorkload(
            rate=round(rate, 3), prompt_mean=float(rng.choice([512, 1024, 1536])),
            output_mean=float(rng.choice([120, 200, 260])), max_tokens=1024, tenants=(t,),
            system_prompts_per_tenant=2, system_prompt_tokens=rng.choice([512, 1024, 2048]),
            system_prompt_fraction=round(rng.uniform(0.4, 0.8), 2), assistant_prefill_fraction=0.05)
        tenants.append(TenantSpec(t, {m: round(w, 4) for m, w in share.items()}, "synthetic", workload))
    limiters = tuple(RateLimiterSpec(f"ratelimit-{i}", tuple(g), latency_ms=round(rng.uniform(0.3, 1), 2),
                                     requests_per_s=round(max_rate * 4, 2), burst=round(max_rate * 8, 2))
                     for i, g in enumerate(_partition(rng, names, rng.randint(1, min(2, n)))))
    queues: tuple[GlobalQueueSpec, ...] = ()
    if rng.random() < 0.4:
        served = tuple(sorted(rng.sample(names, rng.randint(1, n)), key=names.index))
        queues = (GlobalQueueSpec("global-queue-0", served, max_inflight_per_engine=64),)
    return FleetSpec(name, "us-east-1", tuple(models), tuple(tenants), auth, limiters, routers, queues)


def _serving(fleet: FleetSpec, kind: str) -> list[Any]:
    return list({"auth": fleet.auth, "rate_limiter": fleet.rate_limiters, "router": fleet.routers,
                 "global_queue": fleet.global_queues}[kind])


def _pick_shared(rng: random.Random, components: list[Any]) -> Any:
    """Prefer a component serving several models (the interesting case); break ties at random."""
    most = max(len(c.models) for c in components)
    return rng.choice([c for c in components if len(c.models) == most])


def _set_engine(fleet: FleetSpec, model: str, **options: Any) -> FleetSpec:
    models = tuple(replace(m, engine={**m.engine, **options}) if m.name == model else m for m in fleet.models)
    return replace(fleet, models=models)


def engines_of(fleet: FleetSpec, model: str) -> list[str]:
    return [i for i, _ in fleet.engine_instances(model)]


# ------------------------------------------------------------------------------------------ families
def make_scenario(family: str, seed: int, name: str | None = None, duration_s: float = 600.0,
                  fleet: FleetSpec | None = None, confounders: bool = False) -> Scenario:
    """One scenario of the family; the topology, onset, duration and magnitude are drawn from `seed`. With
    `confounders`, a root-cause (`rca`) scenario also gets one or two unrelated, smaller faults overlapping
    its window (drawn from a stream of their own: the root cause is the same with or without them)."""
    known = ALL_FAMILIES + EXTRA_FAMILIES
    if family not in known:
        raise ValueError(f"unknown scenario family {family!r}; known: {', '.join(known)}")
    rng = random.Random(f"{family}-{seed}")
    name = name or f"{family}-{seed}"
    if family in LARGE_FAMILIES:
        return _large_scenario(family, rng, seed, name, duration_s, fleet, confounders)
    base = fleet or random_fleet(rng, name)
    onset = round(rng.uniform(0.3, 0.55) * duration_s, 1)
    length = round(min(rng.uniform(0.15, 0.35) * duration_s, duration_s * 0.92 - onset), 1)
    scenario = _BUILDERS[family](rng, base, name, seed, duration_s, onset, length)
    if confounders and "rca" in scenario.tasks:
        scenario = with_confounders(scenario, random.Random(f"{family}-{seed}-confounders"))
    return scenario


def _large_scenario(family: str, rng: random.Random, seed: int, name: str, duration_s: float, fleet: FleetSpec | None,
                    confounders: bool) -> Scenario:
    """A root-cause scenario on a large fleet (`large_fleets.py`); its run is at least the family's minimum."""
    duration_s = max(duration_s, MIN_DURATION_S[family])
    drawn = LARGE_BUILDERS[family](rng, fleet or large_fleet(rng, name), duration_s)
    family_confounders = tuple(drawn.confounders)
    spec = drawn.fleet.with_faults((*drawn.faults, *(c["fault"] for c in family_confounders)))
    first = drawn.faults[0]
    scenario = Scenario(name, family, seed, duration_s, spec, ("rca",), (), drawn.causes[0],
                        (first.start_s, first.start_s + first.duration_s), drawn.details, family_confounders,
                        tuple(drawn.causes), tuple(drawn.symptoms))
    if confounders:
        scenario = with_confounders(scenario, random.Random(f"{family}-{seed}-confounders"))
    return scenario


def _scenario(family: str, name: str, seed: int, duration_s: float, fleet: FleetSpec, tasks: tuple[str, ...],
              root_cause: dict[str, Any], fault: FaultSpec | None, negative: tuple[str, ...] = (),
              details: dict[str, Any] | None = None) -> Scenario:
    if fault is not None:
        fleet = fleet.with_faults((fault,))
    window = (fault.start_s, fault.start_s + fault.duration_s) if fault is not None else None
    return Scenario(name, family, seed, duration_s, fleet, tasks, negative, root_cause, window, details or {})


def _component_fault(kind: str, family: str, fault_kind: str, params: Callable[[random.Random], dict[str, Any]],
                     root_kind: str) -> Callable[..., Scenario]:
    def build(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float, onset: float,
              length: float) -> Scenario:
        if kind == "global_queue" and not fleet.global_queues:
            models = fleet.model_names
            fleet = replace(fleet, global_queues=(GlobalQueueSpec("global-queue-0", models, 64),))
        component = _pick_shared(rng, _serving(fleet, kind))
        fault = FaultSpec(fault_kind, component.id, onset, length, params(rng))
        root = {"kind": root_kind, "instances": [component.id], "models": list(component.models),
                "shared": True}
        return _scenario(family, name, seed, duration_s, fleet, ("rca",), root, fault)
    return build


def _router_params(rng: random.Random) -> dict[str, Any]:
    return {"extra_ms": round(rng.uniform(150, 1500), 1),
            "error_rate": round(rng.uniform(0.02, 0.1), 3) if rng.random() < 0.3 else 0.0}


def _flapping_params(rng: random.Random) -> dict[str, Any]:
    return {"period_s": round(rng.uniform(10, 60), 1), "duty": 0.5,
            "limit_fraction": round(rng.uniform(0.02, 0.1), 3)}


def _engine_regression(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
                       onset: float, length: float) -> Scenario:
    model = rng.choice(fleet.model_names)
    fault = FaultSpec("engine_slowdown", model, onset, length, {"factor": round(rng.uniform(1.6, 4.0), 2)})
    root = {"kind": "engine", "instances": engines_of(fleet, model), "models": [model], "shared": False}
    return _scenario("engine_regression", name, seed, duration_s, fleet, ("rca",), root, fault, ("rca",))


def _prefill_storm(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
                   onset: float, length: float) -> Scenario:
    model = rng.choice(fleet.model_names)
    fleet = _set_engine(fleet, model, policy="prefill_first", chunked_prefill=False, max_num_batched_tokens=16384)
    tenant = rng.choice([t.name for t in fleet.tenants])
    fault = FaultSpec("request_surge", model, onset, length, {
        "tenant": tenant, "rate": round(rng.uniform(0.3, 0.8), 2),
        "prompt_mean": float(rng.choice([6000, 8000, 12000])), "output_mean": 100.0, "max_tokens": 1024.0})
    root = {"kind": "engine", "instances": engines_of(fleet, model), "models": [model], "shared": False,
            "tenant": tenant}
    return _scenario("prefill_storm", name, seed, duration_s, fleet, ("itl",), root, fault)


def _itl_traffic(family: str) -> Callable[..., Scenario]:
    """One dense model on 1–2 replicas, busy with `family`'s traffic: code completion (prompts ≈ 1.5k tokens,
    a median of ≈ 13 output tokens) or conversation (a shared system prompt, ≈ 600-token turns, ≈ 200 output
    tokens); the scheduling drawn: prefill-first unchunked, or decode-first chunked with a 512- or 2048-token
    budget. Every stall is a prefill's: the scenario scores ITL attribution's recall and precision."""
    def build(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float, onset: float,
              length: float) -> Scenario:
        model, hw, tp = rng.choice([c for c in MODEL_CHOICES if model_spec(c[0]).num_experts == 1])
        engine: dict[str, Any] = {"tensor_parallel": tp} if tp > 1 else {}
        chunked = rng.random() < 0.5
        if chunked:
            engine.update(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=rng.choice([512, 2048]))
        else:
            engine.update(policy="prefill_first", chunked_prefill=False, max_num_batched_tokens=16384)
        replicas = rng.randint(1, 2)
        per_replica = {"llama-3-8b": 4.0, "qwen-2.5-1.5b": 8.0, "llama-3-70b": 1.5}.get(model, 3.0)
        rate = round(replicas * per_replica * rng.uniform(0.6, 1.2), 2)
        if family == "code_completion":
            workload = SyntheticWorkload(rate=rate, prompt_mean=1536.0, prompt_sigma=0.5, output_mean=16.0,
                                         output_sigma=0.7, max_tokens=256, tenants=("tenant-a",),
                                         system_prompt_fraction=0.0, assistant_prefill_fraction=0.0)
        else:
            workload = SyntheticWorkload(rate=round(rate / 3, 2), prompt_mean=600.0, prompt_sigma=0.8,
                                         output_mean=200.0, output_sigma=0.6, max_tokens=1024, tenants=("tenant-a",),
                                         system_prompt_tokens=1024, system_prompt_fraction=0.8)
        deployment = ModelDeployment(model, replicas, hw, "us-east-1", engine)
        itl_fleet = FleetSpec(name, "us-east-1", (deployment,), (TenantSpec("tenant-a", {model: 1.0}, "synthetic",
                                                                            workload),))
        root = {"kind": "engine", "instances": engines_of(itl_fleet, model), "models": [model], "shared": False}
        details = {"scheduling": "chunked" if chunked else "unchunked", "budget": engine["max_num_batched_tokens"],
                   "rate": rate}
        return _scenario(family, name, seed, duration_s, itl_fleet, ("itl",), root, None, details=details)

    return build


def _stall_free(fleet: FleetSpec, model: str) -> FleetSpec:
    """Chunks small enough that prefills never stall decodes: the engine's spikes come from elsewhere."""
    return _set_engine(fleet, model, policy="decode_first", chunked_prefill=True, max_num_batched_tokens=256,
                       max_num_seqs=128)


def _dense_model(fleet: FleetSpec, rng: random.Random | None = None, largest: bool = False) -> str:
    """A dense (not mixture-of-experts) model of the fleet: a prefill chunk in an MoE step reads every expert,
    so even small chunks stall its decodes, which a negative control for ITL attribution must avoid."""
    dense = [m for m in fleet.model_names if model_spec(m).num_experts == 1] or list(fleet.model_names)
    if largest:
        return max(dense, key=lambda m: model_spec(m).weight_bytes)
    assert rng is not None
    return rng.choice(dense)


def _preemption_storm(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
                      onset: float, length: float) -> Scenario:
    model = _dense_model(fleet, rng)
    # KV for 11k–18k tokens: the normal traffic fits, a surge of long generations does not.
    fleet = _set_engine(_stall_free(fleet, model), model, num_kv_blocks=rng.randint(700, 1100))
    tenant = rng.choice([t.name for t in fleet.tenants])
    fault = FaultSpec("request_surge", model, onset, length, {
        "tenant": tenant, "rate": round(rng.uniform(1.0, 2.0), 2), "prompt_mean": 1024.0, "prompt_sigma": 0.3,
        "output_mean": float(rng.choice([1200, 1600])), "output_sigma": 0.2, "max_tokens": 2048.0})
    root = {"kind": "engine", "instances": engines_of(fleet, model), "models": [model], "shared": False,
            "tenant": tenant}
    return _scenario("preemption_storm", name, seed, duration_s, fleet, ("itl",), root, fault, ("itl",))


def _host_pauses(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
                 onset: float, length: float) -> Scenario:
    # A pause while the engine is idle hurts nobody: take the model whose engines are busiest (the largest).
    model = _dense_model(fleet, largest=True)
    fleet = _stall_free(fleet, model)
    instance = rng.choice(engines_of(fleet, model))
    fault = FaultSpec("host_pauses", instance, onset, length, {
        "pause_ms": round(rng.uniform(80, 500), 1), "every_s": round(rng.uniform(2, 6), 1)})
    root = {"kind": "engine", "instances": [instance], "models": [model], "shared": False}
    return _scenario("host_pauses", name, seed, duration_s, fleet, ("itl",), root, fault, ("itl",))


def _cache_busting(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
                   onset: float, length: float) -> Scenario:
    tenant = rng.choice(fleet.tenants)
    fault = FaultSpec("cache_busting", tenant.name, onset, length)
    root = {"kind": "tenant", "tenant": tenant.name, "models": sorted(tenant.models), "shared": False}
    prompts = range(tenant.synthetic.system_prompts_per_tenant)
    details = {"system_prompt_ids": [f"sys-{tenant.name}-{i}" for i in prompts]}
    return _scenario("cache_busting", name, seed, duration_s, fleet, ("cache",), root, fault, details=details)


def _microbatch(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
                onset: float, length: float) -> Scenario:
    model = rng.choice(fleet.model_names)
    fleet = _set_engine(fleet, model, prefill_microbatch=128)
    root = {"kind": "engine", "instances": engines_of(fleet, model), "models": [model], "shared": False}
    details = {"prefill_microbatch_tokens": 128, "recommended_microbatch_tokens": 1024}
    return _scenario("prefill_microbatch_misconfig", name, seed, duration_s, fleet, ("roofline",), root, None,
                     details=details)


def _kv_congestion(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
                   onset: float, length: float) -> Scenario:
    model = rng.choice(fleet.model_names)
    link = LinkSpec("link-dc1-dc2", bandwidth_gb_s=float(rng.choice([12.5, 25.0, 50.0])),
                    latency_ms=round(rng.uniform(0.5, 5), 2))
    d = DisaggregationSpec(1, rng.randint(1, 2), link.id, rng.choice(["H100-SXM", "H200"]), "dc2", {})
    models = tuple(replace(m, disaggregation=d) if m.name == model else m for m in fleet.models)
    fleet = replace(fleet, models=models, links=(link,))
    fault = FaultSpec("link_congestion", link.id, onset, length,
                      {"bandwidth_fraction": round(rng.uniform(0.02, 0.1), 3)})
    root = {"kind": "link", "instances": [link.id], "models": [model], "shared": False}
    return _scenario("kv_transfer_congestion", name, seed, duration_s, fleet, ("rca", "ttft"), root, fault)


# The CPU-only host story: a machine without a GPU serves a model; its long prompts prefill at the host's few
# TFLOP/s (≈ 107 s for 8k tokens of llama-3-8b) and queue behind each other for many minutes. The fix is a GPU
# prefill host in front of it over a 100 Gbit/s link: the scenario's twin, whose measured TTFT the report's
# recommendation must quote within 15% (`infertrace evaluate --section pd`). Half the scenarios are one CPU host
# (the GPU host would idle: its prefill time alone is nearly the whole answer); the other half are several CPU
# hosts sharing one GPU prefill host drawn 55–85% busy, so what the answer turns on is the queue at that host.
CPU_HOST_MODEL, CPU_HOST_HARDWARE, GPU_PREFILL_HARDWARE = "llama-3-8b", "CPU-host", "L4"
CPU_HOST_LINK = LinkSpec("lan", bandwidth_gb_s=12.5, latency_ms=0.5)


def _cpu_decode_host(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
                     onset: float, length: float) -> Scenario:
    model = CPU_HOST_MODEL
    rate, prompt_mean = round(rng.uniform(0.03, 0.06), 4), float(rng.choice([6000, 8000]))
    hosts, busy = 1, None
    if rng.random() < 0.5:
        # several CPU hosts, each at 0.03–0.05 requests/s (its own prefills take ≈ 1–2 × the run to drain, as
        # the single host's), as many as make the shared GPU prefill host `busy` with prompts of the mean size
        busy, rate = rng.uniform(0.55, 0.85), round(rng.uniform(0.03, 0.05), 4)
        gpu = StepCostModel(model_spec(model), hardware_spec(GPU_PREFILL_HARDWARE))
        hosts = max(2, round(busy / (rate * gpu.step_seconds([(int(prompt_mean), 0)], 0, 0, 1))))
    workload = SyntheticWorkload(rate=round(rate * hosts, 4), prompt_mean=prompt_mean, prompt_sigma=0.2,
                                 max_prompt_tokens=12000, output_mean=60.0, output_sigma=0.3, max_tokens=256,
                                 tenants=("rag",), system_prompt_fraction=0.0, assistant_prefill_fraction=0.0)
    colocated = ModelDeployment(model, hosts, CPU_HOST_HARDWARE, fleet.region, {"max_num_batched_tokens": 16384})
    alone = FleetSpec(name, fleet.region, (colocated,), (TenantSpec("rag", {model: 1.0}, "synthetic", workload),),
                      routers=(RouterSpec("router-0", (model,)),), timeout_s=3600.0)
    # the twin: one GPU prefill host in front of every CPU host, which keep decoding
    d = DisaggregationSpec(1, hosts, CPU_HOST_LINK.id, CPU_HOST_HARDWARE, fleet.region, {})
    twin = replace(alone, models=(replace(colocated, replicas=1, hardware=GPU_PREFILL_HARDWARE, disaggregation=d),),
                   links=(CPU_HOST_LINK,))
    root = {"kind": "engine", "instances": engines_of(alone, model), "models": [model], "shared": False}
    details = {"gpu_prefill_host": {"hardware": GPU_PREFILL_HARDWARE, "link_gb_s": CPU_HOST_LINK.bandwidth_gb_s,
                                    "link_latency_ms": CPU_HOST_LINK.latency_ms},
               "cpu_hosts": hosts, "rate_per_host": rate,
               "gpu_busy_drawn": None if busy is None else round(busy, 3)}
    return replace(_scenario("cpu_decode_host", name, seed, duration_s, alone, ("pd",), root, None, details=details),
                   twin=twin)


def _cross_dc(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
              onset: float, length: float) -> Scenario:
    """Read/write separation across data centres: the fleet's largest dense model gets a prefill pool in dc1 (a
    70B on 8-GPU machines, TP 8) and a decode pool on large-memory machines (H200) in dc2, the KV over a
    400 Gbit/s fibre link of 200–1000 km (≈ 5 µs/km one way, plus switching); its other models stay colocated.
    The incident: the link congests (the KV of every request crawls: only the disaggregated model degrades; root
    cause the link), or a tenant's surge of long prompts saturates the prefill pool (root cause the tenant's load,
    with the pool it saturated named in the truth as `pool`), or the prefill pool loses capacity, its machine
    computing every step 2.5–5× slower (root cause the pool's engine, the pool named in the truth as `pool`)."""
    model = _dense_model(fleet, largest=True)
    km = rng.uniform(200, 1000)
    link = LinkSpec("fibre-dc1-dc2", bandwidth_gb_s=50.0, latency_ms=round(km * 0.005 + 0.2, 2))
    m = fleet.deployment(model)
    engine = {**m.engine, "tensor_parallel": 8} if model == "llama-3-70b" else dict(m.engine)
    d = DisaggregationSpec(1, rng.randint(1, 2), link.id, "H200", "dc2",
                           {"tensor_parallel": engine["tensor_parallel"]} if "tensor_parallel" in engine else {})
    models = tuple(replace(x, engine=engine, region="dc1", disaggregation=d) if x.name == model else x
                   for x in fleet.models)
    fleet = replace(fleet, models=models, links=(link,))
    prefill = [i for i, role in fleet.engine_instances(model) if role == "prefill_worker"]
    details = {"link_km": round(km), "link": link.id, "model": model}
    mode = rng.random()
    if mode < 0.6:
        fault = FaultSpec("link_congestion", link.id, onset, length,
                          {"bandwidth_fraction": round(rng.uniform(0.005, 0.03), 4)})
        root = {"kind": "link", "instances": [link.id], "models": [model], "shared": False}
        details["mode"] = "link"
    elif mode >= 0.8:
        # the prefill pool itself loses capacity: its machine throttles (one prefill worker: the whole pool)
        fault = FaultSpec("instance_slowdown", prefill[0], onset, length,
                          {"factor": round(rng.uniform(2.5, 5.0), 2)})
        root = {"kind": "engine", "instances": prefill, "models": [model], "shared": False,
                "pool": f"{model} prefill pool"}
        details["mode"] = "prefill_pool_slowdown"
    else:
        tenant = rng.choice([t.name for t in fleet.tenants if model in t.models] or [t.name for t in fleet.tenants])
        fault = FaultSpec("request_surge", model, onset, length, {
            "tenant": tenant, "rate": round(rng.uniform(2.0, 4.0), 2), "prompt_mean": 12000.0, "prompt_sigma": 0.2,
            "output_mean": 32.0, "output_sigma": 0.3, "max_tokens": 64.0})
        # the cause is the tenant's traffic (load, as a traffic surge's truth is in large_fleets.py); the prefill
        # pool it saturates is where the RCA must say that traffic queued (`pool`, scored by `evaluate --section pd`)
        root = {"kind": "load", "tenant": tenant, "instances": [], "models": [model], "shared": False,
                "pool": f"{model} prefill pool", "consequences": prefill}
        details["mode"] = "prefill_pool"
    return _scenario("cross_dc_read_write", name, seed, duration_s, fleet, ("rca", "ttft"), root, fault,
                     details=details)


RUNAWAY_MIN_AFFECTED = 30  # expected requests a runaway (or failure) fault hits: well above a bucket's noise


def _model_rate(fleet: FleetSpec, model: str) -> float:
    """Requests per second the fleet's synthetic tenants send to the model."""
    rate = 0.0
    for t in fleet.tenants:
        total = sum(t.models.values())
        if t.workload == "synthetic" and total > 0:
            rate += t.synthetic.rate * t.models.get(model, 0.0) / total
    return rate


def _runaway(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
             onset: float, length: float) -> Scenario:
    model = rng.choice(fleet.model_names)
    fraction = round(rng.uniform(0.06, 0.15), 3)
    probability = round(rng.uniform(0.6, 0.95), 2)
    mode = "fail" if rng.random() < 0.35 else "runaway"
    # An on-call-visible incident every time: enough requests with an assistant prefill reach the model in
    # the window (a higher share of prefills, then a longer window) to hit RUNAWAY_MIN_AFFECTED in expectation.
    rate = _model_rate(fleet, model) * probability
    if rate > 0:
        fraction = round(min(max(fraction, RUNAWAY_MIN_AFFECTED / (rate * length)), 0.4), 3)
        length = round(min(max(length, RUNAWAY_MIN_AFFECTED / (rate * fraction)), duration_s * 0.92 - onset), 1)
    tenants = tuple(replace(t, synthetic=replace(t.synthetic, assistant_prefill_fraction=fraction, max_tokens=2048))
                    for t in fleet.tenants)
    fleet = replace(fleet, tenants=tenants)
    fault = FaultSpec("assistant_prefill_runaway", model, onset, length, {"probability": probability, "mode": mode})
    root = {"kind": "engine", "instances": engines_of(fleet, model), "models": [model], "shared": False}
    effect = ("output_tokens == max_tokens (finish reason length)" if mode == "runaway"
              else "HTTP 500 invalid_response (the output breaks the response format)")
    details = {"attribute": "infertrace.request.assistant_prefill_tokens", "condition": "> 0", "mode": mode,
               "effect": effect, "assistant_prefill_fraction": fraction}
    return _scenario("assistant_prefill_runaway", name, seed, duration_s, fleet, ("lift",), root, fault,
                     details=details)


# ---------------------------------------------------------------------------------------- confounders
def _others(components: list[Any], root: set[str]) -> list[Any]:
    return [c for c in components if c.id not in root]


def with_confounders(scenario: Scenario, rng: random.Random) -> Scenario:
    """The scenario with one or two unrelated, smaller faults overlapping its window: background noise the
    root-cause analysis must see through. Each acts through the simulated mechanism on a component that is
    not the root cause (an engine confounder only on a model the root cause does not name); a negative
    control (one model's engines) gets gateway confounders only, so its own model stays the only slow one."""
    if scenario.window_s is None:
        return scenario
    fleet, duration = scenario.fleet, scenario.duration_s
    causes = scenario.root_causes or (scenario.root_cause,)
    root = {i for c in causes for i in c.get("instances", ())}
    root_models = {m for c in causes for m in c.get("models", ())}
    tenants = [t.name for t in fleet.tenants]
    other_models = [m for m in fleet.model_names if m not in root_models]
    start, end = scenario.window_s
    options: list[str] = []
    if _others(list(fleet.auth), root):
        options.append("auth")
    if _others(list(fleet.routers), root):
        options.append("router")
    if _others(list(fleet.rate_limiters), root):
        options.append("rate_limiter")
    if other_models and not scenario.negative_control:
        options += ["engine", "host_pauses"]
    if not options:
        return scenario
    picked = rng.sample(options, min(rng.choice([1, 1, 2]), len(options)))
    drawn = []
    for kind in picked:
        length = round(rng.uniform(10, 40), 1)
        at = round(min(max(rng.uniform(start - 0.25 * (end - start), start + 0.75 * (end - start)), 0.1 * duration),
                       0.95 * duration - length), 1)
        models: list[str]
        if kind in ("auth", "router"):
            component = rng.choice(_others(list(fleet.auth if kind == "auth" else fleet.routers), root))
            params: dict[str, Any] = {"extra_ms": round(rng.uniform(50, 400), 1)}
            if rng.random() < 0.7:
                params["tenant"] = rng.choice(tenants)
            if component.workers:  # extra time per call would saturate its workers: a smaller slowdown instead
                params["factor"] = round(1 + (max(1.2, 0.8 / max(utilization(fleet, component), 0.05)) - 1)
                                         * params["extra_ms"] / 400, 2)
                params["extra_ms"] = 0.0
            fault = FaultSpec("auth_latency" if kind == "auth" else "router_latency", component.id, at, length, params)
            instances, models = [component.id], list(component.models)
        elif kind == "rate_limiter":
            component = rng.choice(_others(list(fleet.rate_limiters), root))
            fault = FaultSpec("rate_limiter_flapping", component.id, at, length, {
                "period_s": round(rng.uniform(4, 12), 1), "duty": 0.5,
                "limit_fraction": round(rng.uniform(0.05, 0.2), 3)})
            instances, models = [component.id], list(component.models)
        elif kind == "engine":
            model = rng.choice(other_models)
            fault = FaultSpec("engine_slowdown", model, at, length, {"factor": round(rng.uniform(1.3, 2.2), 2)})
            instances, models = engines_of(fleet, model), [model]
        else:
            model = rng.choice(other_models)
            instance = rng.choice(engines_of(fleet, model))
            fault = FaultSpec("host_pauses", instance, at, length, {
                "pause_ms": round(rng.uniform(50, 300), 1), "every_s": round(rng.uniform(1, 3), 1)})
            instances, models = [instance], [model]
        drawn.append({"fault": fault, "kind": "engine" if kind in ("engine", "host_pauses") else kind,
                      "instances": instances, "models": models})
    fleet = fleet.with_faults((*fleet.faults, *(d["fault"] for d in drawn)))
    return replace(scenario, fleet=fleet, confounders=(*scenario.confounders, *drawn))


_BUILDERS: dict[str, Callable[..., Scenario]] = {
    "prefill_storm": _prefill_storm,
    "code_completion": _itl_traffic("code_completion"),
    "conversation": _itl_traffic("conversation"),
    "router_degradation": _component_fault("router", "router_degradation", "router_latency", _router_params,
                                           "router"),
    "rate_limiter_flapping": _component_fault("rate_limiter", "rate_limiter_flapping", "rate_limiter_flapping",
                                              _flapping_params, "rate_limiter"),
    "auth_slowdown": _component_fault("auth", "auth_slowdown", "auth_latency",
                                      lambda rng: {"extra_ms": round(rng.uniform(150, 1500), 1)}, "auth"),
    "global_queue_stall": _component_fault("global_queue", "global_queue_stall", "global_queue_stall",
                                           lambda rng: {}, "scheduler"),
    "engine_regression": _engine_regression,
    "preemption_storm": _preemption_storm,
    "host_pauses": _host_pauses,
    "cache_busting": _cache_busting,
    "prefill_microbatch_misconfig": _microbatch,
    "kv_transfer_congestion": _kv_congestion,
    "assistant_prefill_runaway": _runaway,
    "cpu_decode_host": _cpu_decode_host,
    "cross_dc_read_write": _cross_dc,
}


# --------------------------------------------------------------------------- families outside the bank
# The bank (`FAMILIES`) draws the families whose analyses `infertrace evaluate` scores; these are made by name
# (`make_scenario`, `api.scenario_on_fleet`) for the analyses it does not score.
#
# | moe_offload_prefill | a MoE on a small GPU keeps every expert layer in host memory and prefills in
#   128-token micro-batches: each copies the experts over PCIe again | roofline |
EXTRA_FAMILIES = ("moe_offload_prefill",)
OFFLOAD_STORY_MODEL, OFFLOAD_STORY_HARDWARE = "mixtral-8x7b-q4_k", "L4"


def _moe_offload(rng: random.Random, fleet: FleetSpec, name: str, seed: int, duration_s: float,
                 onset: float, length: float) -> Scenario:
    """docs/cost_model.md's deployment story, added to the fleet: Mixtral-8x7B in 4.5-bit weights on one 24 GB
    L4 with every expert layer in host memory (llama.cpp's --cpu-moe) and 128-token prefill micro-batches
    prefills at ≈ 115 tok/s; 1024-token micro-batches with 4 expert layers back on the GPU reach ≈ 840."""
    model = OFFLOAD_STORY_MODEL
    engine = {"offload_experts": True, "prefill_microbatch": 128, "max_num_batched_tokens": 8192, "max_num_seqs": 4}
    deployment = ModelDeployment(model, 1, OFFLOAD_STORY_HARDWARE, fleet.region, engine)
    workload = SyntheticWorkload(rate=round(rng.uniform(0.02, 0.03), 4), prompt_mean=4000.0, prompt_sigma=0.3,
                                 max_prompt_tokens=7000, output_mean=24.0, output_sigma=0.3, max_tokens=64,
                                 tenants=("offload-rag",), system_prompt_fraction=0.0, assistant_prefill_fraction=0.0)
    fleet = replace(fleet, models=(*fleet.models, deployment),
                    tenants=(*fleet.tenants, TenantSpec("offload-rag", {model: 1.0}, "synthetic", workload)))
    root = {"kind": "engine", "instances": engines_of(fleet, model), "models": [model], "shared": False}
    details = {"causes": ["experts_offloaded", "microbatch_recopies_experts"], "prefill_microbatch_tokens": 128,
               "cpu_moe_layers": model_spec(model).num_layers,
               "story_fix": {"prefill_microbatch": 1024, "cpu_moe_layers": model_spec(model).num_layers - 4}}
    return _scenario("moe_offload_prefill", name, seed, duration_s, fleet, ("roofline",), root, None, details=details)


_BUILDERS["moe_offload_prefill"] = _moe_offload
