"""Scores root-cause ranking against a scenario bank's ground truth (`infertrace scenarios generate`).

For every scenario whose tasks include `rca`, the analyzer sees only the scenario's store; its top incident
(the most severe) is ranked, and the rank of the true cause is read from the ground truth afterwards. A
candidate is the true cause when its instances include one the truth names (`root_cause.instances`: the
faulty component, or every engine of the regressed model).

Metrics, as RCAEval defines them: AC@k is the share of cases whose true cause is among the top k; Avg@5 is
the mean of AC@1..AC@5. Candidates tied on the whole ranking key count in expectation (a tie of g
candidates over ranks a..a+g-1 puts the true one in the top k with probability (k - a + 1) / g), so an
uninformative ranking scores what chance scores. Also:

- shared-vs-single accuracy: whether the top cause is a shared gateway component exactly when the truth is;
- negative controls (one model's engines regressed): whether each is attributed to that model's engines;
- three baselines over the same candidates: random ranking, the highest own anomaly, the most models served;
- the same ranking with the incident's onset moved 60 s earlier and later;
- for assistant-prefill scenarios, whether the incident's most over-represented attribute is the prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from infertrace.analyzers.anomalies import DetectionConfig, request_scores
from infertrace.analyzers.rca import Candidate, IncidentDiagnosis, RcaInputs, analyze_inputs, rank_causes
from infertrace.evaluation import load_truth, open_scenario_store, scenario_dirs

K = 5
SHIFTS_S = (-60, 60)
BASELINES = ("random", "highest_own_anomaly", "most_models")
# Not a baseline: this analyzer's own-anomaly term without the coverage term, to show what coverage adds.
ABLATIONS = ("own_anomaly_term_only",)
BUCKET_NS = 20_000_000_000


@dataclass(frozen=True)
class ScenarioResult:
    scenario: str
    family: str
    negative_control: bool
    truth: tuple[str, ...]  # the root cause's instances
    truth_shared: bool
    incident_found: bool
    onset_error_s: float | None  # detected onset minus the fault's start
    top: str | None  # the analyzer's top cause
    top_shared: bool | None
    hit_at: tuple[float, ...]  # P(true cause in top k), k = 1..K
    baselines: dict[str, tuple[float, ...]]
    shifted: dict[str, tuple[float, ...]]  # "-60s", "+60s"
    summary: str  # the incident's sentences, as the report prints them


@dataclass(frozen=True)
class LiftResult:
    scenario: str
    attribute: str | None  # the top over-represented attribute=value, or None
    sentence: str
    correct: bool


@dataclass(frozen=True)
class Accuracy:
    cases: int
    ac: tuple[float, ...]  # AC@1..AC@K

    @property
    def ac1(self) -> float:
        return self.ac[0]

    @property
    def ac3(self) -> float:
        return self.ac[2]

    @property
    def avg5(self) -> float:
        return float(np.mean(self.ac[:5]))

    def to_json(self) -> dict[str, Any]:
        return {"cases": self.cases, "ac@1": round(self.ac1, 4), "ac@3": round(self.ac3, 4),
                "avg@5": round(self.avg5, 4)}


@dataclass(frozen=True)
class RcaEvaluation:
    scenarios: tuple[ScenarioResult, ...]
    lift: tuple[LiftResult, ...]
    overall: Accuracy = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "overall", accuracy(s.hit_at for s in self.scenarios))

    def per_family(self) -> dict[str, Accuracy]:
        families = sorted({s.family for s in self.scenarios})
        return {f: accuracy(s.hit_at for s in self.scenarios if s.family == f) for f in families}

    def baseline(self, name: str) -> Accuracy:
        return accuracy(s.baselines[name] for s in self.scenarios)

    def shifted(self, shift: str) -> Accuracy:
        return accuracy(s.shifted[shift] for s in self.scenarios)

    @property
    def shared_vs_single(self) -> float:
        if not self.scenarios:
            return 0.0
        return float(np.mean([s.top_shared is not None and s.top_shared == s.truth_shared for s in self.scenarios]))

    @property
    def negative_controls(self) -> tuple[int, int]:
        """(correctly attributed, total)."""
        controls = [s for s in self.scenarios if s.negative_control]
        return sum(s.hit_at[0] == 1.0 for s in controls), len(controls)

    def to_json(self) -> dict[str, Any]:
        correct, total = self.negative_controls
        return {
            **self.overall.to_json(),
            "per_family": {f: a.to_json() for f, a in self.per_family().items()},
            "shared_vs_single": round(self.shared_vs_single, 4),
            "negative_controls": {"correct": correct, "total": total},
            "baselines": {b: {**self.baseline(b).to_json(),
                              "per_family": {f: accuracy(s.baselines[b] for s in self.scenarios if s.family == f)
                                             .to_json() for f in self.per_family()}}
                          for b in BASELINES},
            "ablations": {b: self.baseline(b).to_json() for b in ABLATIONS},
            "onset_shift": {s: self.shifted(s).to_json() for s in _shift_names()},
            "lift": {"cases": len(self.lift), "correct": sum(x.correct for x in self.lift),
                     "scenarios": [{"scenario": x.scenario, "top": x.attribute, "correct": x.correct,
                                    "sentence": x.sentence} for x in self.lift]},
            "scenarios": [{"scenario": s.scenario, "family": s.family, "truth": list(s.truth), "top": s.top,
                           "hit@1": s.hit_at[0], "hit@3": s.hit_at[2], "incident_found": s.incident_found,
                           "onset_error_s": s.onset_error_s} for s in self.scenarios],
        }


def _shift_names() -> list[str]:
    return [f"{s:+d}s" for s in SHIFTS_S]


def accuracy(hits: Iterable[tuple[float, ...]]) -> Accuracy:
    rows = list(hits)
    if not rows:
        return Accuracy(0, (0.0,) * K)
    return Accuracy(len(rows), tuple(float(x) for x in np.mean(np.array(rows), axis=0)))


def hit_probabilities(keys: list[tuple[float, ...]], truth: list[bool], k_max: int = K) -> tuple[float, ...]:
    """P(a true candidate is in the top k), k = 1..k_max, for a ranking by `keys` (higher first) with ties
    on the whole key broken uniformly at random. With several true candidates, the best-placed counts."""
    if not any(truth):
        return (0.0,) * k_max
    order = sorted(set(keys), reverse=True)
    start = 1
    out = []
    groups = []
    for key in order:
        members = [t for k, t in zip(keys, truth, strict=True) if k == key]
        groups.append((start, len(members), sum(members)))
        start += len(members)
    for k in range(1, k_max + 1):
        # P(no true candidate in top k) over groups: a group fully inside contributes surely; the group cut
        # at k contributes the chance that a random choice of its (k - a + 1) first places holds a true one.
        p = 0.0
        for a, g, trues in groups:
            if not trues:
                continue
            if a + g - 1 <= k:
                p = 1.0
                break
            if a <= k:
                taken = k - a + 1
                miss = float(np.prod([(g - trues - i) / (g - i) for i in range(taken)])) if g - trues >= taken else 0.0
                p = 1.0 - miss
            break
        out.append(p)
    return tuple(out)


def _is_true(candidate: Candidate, truth: set[str]) -> bool:
    return bool(truth & set(candidate.instances))


def _hits(diagnosis: IncidentDiagnosis | None, truth: set[str],
          key: Callable[[Any], tuple[float, ...]]) -> tuple[float, ...]:
    if diagnosis is None or not diagnosis.causes:
        return (0.0,) * K
    causes = diagnosis.causes
    return hit_probabilities([key(c) for c in causes], [_is_true(c.candidate, truth) for c in causes])


def evaluate_scenario(scenario_dir: Path, config: DetectionConfig | None = None) -> tuple[ScenarioResult | None,
                                                                                           LiftResult | None]:
    truth = load_truth(scenario_dir)
    tasks = set(truth.get("tasks", ()))
    is_lift = truth.get("family") == "assistant_prefill_runaway"
    if "rca" not in tasks and not is_lift:
        return None, None
    config = config or DetectionConfig()
    with open_scenario_store(scenario_dir) as store:
        inputs = RcaInputs.load(store)
    report = analyze_inputs(inputs, config)
    top = report.diagnoses[0] if report.diagnoses else None
    lift = None
    if is_lift:
        best = top.commonality.top() if top is not None and top.commonality is not None else None
        name = None if best is None else f"{best.attribute}={best.value}"
        lift = LiftResult(truth["scenario"], name, best.sentence() if best else "no incident or no attribute",
                          name == "assistant_prefill=yes")
    if "rca" not in tasks:
        return None, lift
    root = truth["root_cause"]
    instances = set(root.get("instances", ()))
    baselines = {b: (0.0,) * K for b in (*BASELINES, *ABLATIONS)}
    shifted = {s: (0.0,) * K for s in _shift_names()}
    onset_error = None
    if top is not None:
        baselines["random"] = _hits(top, instances, lambda c: (0.0,))
        baro = baro_scores(inputs, [c.candidate for c in top.causes], top.window_ns)
        baselines["highest_own_anomaly"] = _hits(top, instances, lambda c: (baro[c.candidate.id],))
        baselines["own_anomaly_term_only"] = _hits(top, instances, lambda c: (c.own.score,))
        baselines["most_models"] = _hits(top, instances, lambda c: (float(len(c.candidate.models)),))
        windows = [(i.onset_ns, i.end_ns) for i in report.anomalies.incidents]
        flags = request_scores(inputs.requests, windows, config)
        for s, name in zip(SHIFTS_S, _shift_names(), strict=True):
            moved = rank_causes(inputs, top.incident, windows, config, shift_ns=int(s * 1e9), flags=flags)
            shifted[name] = _hits(moved, instances, _analyzer_key)
        if truth.get("window"):
            onset_error = (top.incident.onset_ns - truth["window"]["start_ns"]) / 1e9
    hit_at = _hits(top, instances, _analyzer_key)
    return ScenarioResult(
        truth["scenario"], truth["family"], "rca" in truth.get("negative_control", ()), tuple(sorted(instances)),
        bool(root.get("shared")), top is not None, onset_error,
        top.causes[0].candidate.id if top is not None and top.causes else None,
        top.causes[0].candidate.shared if top is not None and top.causes else None,
        hit_at, baselines, shifted, top.summary() if top is not None else "no incident detected"), lift


def baro_scores(inputs: RcaInputs, candidates: list[Candidate], window: tuple[int, int]) -> dict[str, float]:
    """The "highest own anomaly" baseline, as BARO scores services: for each candidate, every metric its own
    spans give, bucketed (20 s), robust-scaled against the buckets before the window ((x - median) / IQR),
    and the largest scaled value in the window. Metrics: mean log latency, error share, rejection share;
    for engines, their requests' own TTFT and decode time per token (what an engine's request spans show,
    without this analyzer's step-time model)."""
    lo, hi = window
    scores = {}
    for c in candidates:
        if c.kind == "engines":
            rows = inputs.engines[inputs.engines["instance"].isin(c.instances)]
            t = rows["arrival_ns"].to_numpy()
            series = [np.log(np.maximum(rows[col].to_numpy(dtype=float), 1.0)) for col in ("engine_ttft_ns", "tpot_ns")]
            series.append(rows["failed"].fillna(False).to_numpy(dtype=float))
        else:
            rows = inputs.paths[(inputs.paths["instance"] == c.id) & (inputs.paths["kind"] == c.kind)]
            t = rows["start_ns"].to_numpy()
            outcome = rows["outcome"].to_numpy()
            series = [np.log(np.maximum(rows["latency_ns"].to_numpy(dtype=float), 1.0)),
                      (outcome == "error").astype(float), (outcome == "rejected").astype(float)]
        best = 0.0
        bucket = (t - lo) // BUCKET_NS
        for values in series:
            ok = np.isfinite(values)
            if ok.sum() < 10:
                continue
            frame = pd.DataFrame({"b": bucket[ok], "v": values[ok]}).groupby("b")["v"].mean()
            before = frame[frame.index < 0].to_numpy()
            during = frame[(frame.index >= 0) & (frame.index <= (hi - lo) // BUCKET_NS)].to_numpy()
            if len(before) < 4 or not len(during):
                continue
            q1, median, q3 = np.quantile(before, [0.25, 0.5, 0.75])
            best = max(best, float(np.max((during - median) / max(q3 - q1, 1e-6))))
        scores[c.id] = best
    return scores


def _analyzer_key(cause: Any) -> tuple[float, ...]:
    return (cause.score, cause.ochiai, cause.own.score)


def evaluate_rca(bank: str | Path, config: DetectionConfig | None = None,
                 on_scenario: Callable[[str], None] | None = None) -> RcaEvaluation:
    """Root-cause ranking and attribute lift scored over a scenario bank directory."""
    results, lifts = [], []
    for path in scenario_dirs(Path(bank)):
        result, lift = evaluate_scenario(path, config)
        if result is not None:
            results.append(result)
        if lift is not None:
            lifts.append(lift)
        if on_scenario is not None:
            on_scenario(path.name)
    return RcaEvaluation(tuple(results), tuple(lifts))


def render_rca(section: dict[str, Any]) -> str:
    """The `rca` section of `infertrace evaluate` as a plain-text table."""
    rows = [("root-cause ranking", "cases", "AC@1", "AC@3", "Avg@5")]

    def row(name: str, a: dict[str, Any]) -> None:
        rows.append((name, str(a["cases"]), f"{a['ac@1']:.3f}", f"{a['ac@3']:.3f}", f"{a['avg@5']:.3f}"))

    row("infertrace (Ochiai × own anomaly)", section)
    for family, a in section["per_family"].items():
        row(f"  {family}", a)
    for name, a in section["baselines"].items():
        row(f"baseline: {name.replace('_', ' ')}", a)
    for name, a in section.get("ablations", {}).items():
        row(f"ablation: {name.replace('_', ' ')}", a)
    for shift, a in section["onset_shift"].items():
        row(f"onset shifted {shift}", a)
    width = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(width[i]) if i == 0 else c.rjust(width[i]) for i, c in enumerate(r)) for r in rows]
    controls = section["negative_controls"]
    lines.append(f"shared-vs-single accuracy: {section['shared_vs_single']:.3f}; negative controls attributed to "
                 f"the right engines: {controls['correct']}/{controls['total']}")
    lift = section["lift"]
    if lift["cases"]:
        lines.append(f"assistant-prefill scenarios whose top over-represented attribute is the assistant prefill: "
                     f"{lift['correct']}/{lift['cases']}")
    return "\n".join(lines)


def evaluate_rca_section(bank: str | Path) -> dict[str, Any]:
    """`evaluate_rca` as the JSON-ready `rca` section of `infertrace evaluate`."""
    return evaluate_rca(bank).to_json()
