"""What-if validation scenarios: the same requests served by one model's deployment under config A (the capture)
and under config B (what a replay of A's capture under B must predict), each run written as traces.

A scenario is one model behind auth, a rate limiter and a router, three tenants with shared system prompts and
assistant prefills, and a prefill storm partway through (a tenant's burst of long prompts: the incident); B
changes one knob of A: the chunk budget, the scheduling policy, the tensor-parallel degree, the prefill
micro-batch, the replicas, prefill/decode disaggregation, max_num_seqs or prefix caching. Both runs draw the
same requests (the tenants' traffic depends on the seed alone) and pass the same gateway. With hidden costs,
the engines of both runs compute with cost parameters of their own, which the spans do not carry (as a real
engine's speed is not in its telemetry): a replay must fit them to the capture's measured steps.

`<out>/<name>/capture/traces.jsonl.gz`, `<out>/<name>/actual/traces.jsonl.gz`, and `<out>/<name>/whatif.json`:
the model, the knob, the `infertrace replay --set` settings that turn A into B, and both fleet files.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from reference_engine.engine.config import EngineConfig
from reference_engine.engine.cost_model import CostParams
from reference_engine.fleet.config import (
    AuthSpec,
    DisaggregationSpec,
    FaultSpec,
    FleetSpec,
    LinkSpec,
    ModelDeployment,
    RateLimiterSpec,
    RouterSpec,
    TenantSpec,
    fleet_to_toml,
)
from reference_engine.fleet.fleet import Fleet
from reference_engine.fleet.workload import fleet_requests
from reference_engine.scenarios.bank import ITERATION_LOGS_DIR
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.profiles import TelemetrySpec
from reference_engine.workload import DEFAULT_EPOCH_NS, SyntheticWorkload

WHATIF_FILE = "whatif.json"
WHATIF_SCHEMA = "infertrace.whatif_scenario/1"
KNOBS = ("chunk", "policy", "tensor_parallel", "prefill_microbatch", "replicas", "pd", "max_num_seqs",
         "prefix_caching")
# model, hardware, TP degree of config A, TP degree a TP variant moves to
MODELS = (("llama-3-8b", "H100-SXM", 1, 2), ("qwen-2.5-1.5b", "H100-SXM", 1, 2), ("mixtral-8x7b", "H100-SXM", 2, 4),
          ("llama-3-70b", "H100-SXM", 4, 8))


def hidden_cost(rng: random.Random) -> CostParams:
    """Engines that the default roofline mispredicts (as real ones do): their own efficiencies and overheads."""
    return CostParams(compute_efficiency=round(rng.uniform(0.35, 0.65), 3),
                      memory_efficiency=round(rng.uniform(0.5, 0.8), 3),
                      attention_efficiency=round(rng.uniform(0.2, 0.5), 3),
                      step_overhead_s=round(rng.uniform(0.002, 0.005), 5),
                      per_sequence_overhead_s=round(rng.uniform(0.0, 2e-5), 7))


def _fleet(rng: random.Random, name: str, duration_s: float, cost: CostParams | None = None) -> FleetSpec:
    model, hw, tp, _ = rng.choice(MODELS)
    replicas = rng.randint(1, 2)
    engine: dict[str, Any] = {"tensor_parallel": tp} if tp > 1 else {}
    if cost is not None:
        engine["cost"] = cost
    if rng.random() < 0.5:
        engine.update(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=rng.choice([512, 2048]))
    per_replica = rng.uniform(1.0, 2.5) * (0.5 if model == "llama-3-70b" else 1.0)
    tenants = []
    for t in ("tenant-a", "tenant-b", "tenant-c"):
        workload = SyntheticWorkload(
            rate=round(per_replica * replicas / 3, 3), prompt_mean=float(rng.choice([512, 1024, 1536])),
            output_mean=float(rng.choice([120, 200, 260])), max_tokens=1024, tenants=(t,),
            system_prompts_per_tenant=2, system_prompt_tokens=rng.choice([512, 1024, 2048]),
            system_prompt_fraction=round(rng.uniform(0.4, 0.8), 2), assistant_prefill_fraction=0.05)
        tenants.append(TenantSpec(t, {model: 1.0}, "synthetic", workload))
    onset = round(rng.uniform(0.3, 0.5) * duration_s, 1)
    storm = FaultSpec("request_surge", model, onset, round(rng.uniform(0.15, 0.3) * duration_s, 1), {
        "tenant": rng.choice([t.name for t in tenants]), "rate": round(rng.uniform(0.2, 0.5), 2),
        "prompt_mean": float(rng.choice([4000, 6000, 8000])), "output_mean": 100.0, "max_tokens": 1024.0})
    return FleetSpec(
        name, "us-east-1", (ModelDeployment(model, replicas, hw, "us-east-1", engine),), tuple(tenants),
        auth=(AuthSpec("auth-0", (model,), latency_ms=round(rng.uniform(1, 3), 2)),),
        rate_limiters=(RateLimiterSpec("ratelimit-0", (model,), latency_ms=0.5, requests_per_s=50.0, burst=100.0),),
        routers=(RouterSpec("router-0", (model,), rng.choice(["round_robin", "least_loaded", "prefix_aware"]),
                            latency_ms=round(rng.uniform(0.5, 2), 2)),),
        faults=(storm,))


def _variant(rng: random.Random, fleet: FleetSpec, knob: str) -> tuple[FleetSpec, list[tuple[str, str]]]:
    """Config B: A with `knob` changed, and the replay settings that say so."""
    m = fleet.models[0]
    engine = dict(m.engine)
    decode_first = engine.get("policy") == "decode_first"

    def with_engine(**options: Any) -> FleetSpec:
        return replace(fleet, models=(replace(m, engine={**engine, **options}),))

    if knob == "chunk":
        budget = rng.choice([b for b in (256, 512, 1024, 2048, 4096) if b != engine.get("max_num_batched_tokens")])
        return (with_engine(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=budget,
                            max_num_seqs=min(256, budget)), [("chunk", str(budget))])
    if knob == "policy":
        if decode_first:
            return (with_engine(policy="prefill_first", chunked_prefill=False, max_num_batched_tokens=16384),
                    [("policy", "prefill_first"), ("chunked_prefill", "false"), ("max_num_batched_tokens", "16384")])
        return (with_engine(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=2048),
                [("policy", "decode_first"), ("max_num_batched_tokens", "2048")])
    if knob == "tensor_parallel":
        tp = next(t for name, _, _, t in MODELS if name == m.name)
        return with_engine(tensor_parallel=tp), [("tensor_parallel", str(tp))]
    if knob == "prefill_microbatch":
        size = rng.choice([128, 256, 512])
        return with_engine(prefill_microbatch=size), [("prefill_microbatch", str(size))]
    if knob == "replicas":
        replicas = 1 if m.replicas == 2 else 2
        settings = [("replicas", str(replicas))]
        if m.replicas == 1:  # a one-replica capture cannot show how its router balances: the variant says it
            settings.append(("router_policy", fleet.routers[0].policy))
        return replace(fleet, models=(replace(m, replicas=replicas),)), settings
    if knob == "pd":
        decode = rng.randint(1, 2)
        bandwidth = rng.choice([12.5, 25.0, 50.0])
        link = LinkSpec("link-0", bandwidth, 1.0)
        d = DisaggregationSpec(1, decode, link.id, m.hardware, m.region, {})
        return (replace(fleet, models=(replace(m, disaggregation=d),), links=(link,)),
                [("pd", f"1:{decode}"), ("link_gb_s", str(bandwidth)), ("link_latency_ms", "1.0")])
    if knob == "max_num_seqs":
        seqs = rng.choice([4, 8, 16])
        return with_engine(max_num_seqs=seqs), [("max_num_seqs", str(seqs))]
    if knob == "prefix_caching":
        return with_engine(enable_prefix_caching=False), [("prefix_caching", "false")]
    raise ValueError(f"unknown what-if knob {knob!r}; known: {', '.join(KNOBS)}")


def captured_settings(fleet: FleetSpec) -> list[tuple[str, str]]:
    """Config A as `infertrace replay --captured` settings: the engine config of its one model, its replicas and its
    router's policy (what a capture without the engines' configuration in its spans needs to be told)."""
    m = fleet.models[0]
    defaults = EngineConfig()
    engine = {**{k: getattr(defaults, k) for k in ("tensor_parallel", "policy", "max_num_batched_tokens",
                                                   "max_num_seqs", "chunked_prefill", "enable_prefix_caching",
                                                   "prefill_microbatch")}, **m.engine}
    return [("hardware", m.hardware), ("replicas", str(m.replicas)),
            ("tensor_parallel", str(engine["tensor_parallel"])), ("policy", engine["policy"]),
            ("max_num_batched_tokens", str(engine["max_num_batched_tokens"])),
            ("max_num_seqs", str(engine["max_num_seqs"])),
            ("chunked_prefill", str(bool(engine["chunked_prefill"])).lower()),
            ("prefix_caching", str(bool(engine["enable_prefix_caching"])).lower()),
            ("prefill_microbatch", str(engine["prefill_microbatch"])), ("router_policy", fleet.routers[0].policy)]


def whatif_scenarios(seed: int, count: int, duration_s: float, hidden: bool = False) -> list[dict[str, Any]]:
    """`count` scenarios cycling through the knobs: each {name, seed, knob, model, settings, a, b, cost}. With
    `hidden`, both runs' engines have cost parameters of their own (drawn per scenario) that the spans do not
    carry: a replay must calibrate on the capture's steps to predict them."""
    out = []
    for i in range(count):
        knob = KNOBS[i % len(KNOBS)]
        rng = random.Random(f"whatif-{seed}-{i}{'-hidden' if hidden else ''}")
        name = f"{i:03d}-{knob}"
        cost = hidden_cost(rng) if hidden else None
        a = _fleet(rng, name, duration_s, cost)
        b, settings = _variant(rng, a, knob)
        out.append({"name": name, "seed": seed * 1000 + i, "knob": knob, "model": a.models[0].name,
                    "settings": settings, "a": a, "b": b, "duration_s": duration_s, "cost": cost})
    return out


def _without_cost(fleet: FleetSpec) -> FleetSpec:
    """The fleet as a fleet file can say it (cost parameters are recorded apart)."""
    return replace(fleet, models=tuple(replace(m, engine={k: v for k, v in m.engine.items() if k != "cost"})
                                       for m in fleet.models))


def _run(fleet: FleetSpec, duration_s: float, seed: int, path: Path, telemetry: str = "infertrace",
         iteration_logs: Path | None = None) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    requests = fleet_requests(fleet, duration_s, seed, DEFAULT_EPOCH_NS)
    writer = OtlpJsonLinesWriter(path)
    # an operator who keeps each engine's log names it after the engine, whose spans then carry that name
    spec = TelemetrySpec(engine=telemetry, instance_ids=iteration_logs is not None, iteration_logs=iteration_logs)
    try:
        summary = Fleet(fleet, writer, seed, DEFAULT_EPOCH_NS, telemetry=spec).run(requests)
    finally:
        writer.close()
    return {"requests": summary.requests, "statuses": {str(k): v for k, v in sorted(summary.statuses.items())}}


def write_whatif_scenario(scenario: dict[str, Any], out_dir: str | Path, telemetry: str = "infertrace",
                          iteration_logs: bool = False) -> dict[str, Any]:
    """Run config A (capture/, exported as the `telemetry` profile; with `iteration_logs`, vLLM's iteration log
    per engine too, in capture/iteration_logs/, each named after its engine, whose spans then carry that name as
    `service.instance.id`) and config B (actual/) on the same requests; write whatif.json."""
    out = Path(out_dir) / scenario["name"]
    s = scenario
    logs = out / "capture" / ITERATION_LOGS_DIR if iteration_logs else None
    capture = _run(s["a"], s["duration_s"], s["seed"], out / "capture" / "traces.jsonl.gz", telemetry, logs)
    actual = _run(s["b"], s["duration_s"], s["seed"], out / "actual" / "traces.jsonl.gz")
    doc = {"schema": WHATIF_SCHEMA, "name": s["name"], "seed": s["seed"], "knob": s["knob"], "model": s["model"],
           "settings": [f"{k}={v}" for k, v in s["settings"]], "duration_s": s["duration_s"],
           "capture": {"traces": "capture/traces.jsonl.gz", "summary": capture, "telemetry": telemetry,
                       **({"iteration_logs": f"capture/{ITERATION_LOGS_DIR}"} if iteration_logs else {}),
                       "captured": [f"{k}={v}" for k, v in captured_settings(s["a"])],
                       "fleet": fleet_to_toml(_without_cost(s["a"]))},
           "actual": {"traces": "actual/traces.jsonl.gz", "summary": actual,
                      "fleet": fleet_to_toml(_without_cost(s["b"]))},
           "hidden_cost": asdict(s["cost"]) if s["cost"] is not None else None}
    (out / WHATIF_FILE).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc


def generate_whatif(seed: int, count: int, duration_s: float, out_dir: str | Path, jobs: int = 1,
                    hidden_cost: bool = False, telemetry: str = "infertrace",
                    iteration_logs: bool = False) -> list[str]:
    """Write `count` what-if scenarios into out_dir, their captures exported as the `telemetry` profile (with
    `iteration_logs`, and vLLM's iteration logs); returns their names. The scenarios do not depend on either."""
    TelemetrySpec(engine=telemetry, iteration_logs=Path(ITERATION_LOGS_DIR) if iteration_logs else None)  # fail early
    scenarios = whatif_scenarios(seed, count, duration_s, hidden_cost)
    n = len(scenarios)
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            list(pool.map(write_whatif_scenario, scenarios, [out_dir] * n, [telemetry] * n, [iteration_logs] * n))
    else:
        for s in scenarios:
            write_whatif_scenario(s, out_dir, telemetry, iteration_logs)
    return [s["name"] for s in scenarios]
