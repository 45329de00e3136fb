"""What-if replay against ground truth: for each scenario of a what-if bank (`infertrace scenarios whatif`), the
capture of config A replayed under A (the baseline, against A's capture) and under B (against an actual run of
B on the same requests).

Criteria (per scenario): the baseline's TTFT and ITL p50 and p99 within 5% of A's capture; the prediction of B
within 5% of the actual run at p50 and within 10% at p99. A metric under 1 ms is held to 0.2 ms instead (the
relative error of a sub-millisecond latency says nothing).

A capture exported as a real engine's telemetry (whatif.json's `capture.telemetry`, e.g. `vllm-v1`: request spans
only) carries neither the engines' configuration nor their steps: the replay takes A's configuration from
whatif.json's `captured` settings (as `infertrace replay --captured`), calibrates on each request's measured prefill
and decode times, and is held to 15% everywhere; the baseline is compared on what such a capture holds (TTFT; ITL
only where the store has per-token times).

A variant the replay itself says it cannot predict from the capture (`compare.variant_caveat`: e.g. another
tensor-parallel degree from request timings alone) is scored all the same and counted as flagged, so the figures
show both what it predicted and that it said not to trust it.

The replayer is passed in (`infertrace evaluate` gives the reference engine's): the toolkit never imports the
engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any

from infertrace.evaluation import ScenarioPool, open_ingested_store
from infertrace.replay.capture import Capture, Distribution, ReplayRequest, read_capture
from infertrace.replay.compare import compute_floor_variant, relative_error, variant_caveat
from infertrace.replay.deployment import Deployment, apply_settings, parse_setting
from infertrace.store.store import Store

WHATIF_FILE = "whatif.json"
METRICS = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
P50_TOLERANCE, P99_TOLERANCE, BASELINE_TOLERANCE, FLOOR_MS = 0.05, 0.10, 0.05, 0.2
REQUEST_TELEMETRY_TOLERANCE = 0.15  # captures without step spans (vLLM's request spans)

Replayer = Callable[[tuple[ReplayRequest, ...], Deployment], Distribution]
# fits the capture's deployment's cost model to its measured steps (the store's step spans)
Calibrator = Callable[[Store, Capture], tuple[Capture, str]]


def whatif_dirs(bank: str | Path) -> list[Path]:
    root = Path(bank)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such scenario directory")
    return sorted(p.parent for p in root.glob(f"*/{WHATIF_FILE}"))


def _store(run_dir: Path, iteration_logs: Path | None = None) -> Store:
    """`<run>/store`, ingesting `<run>/traces.jsonl.gz` (and the vLLM iteration logs in `iteration_logs`) the first
    time."""
    logs = sorted(iteration_logs.glob("*.log")) if iteration_logs is not None else []
    return open_ingested_store(run_dir / "store", run_dir / "traces.jsonl.gz", logs=logs)


def _errors(predicted: Distribution, observed: Distribution) -> dict[str, float | None]:
    return {m: relative_error(getattr(predicted, m), getattr(observed, m)) for m in METRICS}


def _within(predicted: Distribution, observed: Distribution, tolerance: dict[str, float],
            metrics: tuple[str, ...] = METRICS) -> bool:
    for m in metrics:
        p, o = getattr(predicted, m), getattr(observed, m)
        if p is None or o is None:
            return False
        if abs(p - o) > FLOOR_MS and abs(p - o) > tolerance[m] * o:
            return False
    return True


def evaluate_scenario(scenario: Path, replay: Replayer, calibrate: Calibrator | None = None) -> dict[str, Any]:
    """A scenario whose engines had hidden cost parameters is replayed calibrated (the capture's steps fitted
    first); its uncalibrated baseline's error is kept beside, for comparison."""
    spec = json.loads((scenario / WHATIF_FILE).read_text(encoding="utf-8"))
    model = spec["model"]
    telemetry = spec["capture"].get("telemetry", "infertrace")
    calibration = None
    uncalibrated = None
    logs = spec["capture"].get("iteration_logs")
    with _store(scenario / "capture", scenario / logs if logs else None) as a_store:
        capture: Capture = read_capture(a_store, model)
        if capture.config_source == "flags" and spec["capture"].get("captured"):
            captured = [parse_setting(s) for s in spec["capture"]["captured"]]
            capture = replace(capture, deployment=apply_settings(capture.deployment, captured))
        if spec.get("hidden_cost") and calibrate is not None:
            uncalibrated = _errors(replay(capture.requests, capture.deployment), capture.observed)
            capture, calibration = calibrate(a_store, capture)
    with _store(scenario / "actual") as b_store:
        actual = read_capture(b_store, model).observed
    variant = apply_settings(capture.deployment, [parse_setting(s) for s in spec["settings"]])
    baseline = replay(capture.requests, capture.deployment)
    predicted = replay(capture.requests, variant)
    if capture.has_step_spans:
        baseline_tolerance, p50, p99 = BASELINE_TOLERANCE, P50_TOLERANCE, P99_TOLERANCE
    else:
        baseline_tolerance = p50 = p99 = REQUEST_TELEMETRY_TOLERANCE
    compared = tuple(m for m in METRICS if getattr(capture.observed, m) is not None)
    baseline_ok = _within(baseline, capture.observed, dict.fromkeys(METRICS, baseline_tolerance), compared)
    variant_ok = _within(predicted, actual, {m: p50 if "p50" in m else p99 for m in METRICS})
    caveat = variant_caveat(capture, variant, calibration is not None)
    floor = compute_floor_variant(capture, variant) if calibration is not None else None
    at_floor = replay(capture.requests, floor) if floor is not None else None
    return {"scenario": scenario.name, "knob": spec["knob"], "model": model, "settings": spec["settings"],
            "capture_telemetry": telemetry, "baseline_compared_on": list(compared),
            "tolerance": {"baseline": baseline_tolerance, "p50": p50, "p99": p99},
            "requests": len(capture.requests), "captured": {m: getattr(capture.observed, m) for m in METRICS},
            "baseline": {m: getattr(baseline, m) for m in METRICS}, "actual": {m: getattr(actual, m) for m in METRICS},
            "predicted": {m: getattr(predicted, m) for m in METRICS},
            "baseline_error": _errors(baseline, capture.observed), "prediction_error": _errors(predicted, actual),
            "baseline_ok": baseline_ok, "prediction_ok": variant_ok, "untrustworthy": caveat,
            # a variant past what the capture measured of the compute efficiency, replayed at the lowest it allows:
            # with the fitted prediction, the bracket the capture can give (`bracketed`: actual within it, its ends
            # widened by the metric's tolerance, per metric)
            "floor_prediction_error": _errors(at_floor, actual) if at_floor is not None else None,
            "bracketed": {m: _between(getattr(actual, m), getattr(predicted, m), getattr(at_floor, m),
                                      p50 if "p50" in m else p99) for m in METRICS} if at_floor is not None else None,
            "calibrated": calibration is not None,
            "calibration": calibration, "uncalibrated_baseline_error": uncalibrated,
            "cost_error": _cost_error(capture.deployment.cost, spec.get("hidden_cost")) if calibration else None,
            "notes": list(capture.notes)}


# The cost parameters every engine of a hidden-cost scenario draws (the rest keep their defaults).
FITTED_PARAMETERS = ("compute_efficiency", "memory_efficiency", "attention_efficiency", "step_overhead_s")


def _cost_error(fitted: dict[str, float], hidden: dict[str, float | None] | None) -> dict[str, float] | None:
    """Each drawn parameter's relative error, the calibrated one against the engines' hidden one: how well the
    calibration recovered the engine, apart from what the replay makes of it."""
    if not hidden:
        return None
    return {k: fitted[k] / hidden[k] - 1 for k in FITTED_PARAMETERS  # type: ignore[operator]
            if hidden.get(k) and fitted.get(k) is not None}


def _between(value: float | None, one: float | None, other: float | None, tolerance: float) -> bool | None:
    if value is None or one is None or other is None:
        return None
    return min(one, other) * (1 - tolerance) <= value <= max(one, other) * (1 + tolerance)


def evaluate_whatif(bank: Path, replay: Replayer, calibrate: Calibrator | None = None,
                    pool: ScenarioPool | None = None) -> dict[str, Any]:
    """Every what-if scenario of the bank (through `pool`: in parallel, `replay` and `calibrate` must be module
    functions)."""
    dirs = whatif_dirs(bank)
    if not dirs:
        return {"scenarios": 0, "note": f"{bank} holds no what-if scenario (infertrace scenarios whatif writes "
                                          "them): nothing was evaluated"}
    rows = (pool or ScenarioPool()).map(partial(evaluate_scenario, replay=replay, calibrate=calibrate), dirs)

    def worst(key: str, metric: str) -> float | None:
        values = [abs(e) for r in rows if r[key] and (e := r[key][metric]) is not None]
        return max(values) if values else None

    knobs: dict[str, dict[str, int]] = {}
    for r in rows:
        k = knobs.setdefault(r["knob"], {"scenarios": 0, "prediction_ok": 0, "baseline_ok": 0, "flagged": 0})
        k["scenarios"] += 1
        k["flagged"] += r.get("untrustworthy") is not None
        k["prediction_ok"] += r["prediction_ok"]
        k["baseline_ok"] += r["baseline_ok"]
    return {"scenarios": len(rows), "calibrated": sum(r["calibrated"] for r in rows),
            "capture_telemetry": sorted({r["capture_telemetry"] for r in rows}),
            "worst_uncalibrated_baseline_error": {m: worst("uncalibrated_baseline_error", m) for m in METRICS}
            if any(r["uncalibrated_baseline_error"] for r in rows) else None,
            "baseline_ok": sum(r["baseline_ok"] for r in rows),
            "prediction_ok": sum(r["prediction_ok"] for r in rows),
            # variants the replay itself says it cannot predict (`Variant.untrustworthy`), met or not
            "flagged_untrustworthy": sum(r.get("untrustworthy") is not None for r in rows),
            # of those past the capture's compute evidence: the actual run between the floor's and the fit's replay
            "compute_bracketed": [sum(all(v is not False for v in r["bracketed"].values()) for r in rows
                                      if r.get("bracketed")), sum(bool(r.get("bracketed")) for r in rows)],
            "median_cost_error": _median_cost_error(rows),
            "worst_baseline_error": {m: worst("baseline_error", m) for m in METRICS},
            "worst_prediction_error": {m: worst("prediction_error", m) for m in METRICS},
            "criteria": {**(rows[0]["tolerance"] if all(r["tolerance"] == rows[0]["tolerance"] for r in rows)
                            else {"baseline": BASELINE_TOLERANCE, "p50": P50_TOLERANCE, "p99": P99_TOLERANCE}),
                         "floor_ms": FLOOR_MS},
            "per_knob": knobs, "per_scenario": rows}


def _median_cost_error(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Per drawn parameter, the median |relative error| of the calibrated value over the scenarios."""
    errors = [r["cost_error"] for r in rows if r.get("cost_error")]
    if not errors:
        return None
    return {k: float(median(abs(e[k]) for e in errors if k in e)) for k in FITTED_PARAMETERS
            if any(k in e for e in errors)}


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:+.1%}"


def render_whatif(section: dict[str, Any]) -> str:
    if not section["scenarios"]:
        return "What-if replay: " + section["note"]
    n = section["scenarios"]
    c = section["criteria"]
    lines = [f"What-if replay on {n} scenarios (captures as {', '.join(section.get('capture_telemetry', []))} "
             f"telemetry): baseline within {c['baseline']:.0%} of the capture in "
             f"{section['baseline_ok']}/{n}; prediction of config B within {c['p50']:.0%} (p50) / {c['p99']:.0%} "
             f"(p99) of the actual run in {section['prediction_ok']}/{n}",
             "  worst |error|       " + "  ".join(f"{m.removesuffix('_ms'):>9}" for m in METRICS),
             "  baseline vs capture " + "  ".join(f"{_pct(section['worst_baseline_error'][m]):>9}" for m in METRICS),
             "  B predicted/actual  " + "  ".join(f"{_pct(section['worst_prediction_error'][m]):>9}" for m in METRICS),
             *(["  uncalibrated baseline " + "  ".join(f"{_pct(section['worst_uncalibrated_baseline_error'][m]):>9}"
                                                       for m in METRICS)
                + f"   ({section['calibrated']} scenarios with hidden engine costs, replayed calibrated)"]
               if section.get("worst_uncalibrated_baseline_error") else []),
             "  per knob: " + ", ".join(f"{k} {v['prediction_ok']}/{v['scenarios']}"
                                        + (f" ({v['flagged']} flagged not trustworthy)" if v.get("flagged") else "")
                                        for k, v in sorted(section["per_knob"].items()))]
    if section.get("median_cost_error"):
        lines.append("  calibrated against the engines' hidden costs, median |error|: " + ", ".join(
            f"{k} {v:.1%}" for k, v in section["median_cost_error"].items()))
    inside, past = section.get("compute_bracketed") or (0, 0)
    if past:
        lines.append(f"  past the capture's compute evidence: {past} variant(s), the actual run within the bracket "
                     f"(replayed at the capture's compute-efficiency floor … at the fit's, each end ± the tolerance) "
                     f"in {inside}/{past}")
    for r in section["per_scenario"]:
        if not (r["prediction_ok"] and r["baseline_ok"]):
            lines.append(f"  missed: {r['scenario']} ({' '.join(r['settings'])}): baseline "
                         + ", ".join(f"{m.removesuffix('_ms')} {_pct(e)}" for m, e in r["baseline_error"].items())
                         + "; prediction "
                         + ", ".join(f"{m.removesuffix('_ms')} {_pct(e)}" for m, e in r["prediction_error"].items())
                         + (" — the replay says: " + r["untrustworthy"] if r.get("untrustworthy") else "")
                         + ("; at the capture's compute floor: " + ", ".join(
                             f"{m.removesuffix('_ms')} {_pct(e)}" for m, e in r["floor_prediction_error"].items())
                            if r.get("floor_prediction_error") else ""))
    return "\n".join(lines)
