"""Scores root-cause ranking against a scenario bank's ground truth (`infertrace scenarios generate`).

For every scenario whose tasks include `rca`, the analyzer sees only the scenario's store and reports its
incidents; the ground truth is read only to score. Each culprit (`root_causes`, or the one `root_cause`) is one
case: it is matched to the reported incident that overlaps its window and shares most of its models (every
incident is scored, not only the most severe), and the rank of the true cause in that incident's ranking is
read. A candidate is the true cause when its instances include one the truth names (the faulty component,
every engine of the regressed model), or, for load, when it is load from the tenant the truth names.

Metrics, as RCAEval defines them: AC@k is the share of cases whose true cause is among the top k; Avg@5 is
the mean of AC@1..AC@5. Candidates tied on the whole ranking key count in expectation (a tie of g
candidates over ranks a..a+g-1 puts the true one in the top k with probability (k - a + 1) / g), so an
uninformative ranking scores what chance scores. Also:

- shared-vs-single accuracy: whether the top cause is a shared gateway component exactly when the truth is;
- negative controls (one model's engines regressed): whether each is attributed to that model's engines;
- scenarios with several culprits: whether every one is ranked first in its own incident;
- load: whether the top cause is load from the right tenant;
- onset error: the matched incident's onset minus the culprit's start (for a ramp: the start of the ramp);
- baselines over the same incident's candidates: random ranking, the highest own anomaly scored as BARO
  scores services, the most models served; an ablation (this analyzer's own-anomaly term alone); and the
  same ranking with the incident's detected onset moved 60 s earlier and later;
- for assistant-prefill scenarios, whether the incident's most over-represented attribute is the prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from infertrace.analyzers.anomalies import DetectionConfig
from infertrace.analyzers.rca import Candidate, IncidentDiagnosis, RcaInputs, RcaReport, analyze_inputs, diagnose
from infertrace.analyzers.topology import Topology
from infertrace.evaluation import ScenarioPool, load_truth, open_scenario_store, scenario_dirs

K = 5
SHIFTS_S = (-60, 60)
BASELINES = ("random", "highest_own_anomaly", "most_models")
# Not a baseline: this analyzer's own-anomaly term without the blame, to show what following the call path adds.
ABLATIONS = ("own_anomaly_term_only",)
BUCKET_NS = 20_000_000_000
MATCH_SLACK_NS = 120_000_000_000  # an incident may be detected up to this long after its culprit ended


@dataclass(frozen=True)
class ScenarioResult:
    """One culprit of one scenario."""

    scenario: str
    family: str
    negative_control: bool
    truth: tuple[str, ...]  # the culprit's instances, or "load: <tenant>"
    truth_shared: bool
    incident_found: bool
    onset_error_s: float | None  # the matched incident's onset minus the culprit's start
    top: str | None  # the analyzer's top cause in that incident
    top_shared: bool | None
    hit_at: tuple[float, ...]  # P(true cause in top k), k = 1..K
    baselines: dict[str, tuple[float, ...]]
    shifted: dict[str, tuple[float, ...]]  # "-60s", "+60s"
    summary: str  # the incident's sentences, as the report prints them
    culprits: int = 1  # culprits in the scenario
    load: bool = False  # the culprit is load (a tenant's traffic)
    ramp: bool = False  # the culprit ramped in


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


def _median_abs(values: list[float]) -> float | None:
    return round(float(np.median(np.abs(values))), 1) if values else None


@dataclass(frozen=True)
class RcaEvaluation:
    scenarios: tuple[ScenarioResult, ...]
    lift: tuple[LiftResult, ...]
    overall: Accuracy = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "overall", accuracy(s.hit_at for s in self.scenarios))

    def families(self) -> list[str]:
        return sorted({s.family for s in self.scenarios})

    def per_family(self) -> dict[str, Accuracy]:
        return {f: accuracy(s.hit_at for s in self.scenarios if s.family == f) for f in self.families()}

    def baseline(self, name: str, family: str | None = None) -> Accuracy:
        return accuracy(s.baselines[name] for s in self.scenarios if family in (None, s.family))

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

    @property
    def several_culprits(self) -> tuple[int, int]:
        """(scenarios whose every culprit is ranked first in its own incident, scenarios with several)."""
        by: dict[str, list[ScenarioResult]] = {}
        for s in self.scenarios:
            if s.culprits > 1:
                by.setdefault(s.scenario, []).append(s)
        return sum(all(r.hit_at[0] == 1.0 for r in rs) for rs in by.values()), len(by)

    @property
    def load_named(self) -> tuple[int, int]:
        """(load culprits whose incident's top cause is load from the right tenant, load culprits)."""
        loads = [s for s in self.scenarios if s.load]
        return sum(s.hit_at[0] == 1.0 for s in loads), len(loads)

    def onset_errors(self, family: str | None = None, ramps: bool = False) -> list[float]:
        return [s.onset_error_s for s in self.scenarios if s.onset_error_s is not None
                and family in (None, s.family) and (s.ramp or not ramps)]

    def to_json(self) -> dict[str, Any]:
        correct, total = self.negative_controls
        both, several = self.several_culprits
        named, loads = self.load_named
        return {
            **self.overall.to_json(),
            "per_family": {f: {**a.to_json(), "onset_error_median_s": _median_abs(self.onset_errors(f))}
                           for f, a in self.per_family().items()},
            "shared_vs_single": round(self.shared_vs_single, 4),
            "negative_controls": {"correct": correct, "total": total},
            "several_culprits": {"all_first": both, "total": several},
            "load": {"named": named, "total": loads},
            "onset_error_median_s": {"all": _median_abs(self.onset_errors()),
                                     "ramps": _median_abs(self.onset_errors(ramps=True))},
            "baselines": {b: {**self.baseline(b).to_json(),
                              "per_family": {f: self.baseline(b, f).to_json() for f in self.families()}}
                          for b in BASELINES},
            "ablations": {b: {**self.baseline(b).to_json(),
                              "per_family": {f: self.baseline(b, f).to_json() for f in self.families()}}
                          for b in ABLATIONS},
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


def is_true(candidate: Candidate, cause: dict[str, Any]) -> bool:
    """Whether the candidate is the culprit the ground truth names."""
    if cause.get("kind") == "load":
        return candidate.kind == "load" and candidate.tenant == cause.get("tenant")
    return bool(set(cause.get("instances", ())) & set(candidate.instances))


def _hits(diagnosis: IncidentDiagnosis | None, cause: dict[str, Any],
          key: Callable[[Any], tuple[float, ...]]) -> tuple[float, ...]:
    if diagnosis is None or not diagnosis.causes:
        return (0.0,) * K
    causes = diagnosis.causes
    return hit_probabilities([key(c) for c in causes], [is_true(c.candidate, cause) for c in causes])


def culprits(truth: dict[str, Any]) -> list[dict[str, Any]]:
    """Every culprit of a scenario, each with its window (a scenario with one culprit keeps it at top level)."""
    causes = truth.get("root_causes") or [truth["root_cause"]]
    return [{**c, "window": c.get("window") or truth.get("window")} for c in causes]


def as_served(cause: dict[str, Any], topology: Topology) -> dict[str, Any]:
    """The culprit with the models its instances served in the traces, when they served any: the ground truth
    lists the models a component is configured for, and a tenant's limiter sees only the models that tenant calls
    (matching on the configured ones prefers a wider incident part, a confounder's, to the limiter's own)."""
    if cause.get("kind") == "load":
        return cause
    instances = set(cause.get("instances", ()))
    seen = sorted({m for n in topology.nodes if n.instance in instances for m in n.models})
    return {**cause, "models": seen} if seen else cause


def apart_from_confounders(cause: dict[str, Any], confounders: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The culprit without the models whose engines a confounder of the ground truth slowed during its window,
    when it has models left: such a model's trouble has two causes, and the incident reported for it is the
    confounder's as much as the culprit's (engine_noise: a router slows one tenant's calls to two models while one
    of them has noisy engines; the engines' incident shares as many models with the router as the router's own,
    lasts longer and holds more anomalous requests, so the router was matched to it)."""
    window = cause.get("window")
    if window is None or cause.get("kind") == "load":
        return cause
    noisy = {m for c in confounders if c.get("kind") == "engine" and c.get("window")
             and c["window"]["start_ns"] < window["end_ns"] and window["start_ns"] < c["window"]["end_ns"]
             for m in c.get("models", ())}
    left = [m for m in cause.get("models", ()) if m not in noisy]
    return {**cause, "models": left} if left else cause


def _ranked_matches(diagnoses: Iterable[IncidentDiagnosis], cause: dict[str, Any]) -> list[
        tuple[tuple[float, int, int], int, IncidentDiagnosis]]:
    """The reported incidents that could be the culprit's, best first, with their keys and positions: overlapping
    its window (detection may lag its end), by the most similar set of models (Jaccard), then the longest overlap
    with the culprit's window (two parts of one detected incident often share most of their models), then the most
    anomalous requests."""
    window = cause.get("window")
    models = set(cause.get("models", ()))
    found = []
    for k, d in enumerate(diagnoses):
        i = d.incident
        overlaps = window is None or (i.onset_ns < window["end_ns"] + MATCH_SLACK_NS and window["start_ns"] < i.end_ns)
        common = len(models & set(i.models))
        if not overlaps or not common:
            continue
        together = 0 if window is None else max(0, min(i.end_ns, window["end_ns"])
                                                - max(i.onset_ns, window["start_ns"]))
        found.append(((common / len(models | set(i.models)), together, d.anomalous_requests), k, d))
    return sorted(found, key=lambda m: (m[0], -m[1]), reverse=True)


def match(diagnoses: Iterable[IncidentDiagnosis], cause: dict[str, Any]) -> IncidentDiagnosis | None:
    """The reported incident that is the culprit's (`_ranked_matches`' first), or None."""
    found = _ranked_matches(diagnoses, cause)
    return found[0][2] if found else None


def match_all(diagnoses: list[IncidentDiagnosis], causes: list[dict[str, Any]]) -> list[IncidentDiagnosis | None]:
    """Each culprit's incident, one culprit per incident where there are enough: the culprit-incident pairs are
    taken best key first, each pair whose culprit and incident are both still free. Two culprits whose faults
    overlap in time and share models can both match one incident best; the one that fits it better keeps it and
    the other takes its own next best, so "each culprit first in its own incident" is judged on the incidents the
    method reported for each. A culprit left without a free incident gets its best match, shared."""
    ranked = [_ranked_matches(diagnoses, cause) for cause in causes]
    pairs = sorted(((key, k, c, d) for c, found in enumerate(ranked) for key, k, d in found),
                   key=lambda p: (p[0], -p[1], p[2]), reverse=True)
    chosen: list[IncidentDiagnosis | None] = [None] * len(causes)
    taken: set[int] = set()
    for _, k, c, d in pairs:
        if chosen[c] is None and k not in taken:
            chosen[c] = d
            taken.add(k)
    return [d if d is not None else (found[0][2] if found else None) for d, found in zip(chosen, ranked, strict=True)]


def _label(candidate: Candidate) -> str:
    return f"load: {candidate.tenant}" if candidate.kind == "load" else candidate.id


def evaluate_scenario(scenario_dir: Path, config: DetectionConfig | None = None) -> tuple[
        list[ScenarioResult], LiftResult | None, RcaReport | None]:
    """The scenario's culprits scored, its attribute lift (assistant_prefill_runaway), and the RCA report both
    came from (None when the scenario has neither task), for callers that score more of it."""
    truth = load_truth(scenario_dir)
    tasks = set(truth.get("tasks", ()))
    is_lift = truth.get("family") == "assistant_prefill_runaway"
    if "rca" not in tasks and not is_lift:
        return [], None, None
    config = config or DetectionConfig()
    with open_scenario_store(scenario_dir) as store:
        inputs = RcaInputs.load(store)
    report = analyze_inputs(inputs, config)
    lift = None
    if is_lift:
        top = report.diagnoses[0] if report.diagnoses else None
        best = top.commonality.top() if top is not None and top.commonality is not None else None
        name = None if best is None else f"{best.attribute}={best.value}"
        lift = LiftResult(truth["scenario"], name, best.sentence() if best else "no incident or no attribute",
                          name == "assistant_prefill=yes")
    if "rca" not in tasks:
        return [], lift, report
    windows = [(i.onset_ns, i.end_ns) for i in report.anomalies.incidents]
    causes = [apart_from_confounders(as_served(c, inputs.topology), truth.get("confounders", ()))
              for c in culprits(truth)]
    results = []
    for cause, found in zip(causes, match_all(list(report.diagnoses), causes), strict=True):
        baselines = {b: (0.0,) * K for b in (*BASELINES, *ABLATIONS)}
        shifted = {s: (0.0,) * K for s in _shift_names()}
        onset_error = None
        if found is not None:
            baselines["random"] = _hits(found, cause, lambda c: (0.0,))
            baro = baro_scores(inputs, [c.candidate for c in found.causes], found.window_ns)
            baselines["highest_own_anomaly"] = _hits(found, cause, lambda c, baro=baro: (baro[c.candidate.id],))
            baselines["own_anomaly_term_only"] = _hits(found, cause, lambda c: (c.own.score,))
            baselines["most_models"] = _hits(found, cause, lambda c: (float(len(c.candidate.models)),))
            if found.detected is not None:
                for s, name in zip(SHIFTS_S, _shift_names(), strict=True):
                    moved = match(diagnose(inputs, found.detected, windows, config, shift_ns=int(s * 1e9),
                                           claims=report.anomalies.incidents), cause)
                    shifted[name] = _hits(moved, cause, _analyzer_key)
            if cause.get("window"):
                onset_error = (found.incident.onset_ns - cause["window"]["start_ns"]) / 1e9
        top = found.causes[0].candidate if found is not None and found.causes else None
        load = cause.get("kind") == "load"
        results.append(ScenarioResult(
            truth["scenario"], truth["family"], "rca" in truth.get("negative_control", ()),
            (f"load: {cause.get('tenant')}",) if load else tuple(sorted(cause.get("instances", ()))),
            bool(cause.get("shared")), found is not None, onset_error, None if top is None else _label(top),
            None if top is None else top.shared, _hits(found, cause, _analyzer_key), baselines, shifted,
            found.summary() if found is not None else "no incident detected", len(causes), load,
            bool(cause.get("ramp_s"))))
    return results, lift, report


def _bucketed(t: np.ndarray, values: np.ndarray, lo: int) -> pd.Series:
    ok = np.isfinite(values)
    if ok.sum() < 10:
        return pd.Series(dtype=float)
    return pd.Series(values[ok]).groupby((t[ok] - lo) // BUCKET_NS).mean()


def baro_scores(inputs: RcaInputs, candidates: list[Candidate], window: tuple[int, int]) -> dict[str, float]:
    """The "highest own anomaly" baseline, as BARO scores services: for each candidate, every metric its own
    spans give, bucketed (20 s), robust-scaled against the buckets before the window ((x - median) / IQR),
    and the largest scaled value in the window. Metrics: mean log latency, error (and timeout) share,
    rejection share; for engines, their requests' own TTFT and decode time per token (what an engine's request
    spans show, without this analyzer's step-time model); for a tenant's load, its request rate."""
    lo, hi = window
    scores = {}
    for c in candidates:
        if c.kind == "load":
            t = inputs.requests.loc[inputs.requests["tenant"] == c.tenant, "arrival_ns"].to_numpy()
            series = [pd.Series(1.0, index=(t - lo) // BUCKET_NS).groupby(level=0).sum()]
        elif c.kind == "engines":
            rows = inputs.engines[inputs.engines["instance"].isin(c.instances)]
            t = rows["arrival_ns"].to_numpy()
            series = [_bucketed(t, np.log(np.maximum(rows[col].to_numpy(dtype=float), 1.0)), lo)
                      for col in ("engine_ttft_ns", "tpot_ns")]
            series.append(_bucketed(t, rows["failed"].fillna(False).to_numpy(dtype=float), lo))
        else:
            rows = inputs.paths[(inputs.paths["instance"] == c.id) & (inputs.paths["kind"] == c.kind)]
            t = rows["start_ns"].to_numpy()
            outcome = rows["outcome"].to_numpy()
            series = [_bucketed(t, np.log(np.maximum(rows["latency_ns"].to_numpy(dtype=float), 1.0)), lo),
                      _bucketed(t, np.isin(outcome, ["error", "timeout"]).astype(float), lo),
                      _bucketed(t, (outcome == "rejected").astype(float), lo)]
        best = 0.0
        for frame in series:
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


def _score_scenario(scenario_dir: Path, config: DetectionConfig | None) -> tuple[
        list[ScenarioResult], LiftResult | None]:
    found, lift, _ = evaluate_scenario(scenario_dir, config)
    return found, lift


def evaluate_rca(bank: str | Path, config: DetectionConfig | None = None,
                 pool: ScenarioPool | None = None) -> RcaEvaluation:
    """Root-cause ranking and attribute lift scored over a scenario bank directory (its scenarios through `pool`)."""
    results, lifts = [], []
    scenarios = scenario_dirs(Path(bank))
    for found, lift in (pool or ScenarioPool()).map(partial(_score_scenario, config=config), scenarios):
        results += found
        if lift is not None:
            lifts.append(lift)
    return RcaEvaluation(tuple(results), tuple(lifts))


def render_rca(section: dict[str, Any]) -> str:
    """The `rca` section of `infertrace evaluate` as a plain-text table: per family, this analyzer beside the
    own-anomaly ablation and the BARO-style baseline; then every baseline overall."""
    header = ("root-cause ranking", "cases", "AC@1", "AC@3", "Avg@5", "own-anomaly AC@1", "BARO AC@1",
              "|onset error| median s")
    rows = [header]
    own, baro = section["ablations"]["own_anomaly_term_only"], section["baselines"]["highest_own_anomaly"]

    def row(name: str, a: dict[str, Any], own_a: dict[str, Any] | None = None, baro_a: dict[str, Any] | None = None,
            onset: float | None = None) -> None:
        rows.append((name, str(a["cases"]), f"{a['ac@1']:.3f}", f"{a['ac@3']:.3f}", f"{a['avg@5']:.3f}",
                     "" if own_a is None else f"{own_a['ac@1']:.3f}", "" if baro_a is None else f"{baro_a['ac@1']:.3f}",
                     "" if onset is None else f"{onset:.1f}"))

    row("infertrace (blame along the call path)", section, own, baro, section["onset_error_median_s"]["all"])
    for family, a in section["per_family"].items():
        row(f"  {family}", a, own["per_family"].get(family), baro["per_family"].get(family),
            a.get("onset_error_median_s"))
    for name, a in section["baselines"].items():
        row(f"baseline: {name.replace('_', ' ')}", a)
    for name, a in section.get("ablations", {}).items():
        row(f"ablation: {name.replace('_', ' ')}", a)
    for shift, a in section["onset_shift"].items():
        row(f"onset shifted {shift}", a)
    width = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(width[i]) if i == 0 else c.rjust(width[i]) for i, c in enumerate(r)) for r in rows]
    controls = section["negative_controls"]
    lines.append(f"shared-vs-single accuracy: {section['shared_vs_single']:.3f}; negative controls attributed to "
                 f"the right engines: {controls['correct']}/{controls['total']}")
    several, load = section["several_culprits"], section["load"]
    if several["total"]:
        lines.append(f"scenarios with several culprits, each ranked first in its own incident: "
                     f"{several['all_first']}/{several['total']}")
    if load["total"]:
        lines.append(f"load incidents named as load from the right tenant: {load['named']}/{load['total']}")
    ramps = section["onset_error_median_s"]["ramps"]
    if ramps is not None:
        lines.append(f"median onset error from the start of a ramp: {ramps:.1f} s")
    lift = section["lift"]
    if lift["cases"]:
        lines.append(f"assistant-prefill scenarios whose top over-represented attribute is the assistant prefill: "
                     f"{lift['correct']}/{lift['cases']}")
    return "\n".join(lines)


def evaluate_rca_section(bank: str | Path, pool: ScenarioPool | None = None) -> dict[str, Any]:
    """`evaluate_rca` as the JSON-ready `rca` section of `infertrace evaluate`."""
    return evaluate_rca(bank, pool=pool).to_json()
