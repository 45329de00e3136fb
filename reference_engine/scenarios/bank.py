"""A bank of scenarios: draw them (`bank`), run each through the fleet (`run_scenario`), and write its traces,
its fleet file and its ground truth (kept apart from the traces) into a directory of its own (`generate`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reference_engine.engine.llm_engine import EngineObserver, LLMEngine, StepReport
from reference_engine.engine.sequence import Request, Sequence
from reference_engine.fleet.config import FaultSpec, FleetSpec, fleet_to_toml
from reference_engine.fleet.fleet import Fleet, FleetSummary
from reference_engine.fleet.workload import fleet_requests, prefill_failures
from reference_engine.scenarios.families import FAMILIES, Scenario, engines_of, make_scenario
from reference_engine.scenarios.ground_truth import StallRecorder, itl_truth
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.profiles import TelemetrySpec
from reference_engine.telemetry.timeline import Timeline
from reference_engine.workload import DEFAULT_EPOCH_NS

SCHEMA = "infertrace.ground_truth/1"
TRACES_FILE = "traces.jsonl.gz"
TRUTH_FILE = "ground_truth.json"
FLEET_FILE = "fleet.toml"


def _topology(fleet: FleetSpec) -> dict[str, Any]:
    def owner(group: tuple[Any, ...], model: str) -> str | list[str] | None:
        """The instance of a kind serving the model; a list when several do (by tenant, or sharing its traffic)."""
        ids = [c.id for c in group if model in c.models]
        return ids if len(ids) > 1 else ids[0] if ids else None

    return {m: {"engines": engines_of(fleet, m), "auth": owner(fleet.auth, m),
                "rate_limiter": owner(fleet.rate_limiters, m), "router": owner(fleet.routers, m),
                "global_queue": owner(fleet.global_queues, m),
                "link": fleet.deployment(m).disaggregation.link if fleet.deployment(m).disaggregation else None}
            for m in fleet.model_names}


def _affected(scenario: Scenario, requests: list[Request], epoch_ns: int) -> dict[str, list[str]]:
    """Models and tenants with traffic through the faulty component (or model, or tenant) in the window."""
    start, end = ((epoch_ns + round(scenario.window_s[0] * 1e9), epoch_ns + round(scenario.window_s[1] * 1e9))
                  if scenario.window_s else (epoch_ns, 1 << 62))
    root = scenario.root_cause
    models = set(root.get("models", []))
    hit = [r for r in requests if start <= r.arrival_ns < end and r.model in models
           and (root.get("kind") not in ("tenant", "load") or r.tenant == root["tenant"])]
    if scenario.family == "assistant_prefill_runaway":
        hit = [r for r in hit if r.assistant_prefill_tokens]
    return {"models": sorted({r.model for r in hit}), "tenants": sorted({r.tenant for r in hit})}


def _cause_truth(cause: dict[str, Any], epoch_ns: int) -> dict[str, Any]:
    """A culprit as the ground truth writes it: its window in nanoseconds on the traces' clock."""
    out = {k: v for k, v in cause.items() if k != "window_s"}
    if "window_s" in cause:
        start, end = cause["window_s"]
        out["window"] = {"start_ns": epoch_ns + round(start * 1e9), "end_ns": epoch_ns + round(end * 1e9)}
    return out


class _FirstTokens:
    """When each request got its first token on one engine."""

    def __init__(self, first: dict[str, int]) -> None:
        self.first, self.timeline = first, Timeline(with_steps=False)

    def on_step(self, report: StepReport) -> None:
        self.timeline.on_step(report)

    def on_finish(self, seq: Sequence) -> None:
        tokens = self.timeline.pop(seq.request_id).token_ns
        if tokens and seq.error is None:
            self.first[seq.request_id] = tokens[0]


def run_twin(fleet: FleetSpec, duration_s: float, seed: int, epoch_ns: int = DEFAULT_EPOCH_NS) -> dict[str, Any]:
    """The scenario's traffic on another deployment, without spans: its client TTFT (gateway arrival to the first
    token of the engine the client's tokens come from: a decode worker, else the engine) per request, summarised."""
    requests = fleet_requests(fleet, duration_s, seed, epoch_ns)
    arrived = {r.request_id: r.arrival_ns for r in requests}  # the gateway's arrival (routing moves arrival_ns)
    roles = {i: role for m in fleet.model_names for i, role in fleet.engine_instances(m)}
    first: dict[str, int] = {}

    def observe(instance: str, engine: LLMEngine) -> list[EngineObserver]:
        return [] if roles[instance] == "prefill_worker" else [_FirstTokens(first)]

    summary = Fleet(fleet, None, seed, epoch_ns, observe).run(requests)
    ttft = sorted(first[r] - arrived[r] for r in first)
    median = (ttft[(len(ttft) - 1) // 2] + ttft[len(ttft) // 2]) / 2 if ttft else None
    return {"requests": summary.requests, "answered": len(ttft),
            "ttft_p50_ms": None if median is None else round(median / 1e6, 3)}


def run_scenario(scenario: Scenario, out_dir: str | Path, epoch_ns: int = DEFAULT_EPOCH_NS,
                 on_progress: Callable[[int], None] | None = None,
                 telemetry: TelemetrySpec | None = None) -> dict[str, Any]:
    """Simulate the scenario; write its traces, its fleet file and its ground truth into `out_dir`. `telemetry`:
    whose spans the engines and the gateway emit (the ground truth is the same whatever it is)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    requests = fleet_requests(scenario.fleet, scenario.duration_s, scenario.seed, epoch_ns)
    affected = _affected(scenario, requests, epoch_ns)
    runaway = sorted(r.request_id for r in requests if r.assistant_prefill_tokens and r.output_tokens == r.max_tokens
                     and scenario.family == "assistant_prefill_runaway" and scenario.details.get("mode") == "runaway")
    failing = sorted(prefill_failures(scenario.fleet, requests, scenario.seed, epoch_ns))
    recorders: list[StallRecorder] = []

    def observe(instance: str, engine: LLMEngine) -> list[EngineObserver]:
        recorders.append(StallRecorder(instance, engine))
        return [recorders[-1]]

    writer = OtlpJsonLinesWriter(out / TRACES_FILE)
    try:
        summary: FleetSummary = Fleet(scenario.fleet, writer, scenario.seed, epoch_ns, observe, telemetry).run(
            requests, on_progress)
    finally:
        writer.close()
    (out / FLEET_FILE).write_text(fleet_to_toml(scenario.fleet, relative_to=out), encoding="utf-8")
    fault = scenario.fault
    window = None
    if scenario.window_s is not None:
        window = {"start_ns": epoch_ns + round(scenario.window_s[0] * 1e9),
                  "end_ns": epoch_ns + round(scenario.window_s[1] * 1e9)}
    details = dict(scenario.details)
    if runaway:
        details["runaway_requests"] = runaway
    if failing:
        details["failed_requests"] = failing
    if scenario.twin is not None:
        details["twin"] = run_twin(scenario.twin, scenario.duration_s, scenario.seed, epoch_ns)
    confounders = []
    for c in scenario.confounders:
        f: FaultSpec = c["fault"]
        start, end = f.window_ns(epoch_ns)
        confounders.append({"fault": {"kind": f.kind, "target": f.target, "params": f.params},
                            "window": {"start_ns": start, "end_ns": end}, "kind": c["kind"],
                            "instances": c["instances"], "models": c["models"]})
    several = {}
    if scenario.root_causes:
        several = {"root_causes": [_cause_truth(c, epoch_ns) for c in scenario.root_causes],
                   "symptoms": list(scenario.symptoms)}
    truth = {
        "schema": SCHEMA,
        "scenario": scenario.name,
        "family": scenario.family,
        "seed": scenario.seed,
        "traces": TRACES_FILE,
        "fleet": FLEET_FILE,
        "start_ns": epoch_ns,
        "end_ns": summary.end_ns,
        "duration_s": scenario.duration_s,
        "tasks": list(scenario.tasks),
        "negative_control": list(scenario.negative_control),
        "fault": None if fault is None else {"kind": fault.kind, "target": fault.target, "params": fault.params},
        "window": window,
        "root_cause": _cause_truth(scenario.root_cause, epoch_ns) if several else scenario.root_cause,
        **several,
        "confounders": confounders,
        "affected": affected,
        "details": details,
        "topology": _topology(scenario.fleet),
        "summary": {"requests": summary.requests, "statuses": {str(k): v for k, v in sorted(summary.statuses.items())},
                    "spans": summary.spans},
        "itl": itl_truth(recorders),
    }
    if telemetry is not None and not telemetry.is_native:
        truth["telemetry"] = {"engine": telemetry.engine, "gateway": telemetry.gateway}
        if telemetry.client_tokens is not None:
            truth["telemetry"].update(client_tokens=telemetry.client_tokens.name,
                                      client_delay_ms=telemetry.client_delay_ms,
                                      client_jitter_ms=telemetry.client_jitter_ms)
        if telemetry.iteration_logs is not None:
            truth["telemetry"]["iteration_logs"] = telemetry.iteration_logs.name
    # Indented for reading, except the (long) ITL section: one compact line.
    text = json.dumps({**truth, "itl": "@itl"}, indent=1).replace('"@itl"', json.dumps(truth["itl"],
                                                                                     separators=(",", ":")))
    (out / TRUTH_FILE).write_text(text + "\n", encoding="utf-8")
    return truth


def bank(seed: int, count: int, duration_s: float = 600.0, families: tuple[str, ...] = FAMILIES) -> list[Scenario]:
    """`count` scenarios cycling through the families (in an order drawn from `seed`), each with its own
    random topology, onset, duration and magnitude; root-cause scenarios with confounders."""
    rng = random.Random(seed)
    order = list(families)
    rng.shuffle(order)
    scenarios = []
    for k in range(count):
        family = order[k % len(order)]
        scenario_seed = rng.randrange(1 << 30)
        scenarios.append(make_scenario(family, scenario_seed, f"{k:03d}-{family}", duration_s, confounders=True))
    return scenarios


CLIENT_TOKENS_FILE = "client_tokens.jsonl"
ITERATION_LOGS_DIR = "iteration_logs"


@dataclass(frozen=True)
class SideFiles:
    """What each scenario writes beside its spans: a streaming client's token times, with a delivery delay and a
    per-token jitter drawn per scenario (uniform in each range, from the scenario's seed), and vLLM V1's
    iteration logs."""

    client_tokens: bool = False
    delay_ms: tuple[float, float] = (2.0, 2.0)
    jitter_ms: tuple[float, float] = (1.0, 1.0)
    iteration_logs: bool = False

    def spec(self, telemetry: TelemetrySpec | None, scenario: Scenario, out: Path) -> TelemetrySpec | None:
        if not self.client_tokens and not self.iteration_logs:
            return telemetry
        rng = random.Random(f"client-{scenario.seed}")
        return replace(telemetry or TelemetrySpec(),
                       client_tokens=out / CLIENT_TOKENS_FILE if self.client_tokens else None,
                       client_delay_ms=round(rng.uniform(*self.delay_ms), 2),
                       client_jitter_ms=round(rng.uniform(*self.jitter_ms), 2),
                       iteration_logs=out / ITERATION_LOGS_DIR if self.iteration_logs else None)


def _run_into(job: tuple[Scenario, Path, TelemetrySpec | None, SideFiles]) -> dict[str, Any]:
    scenario, out, telemetry, side = job
    where = out / scenario.name
    truth = run_scenario(scenario, where, telemetry=side.spec(telemetry, scenario, where))
    return {k: truth[k] for k in ("scenario", "family", "tasks", "negative_control")}


def generate(scenarios: list[Scenario], out_dir: str | Path, jobs: int = 1,
             on_done: Callable[[], None] | None = None, telemetry: TelemetrySpec | None = None,
             side: SideFiles | None = None) -> list[dict[str, Any]]:
    """Run every scenario into its own sub-directory of `out_dir` (in `jobs` processes); write index.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = [(s, out, telemetry, side or SideFiles()) for s in scenarios]
    truths = []
    if jobs == 1:
        for job in work:
            truths.append(_run_into(job))
            if on_done is not None:
                on_done()
    else:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            for truth in pool.imap(_run_into, work):
                truths.append(truth)
                if on_done is not None:
                    on_done()
    write_index(out, truths)
    return truths


def write_index(out_dir: str | Path, truths: list[dict[str, Any]]) -> None:
    index = [{"scenario": t["scenario"], "family": t["family"], "tasks": t["tasks"],
              "negative_control": t["negative_control"], "path": t["scenario"]} for t in truths]
    (Path(out_dir) / "index.json").write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
