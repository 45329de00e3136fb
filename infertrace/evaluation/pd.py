"""Prefill/decode disaggregation against ground truth, in two parts, each beside naive baselines scored the same way.

**Recommendation.** For each scenario of the bank whose tasks include `pd` (family `cpu_decode_host`: CPU-only
hosts serving a model), the report built from the store must recommend a GPU prefill host in front of the model's
engines and quote a TTFT p50 within 15% of what the scenario's twin (the same traffic on that disaggregated
deployment, simulated beside it) measured. The scenarios are scored all together and per variant (`VARIANTS`): one
CPU host, whose GPU prefill host would be nearly idle, and several CPU hosts sharing one GPU prefill host, busy
enough that its queue is a large part of the TTFT. Two naive estimates of the same TTFT p50 are scored beside it:

- `gpu_prefill_alone`: the median prompt's roofline prefill time on the GPU, nothing else (no gateway, no wait at
  the GPU host, no KV transfer, no decode step): what a glance at a roofline table quotes;
- `flops_ratio`: the CPU-only host's observed TTFT p50 scaled by the ratio of the two devices' peak FLOP/s (as if
  TTFT were all compute, its minutes of queueing included).

and an ablation of the estimate itself, `unbatched_fifo`: the same replay with the GPU host prefilling one prompt
a step (a plain FIFO queue, without the engine's batching of waiting prompts up to its step budget): what
modelling the batching is worth where the host is busy.

**Root cause.** For the P/D families scored by root-cause ranking (`PD_RCA_FAMILIES`: a KV link congesting, a
tenant's surge saturating a prefill pool, the prefill pool slowing), AC@k as the `rca` section scores it
(`evaluation.rca`), per family beside that section's baselines (random ranking, the highest own anomaly scored as
BARO scores services, the most models served). A surge's cause is the tenant's load; its truth also names the pool
it saturated (`pool`); a pool that lost capacity (its engine slowed) is itself the cause, its truth naming it as
`pool` too. For each such culprit the top cause must be the culprit and *name the pool*: be that pool, or have
the blame that reached it come through engine queueing at that pool more than at any other (`blame.py`: a disaggregated
request's time to its first token is blamed per leg, from the pool that served it).
"""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

from infertrace.analyzers.blame import ENGINE_QUEUEING
from infertrace.analyzers.pools import POOL_KINDS
from infertrace.evaluation import ScenarioPool, load_truth, open_scenario_store, scenario_dirs

if TYPE_CHECKING:
    from infertrace.analyzers.rca import RcaReport
    from infertrace.evaluation.rca import ScenarioResult

TOLERANCE = 0.15
NAIVE = ("gpu_prefill_alone", "flops_ratio", "unbatched_fifo")
PD_RCA_FAMILIES = ("cross_dc_read_write", "kv_transfer_congestion")
VARIANTS = ("one CPU host", "CPU hosts sharing a GPU prefill host")
POOL_SUFFIXES = tuple(f" {name}" for name in POOL_KINDS.values())  # a pool candidate's id ends so


def _scored(quoted: float | None, measured: float | None) -> dict[str, Any]:
    if quoted is None or not measured:
        return {"quoted_ttft_p50_ms": quoted, "relative_error": None, "ok": False}
    error = (quoted - measured) / measured
    return {"quoted_ttft_p50_ms": round(quoted, 3), "relative_error": round(error, 4), "ok": abs(error) <= TOLERANCE}


def naive_estimates(estimate: dict[str, Any]) -> dict[str, float | None]:
    """The naive baselines' TTFT p50 (ms) for a CPU-only engine, from the report's `gpu_prefill_host` entry."""
    from infertrace.analyzers.roofline import HARDWARE

    cpu, gpu = HARDWARE.get(estimate["hardware"]), HARDWARE.get(estimate["gpu_hardware"])
    ratio = (estimate["ttft_p50_ms"] * cpu.peak_flops / gpu.peak_flops
             if cpu is not None and gpu is not None and estimate["ttft_p50_ms"] is not None else None)
    return {"gpu_prefill_alone": estimate["predicted_prefill_p50_ms"], "flops_ratio": ratio}


def _unbatched(store: Any, model: str) -> float | None:
    """The estimate's TTFT p50 (ms) with the GPU host taking one prompt a step (`unbatched_fifo`)."""
    from infertrace.analyzers.disaggregation import gpu_prefill_estimates

    found = [g for g in gpu_prefill_estimates(store, step_budget=0)[0] if g.model == model]
    ns = found[0].predicted_ttft_p50_ns if found else None
    return None if ns is None else ns / 1e6


def _variant(truth: dict[str, Any]) -> str:
    return VARIANTS[0] if truth["details"].get("cpu_hosts", 1) == 1 else VARIANTS[1]


def _scenario(scenario: Path, truth: dict[str, Any]) -> dict[str, Any]:
    from infertrace.report.model import ReportOptions, build_report

    measured = truth["details"].get("twin", {}).get("ttft_p50_ms")
    models = set(truth["root_cause"].get("models", ()))
    row: dict[str, Any] = {"scenario": truth["scenario"], "family": truth["family"], "variant": _variant(truth),
                           "cpu_hosts": truth["details"].get("cpu_hosts", 1), "gpu_utilization": None,
                           "measured_ttft_p50_ms": measured, "quoted_ttft_p50_ms": None, "relative_error": None,
                           "recommended": False, "ok": False, "why": None,
                           "baselines": {name: _scored(None, measured) for name in NAIVE}}
    with open_scenario_store(scenario) as store:
        doc = build_report(store, ReportOptions(sections=("ttft",)))
        estimates = [g for g in doc["sections"]["ttft"].get("gpu_prefill_host", []) if g["model"] in models]
        if estimates:
            naive = {**naive_estimates(estimates[0]), "unbatched_fifo": _unbatched(store, estimates[0]["model"])}
            row["baselines"] = {name: _scored(q, measured) for name, q in naive.items()}
            row["gpu_utilization"] = estimates[0]["gpu_utilization"]
    found = [r for r in doc["recommendations"]
             if r["id"].startswith("gpu_prefill_host:") and r["id"].split(":", 1)[1] in models]
    if measured is None:
        row["why"] = "the ground truth has no twin measurement"
    elif not found:
        why = doc["sections"]["ttft"].get("not_estimated") or []
        row["why"] = "no GPU prefill host recommendation" + (f" ({'; '.join(why)})" if why else "") + \
            ("" if estimates else "; no CPU-only engine found")
    else:
        scored = _scored(found[0]["evidence"]["predicted_ttft_p50_ms"], measured)
        row.update(quoted_ttft_p50_ms=scored["quoted_ttft_p50_ms"], relative_error=scored["relative_error"],
                   recommended=True, ok=scored["ok"])
    return row


def _named_pool(cause: Any) -> str | None:
    """The pool a ranked cause names: itself, or the pool its blame came through most (`ENGINE_QUEUEING`)."""
    if cause.candidate.id.endswith(POOL_SUFFIXES):
        return str(cause.candidate.id)
    queued = [(n, how[len(ENGINE_QUEUEING):]) for how, n in cause.received if how.startswith(ENGINE_QUEUEING)]
    pools = [(n, where) for n, where in queued if where.endswith(POOL_SUFFIXES)]
    return max(pools)[1] if pools else None


def _pools_named(report: RcaReport, truth: dict[str, Any]) -> list[dict[str, Any]]:
    """For each culprit whose truth names the pool it saturated: the pool the top cause of its incident names,
    read from the RCA report the scenario was scored with (`evaluation.rca.evaluate_scenario`)."""
    from infertrace.evaluation.rca import as_served, culprits, is_true, match

    out = []
    for cause in (c for c in culprits(truth) if c.get("pool")):
        found = match(report.diagnoses, as_served(cause, report.topology))
        top = found.causes[0] if found is not None and found.causes else None
        named = None if top is None else _named_pool(top)
        # the pool named by the culprit itself: a surge's pool named by the pool's own candidate is a wrong culprit
        right = top is not None and is_true(top.candidate, cause)
        out.append({"scenario": truth["scenario"], "kind": cause.get("kind"), "pool": cause["pool"], "named": named,
                    "top": None if top is None else top.label(), "top_is_culprit": right,
                    "ok": right and named == cause["pool"]})
    return out


def _rca_scored(scenario: Path, truth: dict[str, Any]) -> tuple[list[ScenarioResult], list[dict[str, Any]]]:
    """A P/D root-cause scenario's culprits scored as the `rca` section scores them, and the pools named for them."""
    from infertrace.evaluation.rca import evaluate_scenario

    if truth.get("family") not in PD_RCA_FAMILIES or "rca" not in truth.get("tasks", ()):
        return [], []
    scored, _, report = evaluate_scenario(scenario)
    return scored, [] if report is None else _pools_named(report, truth)


def _rca(results: list[ScenarioResult], pools: list[dict[str, Any]]) -> dict[str, Any]:
    from infertrace.evaluation.rca import BASELINES, accuracy

    families = sorted({r.family for r in results})

    def scores(family: str | None) -> dict[str, Any]:
        mine = [r for r in results if family in (None, r.family)]
        return {"infertrace": accuracy(r.hit_at for r in mine).to_json(),
                **{b: accuracy(r.baselines[b] for r in mine).to_json() for b in BASELINES}}

    return {"cases": len(results), **scores(None), "per_family": {f: scores(f) for f in families},
            "pool_named": {"cases": len(pools), "named": sum(p["ok"] for p in pools), "scenarios": pools},
            "scenarios": [{"scenario": r.scenario, "family": r.family, "truth": list(r.truth), "top": r.top,
                           "hit@1": r.hit_at[0], "hit@3": r.hit_at[2]} for r in results]}


def _scores(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = sum(r["ok"] for r in rows)
    return {"cases": len(rows), "within_tolerance": ok,
            "share_within_tolerance": round(ok / len(rows), 4) if rows else None,
            "median_abs_error": _median_abs([r["relative_error"] for r in rows]),
            "baselines": {name: {"within_tolerance": sum(r["baselines"][name]["ok"] for r in rows),
                                 "median_abs_error": _median_abs([r["baselines"][name]["relative_error"]
                                                                  for r in rows])} for name in NAIVE}}


def _score_scenario(scenario: Path) -> tuple[
        dict[str, Any] | None, list[ScenarioResult], list[dict[str, Any]]]:
    """One scenario's part of the section: its recommendation row (None without the pd task), its P/D culprits
    scored, the pools named for them."""
    truth = load_truth(scenario)
    row = _scenario(scenario, truth) if "pd" in truth.get("tasks", ()) else None
    return (row, *_rca_scored(scenario, truth))


def evaluate_pd(bank: str | Path, pool: ScenarioPool | None = None) -> dict[str, Any]:
    """Both parts over a scenario bank directory (its scenarios through `pool`)."""
    rows, results, pools = [], [], []
    for row, scored, named in (pool or ScenarioPool()).map(_score_scenario, scenario_dirs(bank)):
        rows += [] if row is None else [row]
        results += scored
        pools += named
    return {**_scores(rows), "tolerance": TOLERANCE,
            "per_variant": {v: _scores([r for r in rows if r["variant"] == v]) for v in VARIANTS
                            if any(r["variant"] == v for r in rows)},
            "not_analysed": [f"{r['scenario']}: {r['why']}" for r in rows if r["why"]],
            "scenarios": rows, "rca": _rca(results, pools)}


def _median_abs(errors: list[float | None]) -> float | None:
    known = [abs(e) for e in errors if e is not None]
    return round(float(median(known)), 4) if known else None


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _error(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1%}"


def _render_scores(scores: dict[str, Any], tolerance: float, indent: str) -> list[str]:
    lines = []
    for name, b in scores["baselines"].items():
        kind = "ablation" if name == "unbatched_fifo" else "baseline"
        lines.append(f"{indent}{kind} {name.replace('_', ' ')}: {b['within_tolerance']} of {scores['cases']} "
                     f"within {tolerance:.0%} (median |error| {_share(b['median_abs_error'])})")
        if scores["cases"] and b["within_tolerance"] >= scores["within_tolerance"]:
            lines.append(f"{indent}  (at {tolerance:.0%} these scenarios do not separate the estimate from this "
                         f"baseline: compare the median |error|)")
    return lines


def render_pd(section: dict[str, Any]) -> str:
    tolerance = section["tolerance"]
    lines = [f"P/D recommendations: {section['within_tolerance']} of {section['cases']} scenarios quote the GPU "
             f"prefill host's TTFT p50 within {tolerance:.0%} of the disaggregated simulation (median "
             f"|error| {_share(section['median_abs_error'])})", *_render_scores(section, tolerance, "  ")]
    for variant, scores in section["per_variant"].items():
        lines.append(f"  {variant}: {scores['within_tolerance']} of {scores['cases']} within {tolerance:.0%} "
                     f"(median |error| {_share(scores['median_abs_error'])})")
        lines += _render_scores(scores, tolerance, "    ")
    for r in section["scenarios"]:
        naive = ", ".join(f"{name.replace('_', ' ')} {_error(b['relative_error'])}"
                          for name, b in r["baselines"].items())
        why = f" ({r['why']})" if r["why"] else ""
        busy = "" if r["gpu_utilization"] is None else f", GPU host {r['gpu_utilization']:.0%} busy"
        lines.append(f"  {r['scenario']} ({r['cpu_hosts']} CPU host{'' if r['cpu_hosts'] == 1 else 's'}{busy}): "
                     f"measured {r['measured_ttft_p50_ms']} ms, quoted {r['quoted_ttft_p50_ms']} ms, error "
                     f"{_error(r['relative_error'])} (baselines: {naive}){why}")
    if not section["cases"]:
        lines.append("  (no scenario of the bank has the pd task: nothing scored)")
    rca = section["rca"]
    if not rca["cases"]:
        lines.append(f"P/D root-cause ranking: no scenario of {', '.join(PD_RCA_FAMILIES)} with the rca task: "
                     f"nothing scored")
        return "\n".join(lines)
    header = ("P/D root-cause ranking", "cases", "AC@1", "AC@3", "Avg@5")
    rows = [header]
    for family, scores in [("all P/D families", rca), *rca["per_family"].items()]:
        for name in scores:
            if name in ("infertrace", "random", "highest_own_anomaly", "most_models"):
                a = scores[name]
                label = "infertrace" if name == "infertrace" else f"  baseline: {name.replace('_', ' ')}"
                rows.append((f"{family}: {label}" if name == "infertrace" else label, str(a["cases"]),
                             f"{a['ac@1']:.3f}", f"{a['ac@3']:.3f}", f"{a['avg@5']:.3f}"))
    width = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(c.ljust(width[i]) if i == 0 else c.rjust(width[i]) for i, c in enumerate(r)) for r in rows]
    pools = rca["pool_named"]
    if pools["cases"]:
        lines.append(f"culprits whose truth names a pool (a surge that saturated it, or the pool itself) whose top "
                     f"cause is the culprit and names that pool: {pools['named']}/{pools['cases']}")
        for p in pools["scenarios"]:
            culprit = "" if p["top_is_culprit"] else ", not the culprit"
            lines.append(f"  {p['scenario']} ({p['kind']}): top {p['top']}{culprit}, names {p['named'] or 'no pool'} "
                         f"(truth: {p['pool']})")
    return "\n".join(lines)
