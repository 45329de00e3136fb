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
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from infertrace.analyzers.itl import ItlAnalysis, analyze_itl
from infertrace.analyzers.itl_requests import RequestOnlyAttribution, attribute_store_requests
from infertrace.evaluation import load_truth, open_scenario_store, scenario_dirs


class _Counts:
    def __init__(self) -> None:
        self.tp = self.fp = self.fn = 0

    def add(self, tp: int, fp: int, fn: int) -> None:
        self.tp += tp
        self.fp += fp
        self.fn += fn

    def scores(self) -> dict[str, Any]:
        precision = self.tp / (self.tp + self.fp) if self.tp + self.fp else None
        recall = self.tp / (self.tp + self.fn) if self.tp + self.fn else None
        f1 = (2 * precision * recall / (precision + recall)
              if precision is not None and recall is not None and precision + recall else None)
        return {"precision": _r(precision), "recall": _r(recall), "f1": _r(f1), "tp": self.tp, "fp": self.fp,
                "fn": self.fn}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


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
    return {"per_policy": per_policy, "negative_spikes": spikes, "negative_false": false, "labels": labels}


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
    for stall in attribution.stalls:
        e = ends.get(stall.instance, np.array([], dtype=np.int64))
        inside = by_engine.get(stall.instance, [])[int(np.searchsorted(e, stall.start_ns, "right")):
                                                   int(np.searchsorted(e, stall.end_ns, "right"))]
        policy = policies.get(stall.instance, "unknown")
        for c in stall.culprits:
            hits = [(s["engine"], s["step_index"], c.request_id) for s in inside
                    if any(x["request"] == c.request_id and not x["recompute"] for x in s["culprits"])]
            recalled.update(hits)
            per_policy[policy].add(bool(hits), not hits, 0)
        if stall.instance in negative:
            spikes += 1
            if stall.culprits and not any("prefill" in s["causes"] for s in inside):
                false += 1
    for pair in true_pairs - recalled:
        per_policy[policies.get(pair[0], "unknown")].add(0, 0, 1)
    return {"per_policy": per_policy, "negative_spikes": spikes, "negative_false": false}


def evaluate_itl(bank: str | Path) -> dict[str, Any]:
    """Scores both methods over every scenario of the bank."""
    started = time.perf_counter()
    overall = {"steps": _Counts(), "requests": _Counts()}
    per_family: dict[str, dict[str, _Counts]] = defaultdict(lambda: {"steps": _Counts(), "requests": _Counts()})
    per_policy: dict[str, dict[str, _Counts]] = defaultdict(lambda: {"steps": _Counts(), "requests": _Counts()})
    negative = {"steps": [0, 0], "requests": [0, 0]}  # [false, spikes]
    labels: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    scenarios = []
    families: dict[str, int] = defaultdict(int)
    for scenario in scenario_dirs(bank):
        truth = load_truth(scenario)
        family = truth.get("family", "unknown")
        families[family] += 1
        with open_scenario_store(scenario) as store:
            analysis = analyze_itl(store)
            attribution = attribute_store_requests(store)
            policies = dict(store.sql("SELECT DISTINCT instance, policy FROM steps").fetchall())
        for method, result in (("steps", score_steps(truth, analysis, policies)),
                               ("requests", score_requests(truth, attribution, policies))):
            for policy, counts in result["per_policy"].items():
                for target in (overall[method], per_family[family][method], per_policy[policy][method]):
                    target.add(counts.tp, counts.fp, counts.fn)
            negative[method][0] += result["negative_false"]
            negative[method][1] += result["negative_spikes"]
            if method == "steps":
                for cause, (n, same) in result["labels"].items():
                    labels[cause][0] += n
                    labels[cause][1] += same
        scenarios.append(scenario.name)

    def rate(method: str) -> float | None:
        false, spikes = negative[method]
        return _r(false / spikes) if spikes else None

    def section(method: str) -> dict[str, Any]:
        return {**overall[method].scores(), "false_attribution_rate": rate(method),
                "negative_control_spikes": negative[method][1], "negative_control_false": negative[method][0],
                "per_family": {f: c[method].scores() for f, c in sorted(per_family.items())},
                "per_policy": {p: c[method].scores() for p, c in sorted(per_policy.items())}}

    steps = section("steps")
    steps["negative_control_labels"] = {cause: {"stalls": n, "labelled": same, "accuracy": _r(same / n if n else None)}
                                        for cause, (n, same) in sorted(labels.items()) if cause != "prefill"}
    return {**steps, "scenarios": len(scenarios), "families": dict(sorted(families.items())),
            "request_only": section("requests"), "seconds": round(time.perf_counter() - started, 1)}


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def render_itl(result: dict[str, Any]) -> str:
    """The `itl` section as a plain-text table."""
    req = result["request_only"]
    lines = [
        f"ITL spike attribution — {result['scenarios']} scenarios "
        f"({', '.join(f'{f} {n}' for f, n in result['families'].items())})",
        "",
        f"{'':34} {'precision':>9} {'recall':>7} {'f1':>6} {'tp':>7} {'fp':>6} {'fn':>6}",
    ]

    def row(name: str, s: dict[str, Any]) -> str:
        return (f"{name:34} {_fmt(s['precision']):>9} {_fmt(s['recall']):>7} {_fmt(s['f1']):>6} {s['tp']:>7} "
                f"{s['fp']:>6} {s['fn']:>6}")

    lines.append(row("step spans", result))
    lines.append(row("request spans only", req))
    lines += ["", "false attribution on negative controls:",
              f"  step spans:         {_fmt(result['false_attribution_rate'])} "
              f"({result['negative_control_false']} of {result['negative_control_spikes']} spikes)",
              f"  request spans only: {_fmt(req['false_attribution_rate'])} "
              f"({req['negative_control_false']} of {req['negative_control_spikes']} spikes)"]
    for cause, s in result.get("negative_control_labels", {}).items():
        lines.append(f"  {cause} stalls labelled {cause}: {s['labelled']} of {s['stalls']}")
    for key, title in (("per_family", "by family"), ("per_policy", "by policy")):
        lines += ["", f"{title} (step spans | request spans only):"]
        for name, s in result[key].items():
            r = req[key].get(name, {"precision": None, "recall": None})
            lines.append(f"  {name:32} P {_fmt(s['precision'])} R {_fmt(s['recall'])} ({s['tp'] + s['fn']} pairs)"
                         f" | P {_fmt(r['precision'])} R {_fmt(r['recall'])}")
    lines += ["", f"{result['seconds']} s"]
    return "\n".join(lines)
