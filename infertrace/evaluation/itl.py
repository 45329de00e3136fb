"""Scores ITL spike attribution against the simulator's ground truth over a scenario bank.

A spike is a stalled step of one engine; the ground truth (`reference_engine/scenarios/ground_truth.py`) lists each
with its culprits (prefill chunks, a recompute flag for a preempted request's) and causes. A
(spike, culprit) pair is (engine instance, step index, culprit request) for every culprit that is not a
recompute. Precision, recall and F1 are computed over the pairs of every scenario (micro-averaged), overall,
per scenario family and per scheduling policy of the engine.

The request-only method knows no step indices: it names a window on an instance (the intersection of the
victims' gaps) and culprits in it. Its pair is correct when a stalled step of that instance ending inside
the window has that culprit; a true pair is recalled when some window covers its step and names its
culprit.

False attribution on negative controls (scenarios whose `negative_control` lists `itl`: preemption storms,
host pauses, on engines whose chunk budget makes prefills stall-free): on the faulty engines, the share of
spikes (stalled steps in the truth or the analysis; windows for the request-only method) that the method
blames on a fresh prefill while the truth has no prefill cause there.

Beside the methods, a naive baseline on the same inputs (spans + client tokens), to show that the bank separates
methods: a spike is a gap at least 1.5 times its own request's median gap (and 2 ms over it), and every other
request on the instance whose prefill interval (first scheduling to first token on the span) overlaps the gap
is blamed, with equal shares; the client's times are taken as they are (no clock offset).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from infertrace.analyzers.itl import ItlAnalysis, analyze_itl
from infertrace.analyzers.itl_requests import (
    RequestCulprit,
    RequestOnlyAttribution,
    RequestOnlyParams,
    RequestStall,
    attribute_store_requests,
)
from infertrace.evaluation import ScenarioPool, load_truth, open_scenario_store, scenario_dirs


class _Counts:
    """tp: true pairs found; fn: true pairs missed; fp: named pairs that are wrong; named_ok: named pairs that are
    right (a window can hold several stalled steps, and a step lie in several windows, so named_ok and tp differ
    for the window methods). Precision is named_ok / (named_ok + fp), recall tp / (tp + fn)."""

    def __init__(self) -> None:
        self.tp = self.fp = self.fn = self.named_ok = 0

    def add(self, tp: int, fp: int, fn: int, named_ok: int | None = None) -> None:
        self.tp += tp
        self.fp += fp
        self.fn += fn
        self.named_ok += tp if named_ok is None else named_ok

    def scores(self) -> dict[str, Any]:
        precision = self.named_ok / (self.named_ok + self.fp) if self.named_ok + self.fp else None
        recall = self.tp / (self.tp + self.fn) if self.tp + self.fn else None
        f1 = (2 * precision * recall / (precision + recall)
              if precision is not None and recall is not None and precision + recall else None)
        return {"precision": _r(precision), "recall": _r(recall), "f1": _r(f1), "tp": self.tp, "fp": self.fp,
                "fn": self.fn, "named_ok": self.named_ok}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


# Confidence bins of named culprits: how often a culprit named with that confidence is right (calibration).
CONFIDENCE_BINS = {"<0.5": (0.0, 0.5), "0.5-0.8": (0.5, 0.8), "0.8-0.95": (0.8, 0.95), ">=0.95": (0.95, 1.01)}


def _truth_pairs(itl: dict[str, Any]) -> set[tuple[str, int, str]]:
    return {(s["engine"], s["step_index"], c["request"]) for s in itl["stalled_steps"] for c in s["culprits"]
            if not c["recompute"]}


def _negative_engines(truth: dict[str, Any]) -> set[str]:
    if "itl" not in truth.get("negative_control", []):
        return set()
    root = truth.get("root_cause", {})
    engines = set(root.get("instances", []))
    for model in root.get("models", []):
        if not engines:
            engines |= set(truth.get("topology", {}).get(model, {}).get("engines", []))
    return engines


def score_steps(truth: dict[str, Any], analysis: ItlAnalysis, policies: dict[str, str]) -> dict[str, Any]:
    """Counts for one scenario: per policy, and on negative-control engines."""
    itl = truth["itl"]
    true_pairs = _truth_pairs(itl)
    pred_pairs = analysis.pairs()
    per_policy: dict[str, _Counts] = defaultdict(_Counts)
    for pair in true_pairs | pred_pairs:
        per_policy[policies.get(pair[0], "unknown")].add(pair in true_pairs and pair in pred_pairs,
                                                         pair in pred_pairs and pair not in true_pairs,
                                                         pair in true_pairs and pair not in pred_pairs)
    negative = _negative_engines(truth)
    spikes = false = 0
    labels: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # cause → [truth stalls, labelled the same]
    if negative:
        truth_steps = {(s["engine"], s["step_index"]): s for s in itl["stalled_steps"] if s["engine"] in negative}
        pred_steps = {(s.instance, s.step_index): s for s in analysis.stalls if s.instance in negative}
        spikes = len(truth_steps.keys() | pred_steps.keys())
        for key, s in pred_steps.items():
            fresh = any(not c.recompute for c in s.culprits)
            if fresh and "prefill" not in truth_steps.get(key, {}).get("causes", []):
                false += 1
        for key, t in truth_steps.items():
            for cause in t["causes"]:
                labels[cause][0] += 1
                labels[cause][1] += key in pred_steps and cause in pred_steps[key].causes
    return {"per_policy": per_policy, "negative_spikes": spikes, "negative_false": false, "labels": dict(labels)}


def score_requests(truth: dict[str, Any], attribution: RequestOnlyAttribution,
                   policies: dict[str, str]) -> dict[str, Any]:
    itl = truth["itl"]
    true_pairs = _truth_pairs(itl)
    by_engine: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in itl["stalled_steps"]:
        by_engine[s["engine"]].append(s)
    ends = {}
    for engine, steps in by_engine.items():
        steps.sort(key=lambda s: s["end_ns"])
        ends[engine] = np.array([s["end_ns"] for s in steps], dtype=np.int64)
    per_policy: dict[str, _Counts] = defaultdict(_Counts)
    recalled: set[tuple[str, int, str]] = set()
    negative = _negative_engines(truth)
    spikes = false = 0
    calibration: dict[str, list[int]] = {label: [0, 0] for label in CONFIDENCE_BINS}  # [named, right]
    for stall in attribution.stalls:
        e = ends.get(stall.instance, np.array([], dtype=np.int64))
        inside = by_engine.get(stall.instance, [])[int(np.searchsorted(e, stall.start_ns, "right")):
                                                   int(np.searchsorted(e, stall.end_ns, "right"))]
        policy = policies.get(stall.instance, "unknown")
        for c in stall.culprits:
            hits = [(s["engine"], s["step_index"], c.request_id) for s in inside
                    if any(x["request"] == c.request_id and not x["recompute"] for x in s["culprits"])]
            recalled.update(hits)
            per_policy[policy].add(0, not hits, 0, bool(hits))
            label = next(lb for lb, (lo, hi) in CONFIDENCE_BINS.items() if lo <= c.confidence < hi)
            calibration[label][0] += 1
            calibration[label][1] += bool(hits)
        if stall.instance in negative:
            spikes += 1
            if stall.culprits and not any("prefill" in s["causes"] for s in inside):
                false += 1
    for pair in true_pairs:
        found = pair in recalled
        per_policy[policies.get(pair[0], "unknown")].add(int(found), 0, int(not found), 0)
    return {"per_policy": per_policy, "negative_spikes": spikes, "negative_false": false, "calibration": calibration}


# The inputs a store can hold beside the request spans, and the method each combination runs (JSON keys).
COMBINATIONS = {
    "steps": "step spans",
    "requests": "spans only",
    "tokens": "spans + client tokens",
    "iterations": "spans + iteration log",
    "all": "spans + tokens + iteration log",
    "naive": "baseline: prefill overlaps gap",
}


def naive_overlap(requests: pd.DataFrame, token_times: pd.DataFrame, ratio: float = 1.5,
                  min_excess_ns: int = 2_000_000) -> RequestOnlyAttribution:
    """The naive baseline (module docstring): each spike gap is a window, blaming every prefill overlapping it."""
    placed = requests.dropna(subset=["request_id", "instance"]).drop_duplicates("request_id", keep="last")
    instance_of = dict(zip(placed["request_id"].astype(str), placed["instance"].astype(str), strict=True))
    tok = token_times.dropna(subset=["request_id", "time_ns"]).astype({"request_id": str, "time_ns": np.int64})
    tok = tok[tok["request_id"].isin(instance_of)].sort_values(["request_id", "time_ns"], kind="stable")
    rid, t = tok["request_id"].to_numpy(), tok["time_ns"].to_numpy(dtype=np.int64)
    same = np.flatnonzero(rid[1:] == rid[:-1]) + 1
    gaps = pd.DataFrame({"rid": rid[same], "start": t[same - 1], "end": t[same]})
    gaps["itl"] = gaps["end"] - gaps["start"]
    gaps["median"] = gaps.groupby("rid")["itl"].transform("median")
    spikes = gaps[(gaps["itl"] >= ratio * gaps["median"]) & (gaps["itl"] - gaps["median"] >= min_excess_ns)]
    prefill = placed.dropna(subset=["scheduled_ns", "first_token_ns"])
    intervals = {inst: (rows["request_id"].astype(str).to_numpy(), rows["scheduled_ns"].to_numpy(dtype=np.int64),
                        rows["first_token_ns"].to_numpy(dtype=np.int64))
                 for inst, rows in prefill.groupby(prefill["instance"].astype(str))}
    stalls = []
    for victim, start, end, itl, med in spikes[["rid", "start", "end", "itl", "median"]].itertuples(index=False):
        inst = instance_of[victim]
        ids, s, f = intervals.get(inst, (np.array([], dtype=str), np.array([], dtype=np.int64),
                                         np.array([], dtype=np.int64)))
        hit = ids[(s < end) & (f > start) & (ids != victim)]
        culprits = tuple(RequestCulprit(str(r), None, 0, 1 / len(hit), False) for r in hit)
        stalls.append(RequestStall(inst, int(start), int(end), (victim,), int(itl), int(itl - med), culprits))
    return RequestOnlyAttribution(RequestOnlyParams(), tuple(stalls), len(spikes), len(instance_of), "client")


def _family_key(truth: dict[str, Any]) -> str:
    family = truth.get("family", "unknown")
    scheduling = truth.get("details", {}).get("scheduling")
    return f"{family}/{scheduling}" if scheduling else family


def _attributions(store: Any) -> dict[str, Any]:
    """Each combination the store's inputs allow: method key → result (the step analysis or windows)."""
    from infertrace.analyzers.itl_iterations import as_windows, attribute_store_iterations, join_iterations

    out: dict[str, Any] = {}
    if store.sql("SELECT count(*) FROM steps").fetchall()[0][0]:
        out["steps"] = analyze_itl(store)
    if store.sql("SELECT count(*) FROM tokens").fetchall()[0][0]:
        out["requests"] = attribute_store_requests(store, tokens="tokens")
    has_client = store.sql("SELECT count(*) FROM client_tokens").fetchall()[0][0] > 0
    if has_client:
        out["tokens"] = attribute_store_requests(store, tokens="client_tokens")
        out["naive"] = naive_overlap(
            store.sql("SELECT request_id, instance, scheduled_ns, first_token_ns FROM requests").df(),
            store.sql("SELECT request_id, time_ns FROM client_tokens").df())
    if store.sql("SELECT count(*) FROM iteration_log").fetchall()[0][0]:
        iterations = attribute_store_iterations(store)
        out["iterations"] = as_windows(iterations)
        out["_iterations"] = iterations
        if has_client:
            out["all"] = join_iterations(out["tokens"], iterations)
    return out


def iteration_timing(truth: dict[str, Any], attr: Any, window_ns: int = 5_000_000) -> dict[str, int | list[int]]:
    """Stalled steps with a prefill cause on the logged instances, how many a stalled iteration ends within
    `window_ns` of, and each such step's timing error (ns)."""
    logged = {lg.instance for lg in attr.logs if lg.instance is not None}
    by_instance: dict[str, np.ndarray] = defaultdict(lambda: np.array([], dtype=np.int64))
    for inst in logged:
        by_instance[inst] = np.array(sorted(s.end_ns for s in attr.stalls if s.instance == inst), dtype=np.int64)
    steps = [s for s in truth["itl"]["stalled_steps"] if s["engine"] in logged and "prefill" in s["causes"]]
    errors = []
    for s in steps:
        e = by_instance[s["engine"]]
        if not len(e):
            continue
        k = int(np.searchsorted(e, s["end_ns"]))
        near = min(abs(int(e[j]) - s["end_ns"]) for j in (k - 1, k) if 0 <= j < len(e))
        if near <= window_ns:
            errors.append(near)
    return {"stalls": len(steps), "found": len(errors), "errors_ns": errors}


def _score_scenario(scenario: Path) -> dict[str, Any]:
    """One scenario's counts: per method its inputs allow (in `COMBINATIONS`' order), and the iteration logs'
    timing (None without them)."""
    truth = load_truth(scenario)
    with open_scenario_store(scenario) as store:
        results = _attributions(store)
        policies = dict(store.sql("SELECT DISTINCT instance, policy FROM steps").fetchall())
    methods = {method: score_steps(truth, results[method], policies) if method == "steps"
               else score_requests(truth, results[method], policies) for method in COMBINATIONS if method in results}
    timing = iteration_timing(truth, results["_iterations"]) if "_iterations" in results else None
    return {"scenario": scenario.name, "family": _family_key(truth), "methods": methods, "iteration_timing": timing}


def evaluate_itl(bank: str | Path, pool: ScenarioPool | None = None) -> dict[str, Any]:
    """Scores every method the bank's inputs allow over every scenario of the bank (its scenarios through `pool`)."""
    started = time.perf_counter()
    methods = tuple(COMBINATIONS)
    overall = {m: _Counts() for m in methods}
    per_family: dict[str, dict[str, _Counts]] = defaultdict(lambda: {m: _Counts() for m in methods})
    per_policy: dict[str, dict[str, _Counts]] = defaultdict(lambda: {m: _Counts() for m in methods})
    negative = {m: [0, 0] for m in methods}  # [false, spikes]
    family_negative: dict[str, dict[str, list[int]]] = defaultdict(lambda: {m: [0, 0] for m in methods})
    calibration = {m: {label: [0, 0] for label in CONFIDENCE_BINS} for m in methods}
    ran: dict[str, int] = defaultdict(int)  # scenarios each method ran on
    labels: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    timing = {"stalls": 0, "found": 0, "errors_ns": []}
    family_timing: dict[str, dict[str, Any]] = defaultdict(lambda: {"stalls": 0, "found": 0, "errors_ns": []})
    scenarios = []
    families: dict[str, int] = defaultdict(int)
    for scored in (pool or ScenarioPool()).map(_score_scenario, scenario_dirs(bank)):
        family = scored["family"]
        families[family] += 1
        for method, result in scored["methods"].items():
            ran[method] += 1
            for policy, counts in result["per_policy"].items():
                for target in (overall[method], per_family[family][method], per_policy[policy][method]):
                    target.add(counts.tp, counts.fp, counts.fn, counts.named_ok)
            for target in (negative[method], family_negative[family][method]):
                target[0] += result["negative_false"]
                target[1] += result["negative_spikes"]
            for label, (named, right) in result.get("calibration", {}).items():
                calibration[method][label][0] += named
                calibration[method][label][1] += right
            if method == "steps":
                for cause, (n, same) in result["labels"].items():
                    labels[cause][0] += n
                    labels[cause][1] += same
        if (found := scored["iteration_timing"]) is not None:
            for target in (timing, family_timing[family]):
                target["stalls"] += found["stalls"]
                target["found"] += found["found"]
                target["errors_ns"] += found["errors_ns"]
        scenarios.append(scored["scenario"])

    def rate(method: str) -> float | None:
        false, spikes = negative[method]
        return _r(false / spikes) if spikes else None

    def family_scores(family: str, counts: dict[str, _Counts], method: str) -> dict[str, Any]:
        false, spikes = family_negative[family][method]
        return {**counts[method].scores(), "false_attribution_rate": _r(false / spikes) if spikes else None,
                "negative_control_false": false, "negative_control_spikes": spikes}

    def section(method: str) -> dict[str, Any]:
        return {**overall[method].scores(), "scenarios_run": ran[method], "false_attribution_rate": rate(method),
                "calibration": {label: {"named": n, "right": r, "share_right": _r(r / n) if n else None}
                                for label, (n, r) in calibration[method].items()},
                "negative_control_spikes": negative[method][1], "negative_control_false": negative[method][0],
                "per_family": {f: family_scores(f, c, method) for f, c in sorted(per_family.items())},
                "per_policy": {p: c[method].scores() for p, c in sorted(per_policy.items())}}

    def timing_summary(t: dict[str, Any]) -> dict[str, Any]:
        errors = np.array(t["errors_ns"], dtype=np.int64)
        return {"stalls": t["stalls"], "found_within_5ms": t["found"],
                "stall_recall": _r(t["found"] / t["stalls"]) if t["stalls"] else None,
                "timing_error_p50_ms": _r(float(np.median(errors)) / 1e6) if len(errors) else None,
                "timing_error_p95_ms": _r(float(np.quantile(errors, 0.95)) / 1e6) if len(errors) else None}

    steps = section("steps")
    steps["negative_control_labels"] = {cause: {"stalls": n, "labelled": same, "accuracy": _r(same / n if n else None)}
                                        for cause, (n, same) in sorted(labels.items()) if cause != "prefill"}
    return {**steps, "scenarios": len(scenarios), "families": dict(sorted(families.items())),
            "request_only": section("requests"),
            "inputs": {m: section(m) for m in methods if m not in ("steps", "requests", "naive")},
            "baseline": section("naive"),
            "iteration_timing": {**timing_summary(timing),
                                 "per_family": {f: timing_summary(t) for f, t in sorted(family_timing.items())}},
            "seconds": round(time.perf_counter() - started, 1)}


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def render_itl(result: dict[str, Any]) -> str:
    """The `itl` section as a plain-text table: every input combination overall, then per family."""
    sections = {"steps": result, "requests": result["request_only"], **result.get("inputs", {}),
                "naive": result.get("baseline", {})}
    lines = [
        f"ITL spike attribution — {result['scenarios']} scenarios "
        f"({', '.join(f'{f} {n}' for f, n in result['families'].items())})",
        "",
        f"{'inputs':34} {'scen.':>5} {'precision':>9} {'recall':>7} {'f1':>6} {'tp':>7} {'fp':>6} {'fn':>6} "
        f"{'false attr.':>12}",
    ]

    def row(name: str, s: dict[str, Any]) -> str:
        false = (f"{_fmt(s['false_attribution_rate'])} ({s['negative_control_false']}/"
                 f"{s['negative_control_spikes']})")
        return (f"{name:34} {s['scenarios_run']:>5} {_fmt(s['precision']):>9} "
                f"{_fmt(s['recall']):>7} {_fmt(s['f1']):>6} {s['tp']:>7} {s['fp']:>6} {s['fn']:>6} {false:>12}")

    for key, title in COMBINATIONS.items():
        s = sections.get(key)
        if s is not None and (s["scenarios_run"] or key in ("steps", "requests")):
            lines.append(row(title if key != "requests" else "spans only (token spans)", s))
    for cause, s in result.get("negative_control_labels", {}).items():
        lines.append(f"  step spans: {cause} stalls labelled {cause}: {s['labelled']} of {s['stalls']}")
    for key, title in COMBINATIONS.items():
        bins = sections.get(key, {}).get("calibration", {})
        if key != "steps" and any(b["named"] for b in bins.values()):
            lines.append(f"  {title}: named culprits right, by confidence: " + ", ".join(
                f"{label} {_fmt(b['share_right'])} of {b['named']}" for label, b in bins.items() if b["named"]))
    timing = result.get("iteration_timing", {})
    if timing.get("stalls"):
        lines.append(f"  iteration log: {timing['found_within_5ms']} of {timing['stalls']} prefill stalls found within "
                     f"5 ms (recall {_fmt(timing['stall_recall'])}); timing error p50 "
                     f"{_fmt(timing['timing_error_p50_ms'])} ms, p95 {_fmt(timing['timing_error_p95_ms'])} ms")
    lines += ["", "by family (false attr.: named windows on negative-control engines with no prefill cause; "
              "timing: stalls found within 5 ms, and the p95 error):",
              f"  {'family':28} {'inputs':32} {'precision':>9} {'recall':>7} {'pairs':>6} {'false attr.':>16}"]
    for family in result["families"]:
        name = family
        for key, title in COMBINATIONS.items():
            s = sections.get(key, {}).get("per_family", {}).get(family)
            if s is None or (s["tp"] + s["fp"] + s["fn"] + s.get("negative_control_spikes", 0)) == 0:
                continue
            false = (f"{_fmt(s['false_attribution_rate'])} ({s['negative_control_false']}/"
                     f"{s['negative_control_spikes']})" if s.get("negative_control_spikes") else "—")
            line = (f"  {name:28} {title:32} {_fmt(s['precision']):>9} {_fmt(s['recall']):>7} "
                    f"{s['tp'] + s['fn']:>6} {false:>16}")
            t = timing.get("per_family", {}).get(family)
            if key == "iterations" and t and t["stalls"]:
                line += (f"  timing: {_fmt(t['stall_recall'])} of {t['stalls']} within 5 ms, p95 "
                         f"{_fmt(t['timing_error_p95_ms'])} ms")
            lines.append(line)
            name = ""
    lines += ["", "by policy (step spans | spans only):"]
    for name, s in result["per_policy"].items():
        r = result["request_only"]["per_policy"].get(name, {"precision": None, "recall": None})
        lines.append(f"  {name:32} P {_fmt(s['precision'])} R {_fmt(s['recall'])} ({s['tp'] + s['fn']} pairs)"
                     f" | P {_fmt(r['precision'])} R {_fmt(r['recall'])}")
    lines += ["", f"{result['seconds']} s"]
    return "\n".join(lines)
