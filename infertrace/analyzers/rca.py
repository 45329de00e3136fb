"""Root-cause ranking for multi-model incidents: which shared component instance (auth, rate limiter,
router, global queue, KV link), or which model's engines, most likely caused an incident, with evidence.

Candidates are every component instance in the traces' topology and, per model, its engines. Each is
scored as

    score = Ochiai coverage × own anomaly

- Ochiai coverage, over the requests that arrived during the incident: e_f anomalous requests passed through
  the candidate, n_f anomalous requests did not, e_p normal requests did;
  ochiai = e_f / sqrt((e_f + n_f)(e_f + e_p)). A request is anomalous when it failed, was rate limited, was
  cut at max_tokens, or its TTFT or decode time per token scored robustly high against its model's requests
  outside the incident (`anomalies.request_scores`). One anomalous model: its engines cover exactly the
  anomalous requests; several: the shared component that serves exactly them does.
- Own anomaly, from the candidate's own spans: the rise, from outside the incident to inside it, in the
  share of its calls slower than its own normal range (route, auth, rate-limit, queue and KV-transfer spans;
  for engines their own TTFT from arrival at the engine, and decode time per token), of its errors and of
  its rejections (429). It lies in [0, 1]: 0.97 reads "97% more of its calls were slow than before". A
  component that merely carries the anomalous requests (an auth in front of a broken router) covers them as
  well as the culprit but has no anomaly of its own.

    report = analyze_incidents(store)
    for d in report.diagnoses: print(d.causes[0].sentence())
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from infertrace.analyzers import materialize_once, query_text
from infertrace.analyzers.anomalies import (
    AnomalyReport,
    DetectionConfig,
    Incident,
    _clock,
    _ms,
    detect_in_requests,
    load_requests,
    request_scores,
)
from infertrace.analyzers.commonality import Commonality, attribute_lift
from infertrace.analyzers.topology import (
    SHARED_KINDS,
    Topology,
    load_paths,
    topology_from_paths,
)
from infertrace.store.store import Store

# What a component's own spans are called in sentences.
SPAN_WORDS = {"auth": "auth", "rate_limiter": "rate-limit", "router": "route", "scheduler": "global-queue",
              "link": "KV-transfer"}
LATENCY_FLOOR_NS = 500_000  # a component call must be this much slower than its normal range to count as slow
# A call (or step) is slow when its log latency (or log step-time ratio) lies more than SLOW_Z robust standard
# deviations (1.4826 × MAD, at least LOG_SCALE_FLOOR) above the baseline median. Median and MAD, not a high
# quantile: a p99 breaks down when 1% of the baseline is itself anomalous (a blip elsewhere in the period, or
# the first minute of the fault when the onset is estimated late); the MAD holds up to half.
SLOW_Z = 3.5
LOG_SCALE_FLOOR = 0.05


@dataclass(frozen=True)
class Candidate:
    id: str  # the instance (service.instance.id, or the link's name), or "<model> engines"
    kind: str  # auth, rate_limiter, router, scheduler, link, or engines
    instances: tuple[str, ...]
    models: tuple[str, ...]

    @property
    def shared(self) -> bool:
        """A shared gateway component, as opposed to a model's own data path (engines, KV link)."""
        return self.kind in SHARED_KINDS


@dataclass(frozen=True)
class OwnAnomaly:
    """How the candidate's own spans changed: the signal with the largest rise."""

    score: float  # in [0, 1]
    signal: str  # "latency", "step_time", "errors", "rejections" or "none"
    what: str  # e.g. "route latency", "engine step time for its work"
    share_before: float  # share of calls (steps) slow, failed or rejected outside the incident
    share_during: float
    median_before: float  # latency in ms, or step time over the baseline fit's prediction (×)
    median_during: float
    threshold: float  # what a slow call exceeds: the top of its normal range, in the same unit
    calls_before: int
    calls_during: int

    def phrase(self) -> str:
        if self.signal == "latency":
            return (f"{self.what} median {_ms(self.median_before)} → {_ms(self.median_during)}; "
                    f"{self.share_during:.0%} of its {self.calls_during} calls during the incident exceeded its "
                    f"normal range ({_ms(self.threshold)}), against {self.share_before:.0%} before")
        if self.signal == "step_time":
            return (f"its steps took {self.median_during:.2f}× the time its own baseline predicts for the same work "
                    f"(prefill, decode and context tokens), against {self.median_before:.2f}× before; "
                    f"{self.share_during:.0%} of its {self.calls_during} steps during the incident exceeded the "
                    f"normal range ({self.threshold:.2f}×), against {self.share_before:.0%} before")
        if self.signal in ("errors", "rejections"):
            word = "failed" if self.signal == "errors" else "were rejected (429)"
            return (f"{self.share_during:.1%} of its {self.calls_during} calls during the incident {word}, "
                    f"against {self.share_before:.1%} before")
        return "no change in its own spans"


@dataclass(frozen=True)
class RankedCause:
    rank: int
    candidate: Candidate
    score: float
    ochiai: float
    e_f: int  # anomalous requests through the candidate
    n_f: int  # anomalous requests not through it
    e_p: int  # normal requests through it
    own: OwnAnomaly
    anomalous_models: tuple[str, ...]  # the incident's models the candidate serves
    other_models: tuple[str, ...]  # models it serves that were not anomalous

    def evidence(self) -> tuple[str, ...]:
        c = self.candidate
        served = ", ".join(c.models) or "no model"
        cover = (f"it serves {served}; {self.e_f} of the {self.e_f + self.n_f} anomalous requests passed through "
                 f"it, and {self.e_p} normal ones (Ochiai {self.ochiai:.2f})")
        if self.other_models:
            cover += f"; it also serves {', '.join(self.other_models)}, which stayed normal"
        return (f"{c.id} ({c.kind}): {cover}.", f"Its own spans: {self.own.phrase()}.",
                f"Score {self.score:.2f} = Ochiai {self.ochiai:.2f} × own anomaly {self.own.score:.2f}.")

    def sentence(self) -> str:
        """One line to paste into an incident channel."""
        c = self.candidate
        serves = ", ".join(self.anomalous_models) or "none of the anomalous models"
        if self.other_models:
            serves += f" (and {', '.join(self.other_models)}, not anomalous)"
        return (f"#{self.rank} {c.id} ({c.kind}, score {self.score:.2f}): serves {serves}; "
                f"{self.e_f}/{self.e_f + self.n_f} anomalous requests passed through it (Ochiai {self.ochiai:.2f}); "
                f"{self.own.phrase()}.")


@dataclass(frozen=True)
class IncidentDiagnosis:
    incident: Incident
    window_ns: tuple[int, int]  # the window the ranking used (the incident's, unless shifted)
    requests: int  # requests that arrived in the window
    anomalous_requests: int
    causes: tuple[RankedCause, ...]  # best first
    commonality: Commonality | None

    def summary(self) -> str:
        lines = [self.incident.sentence()]
        if self.causes:
            top = self.causes[0]
            kind = "a shared component" if top.candidate.shared else "the models' own data path"
            lines.append(f"Most likely cause: {top.candidate.id} ({kind}). " + " ".join(top.evidence()))
        if self.commonality is not None and self.commonality.top() is not None:
            lines.append(self.commonality.top().sentence())  # type: ignore[union-attr]
        return "\n".join(lines)


@dataclass(frozen=True)
class RcaReport:
    anomalies: AnomalyReport
    topology: Topology
    diagnoses: tuple[IncidentDiagnosis, ...]  # one per incident, in the anomaly report's order


@dataclass
class RcaInputs:
    """What the ranking reads from the store, loaded once (an incident can then be ranked under several
    windows without going back to the store)."""

    requests: pd.DataFrame  # request_outcomes
    paths: pd.DataFrame  # request_paths
    engines: pd.DataFrame  # engine_requests
    steps: pd.DataFrame  # engine_steps
    topology: Topology

    @classmethod
    def load(cls, store: Store) -> RcaInputs:
        materialize_once(store, ("requests", "component_calls"))  # each read by several of the queries below
        paths = load_paths(store)
        engines = store.sql(query_text("engine_requests")).df()
        steps = store.sql(query_text("engine_steps")).df()
        return cls(load_requests(store), paths, engines, steps, topology_from_paths(paths))


# ------------------------------------------------------------------------------------ candidates
def candidates(topology: Topology) -> list[Candidate]:
    """Every component instance, and every model's engines."""
    out = [Candidate(n.instance, n.kind, (n.instance,), n.models) for n in topology.components()]
    for model in topology.models:
        engines = topology.engines(model)
        if engines:
            out.append(Candidate(f"{model} engines", "engines", engines, (model,)))
    return out


def ochiai(e_f: int, n_f: int, e_p: int) -> float:
    """Ochiai coefficient e_f / sqrt((e_f + n_f)(e_f + e_p)); 0 when either factor is empty."""
    denominator = np.sqrt((e_f + n_f) * (e_f + e_p))
    return float(e_f / denominator) if denominator > 0 else 0.0


def _slow_log_threshold(logs: np.ndarray) -> float:
    """Top of the normal range of log values: median + SLOW_Z robust standard deviations."""
    median = float(np.median(logs))
    scale = max(float(np.median(np.abs(logs - median))) * 1.4826, LOG_SCALE_FLOOR)
    return median + SLOW_Z * scale


def _latency_change(before: np.ndarray, during: np.ndarray, what: str, floor_ns: float) -> OwnAnomaly | None:
    before, during = before[np.isfinite(before)], during[np.isfinite(during)]
    if len(before) < 10 or not len(during):
        return None
    threshold = np.exp(_slow_log_threshold(np.log(np.maximum(before, 1.0)))) + floor_ns
    share_before = float((before > threshold).mean())
    share_during = float((during > threshold).mean())
    return OwnAnomaly(max(share_during - share_before, 0.0), "latency", what, share_before, share_during,
                      float(np.median(before)) / 1e6, float(np.median(during)) / 1e6, float(threshold) / 1e6,
                      len(before), len(during))


def _rate_change(before: np.ndarray, during: np.ndarray, signal: str, what: str) -> OwnAnomaly | None:
    if not len(before) or not len(during):
        return None
    share_before, share_during = float(before.mean()), float(during.mean())
    return OwnAnomaly(max(share_during - share_before, 0.0), signal, what, share_before, share_during,
                      float("nan"), float("nan"), float("nan"), len(before), len(during))


_NONE = OwnAnomaly(0.0, "none", "", 0.0, 0.0, float("nan"), float("nan"), float("nan"), 0, 0)


def _work(steps: pd.DataFrame) -> np.ndarray:
    """Features of a step's work: a constant, prefill tokens (linear and quadratic: attention), decode
    tokens, decode context, and whether it prefills at all."""
    prefill = steps["prefill_tokens"].to_numpy(dtype=float)
    return np.column_stack([np.ones(len(steps)), prefill, prefill ** 2 / 1e4,
                            steps["decode_tokens"].to_numpy(dtype=float),
                            steps["context_tokens"].to_numpy(dtype=float) / 1e3, prefill > 0])


def _step_time_change(steps: pd.DataFrame, before: np.ndarray, during: np.ndarray) -> OwnAnomaly | None:
    """Per engine instance, least-squares fit of step time to its work outside the incident; then the share
    of steps (weighted by the steps in each span) slower than the normal range of the ratio of step time to
    the fit, before and during."""
    ratios_before, ratios_during, weights_before, weights_during, thresholds = [], [], [], [], []
    for _, idx in steps.groupby("instance", sort=True).groups.items():
        rows = steps.index.get_indexer(idx)
        base, now = rows[before[rows]], rows[during[rows]]
        if len(base) < 20 or not len(now):
            continue
        x, y = _work(steps), steps["step_ns"].to_numpy(dtype=float)
        w = np.sqrt(steps["steps"].to_numpy(dtype=float))
        coef, *_ = np.linalg.lstsq(x[base] * w[base, None], y[base] * w[base], rcond=None)
        ratio = y / np.maximum(x @ coef, 1.0)
        threshold = float(np.exp(_slow_log_threshold(np.log(np.maximum(ratio[base], 1e-9)))))
        ratios_before.append(ratio[base] / threshold)
        ratios_during.append(ratio[now] / threshold)
        weights_before.append(w[base] ** 2)
        weights_during.append(w[now] ** 2)
        thresholds.append(threshold)
    if not thresholds:
        return None
    rb, rd = np.concatenate(ratios_before), np.concatenate(ratios_during)
    wb, wd = np.concatenate(weights_before), np.concatenate(weights_during)
    share_before = float(np.average(rb > 1.0, weights=wb))
    share_during = float(np.average(rd > 1.0, weights=wd))
    scale = float(np.median(thresholds))
    return OwnAnomaly(max(share_during - share_before, 0.0), "step_time", "engine step time for its work",
                      share_before, share_during, float(np.median(rb)) * scale, float(np.median(rd)) * scale, scale,
                      int(wb.sum()), int(wd.sum()))


def own_anomaly(inputs: RcaInputs, candidate: Candidate, window: tuple[int, int],
                baseline_mask: dict[str, np.ndarray]) -> OwnAnomaly:
    """The largest rise, from the baseline to the window, in the candidate's own slow, failed or rejected
    calls. An engine is slow when its steps take longer than its own work model predicts (so a burst of
    requests, which makes steps larger but not slower for their size, is not the engine's anomaly); without
    step spans (e.g. vLLM's request spans only), when its own TTFT or decode time per token rose."""
    lo, hi = window
    changes: list[OwnAnomaly | None] = []
    if candidate.kind == "engines":
        rows = inputs.engines
        mine = rows["instance"].isin(candidate.instances).to_numpy()
        t = rows["arrival_ns"].to_numpy()
        during, before = mine & (t >= lo) & (t < hi), mine & baseline_mask["engines"]
        steps = inputs.steps
        in_steps = steps["instance"].isin(candidate.instances).to_numpy()
        step_change = None
        if in_steps.any():
            ts = steps["start_ns"].to_numpy()
            mine_steps = steps[in_steps].reset_index(drop=True)
            ts = ts[in_steps]
            step_change = _step_time_change(mine_steps, baseline_mask["steps"][in_steps], (ts >= lo) & (ts < hi))
            changes.append(step_change)
        if step_change is None:
            for column, what in (("engine_ttft_ns", "engine TTFT"), ("tpot_ns", "engine decode time per token")):
                values = rows[column].to_numpy(dtype=float)
                changes.append(_latency_change(values[before], values[during], what, 0.0))
        failed = rows["failed"].fillna(False).to_numpy(dtype=bool)
        changes.append(_rate_change(failed[before], failed[during], "errors", "engine errors"))
    else:
        rows = inputs.paths
        mine = (rows["instance"] == candidate.id).to_numpy() & (rows["kind"] == candidate.kind).to_numpy()
        t = rows["start_ns"].to_numpy()
        during, before = mine & (t >= lo) & (t < hi), mine & baseline_mask["paths"]
        word = SPAN_WORDS.get(candidate.kind, candidate.kind)
        latency = rows["latency_ns"].to_numpy(dtype=float)
        changes.append(_latency_change(latency[before], latency[during], f"{word} latency", LATENCY_FLOOR_NS))
        outcome = rows["outcome"].to_numpy()
        for value, signal in (("error", "errors"), ("rejected", "rejections")):
            hit = outcome == value
            changes.append(_rate_change(hit[before], hit[during], signal, f"{word} {signal}"))
    found = [c for c in changes if c is not None]
    return max(found, key=lambda c: c.score) if found else _NONE


def _baseline_masks(inputs: RcaInputs, windows: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    masks = {}
    for name, frame, column in (("engines", inputs.engines, "arrival_ns"), ("paths", inputs.paths, "start_ns"),
                                ("steps", inputs.steps, "start_ns")):
        t = frame[column].to_numpy()
        outside = np.ones(len(frame), dtype=bool)
        for lo, hi in windows:
            outside &= ~((t >= lo) & (t < hi))
        masks[name] = outside
    return masks


def rank_causes(inputs: RcaInputs, incident: Incident, windows: list[tuple[int, int]],
                config: DetectionConfig | None = None, shift_ns: int = 0,
                flags: pd.DataFrame | None = None) -> IncidentDiagnosis:
    """Candidates for one incident ranked by Ochiai × own anomaly. `windows` are every incident's windows
    (kept out of the baselines); `shift_ns` moves the incident's onset (to measure how much the ranking
    depends on it)."""
    config = config or DetectionConfig()
    lo, hi = incident.onset_ns + shift_ns, incident.end_ns
    if hi <= lo:
        hi = lo + int(config.bucket_s * 1e9)
    requests = inputs.requests
    if flags is None:
        flags = request_scores(requests, windows, config)
    arrival = requests["arrival_ns"].to_numpy()
    inside = (arrival >= lo) & (arrival < hi)
    anomalous = flags["anomalous"].to_numpy() & inside
    traces = requests["trace_id"].to_numpy()
    anomalous_traces = set(traces[anomalous])
    normal_traces = set(traces[inside & ~anomalous])
    total_anomalous = len(anomalous_traces)
    paths = inputs.paths
    touched_by: dict[str, set[str]] = {}
    for instance, part in paths.groupby("instance", sort=False)["trace_id"]:
        touched_by[str(instance)] = set(part.to_numpy())
    masks = _baseline_masks(inputs, [w for w in windows if w != (incident.onset_ns, incident.end_ns)] + [(lo, hi)])
    incident_models = set(incident.models)
    scored = []
    for candidate in candidates(inputs.topology):
        touched: set[str] = set()
        for instance in candidate.instances:
            touched |= touched_by.get(instance, set())
        e_f = len(touched & anomalous_traces)
        e_p = len(touched & normal_traces)
        n_f = total_anomalous - e_f
        coverage = ochiai(e_f, n_f, e_p)
        own = own_anomaly(inputs, candidate, (lo, hi), masks)
        scored.append((coverage * own.score, coverage, own, candidate, e_f, n_f, e_p))
    scored.sort(key=lambda s: (-s[0], -s[1], -s[2].score, s[3].id))
    causes = tuple(
        RankedCause(k + 1, c, float(score), float(coverage), e_f, n_f, e_p, own,
                    tuple(m for m in c.models if m in incident_models),
                    tuple(m for m in c.models if m not in incident_models))
        for k, (score, coverage, own, c, e_f, n_f, e_p) in enumerate(scored))
    return IncidentDiagnosis(incident, (lo, hi), int(inside.sum()), int(anomalous.sum()), causes,
                             _incident_commonality(requests, flags, incident, (lo, hi)))


def _incident_commonality(requests: pd.DataFrame, flags: pd.DataFrame, incident: Incident,
                          window: tuple[int, int]) -> Commonality | None:
    """What the requests showing the incident's main symptom have in common, against all requests to the
    incident's models (the population the selection is drawn from: the model the selection is restricted to is
    no finding): the symptom is the metric that dominated most of the incident's model anomalies."""
    lo, hi = window
    arrival = requests["arrival_ns"].to_numpy()
    scope = requests["model"].isin(incident.models).to_numpy()
    inside = (arrival >= lo) & (arrival < hi) & scope
    symptoms = [a.metric for a in incident.anomalies]
    symptom = max(set(symptoms), key=symptoms.count)
    reason = flags["reason"].to_numpy()
    selected = inside & flags["anomalous"].to_numpy() & (reason == ("error" if symptom == "errors" else symptom))
    if selected.sum() < 5:
        selected = inside & flags["anomalous"].to_numpy()
    if selected.sum() < 5:
        return None
    return attribute_lift(requests[scope], selected[scope],
                          population_name=f"all requests to {', '.join(incident.models)}")


def analyze_incidents(store: Store, config: DetectionConfig | None = None) -> RcaReport:
    """Detect anomalies and incidents, read the topology, and rank the candidate causes of each incident."""
    return analyze_inputs(RcaInputs.load(store), config)


def analyze_inputs(inputs: RcaInputs, config: DetectionConfig | None = None) -> RcaReport:
    config = config or DetectionConfig()
    report = detect_in_requests(inputs.requests, config)
    windows = [(i.onset_ns, i.end_ns) for i in report.incidents]
    flags = request_scores(inputs.requests, windows, config)
    diagnoses = tuple(rank_causes(inputs, incident, windows, config, flags=flags) for incident in report.incidents)
    return RcaReport(report, inputs.topology, diagnoses)


def describe(report: RcaReport, top: int = 3) -> list[str]:
    """Sentences for an incident channel: each incident, its top causes, what its requests have in common."""
    lines = []
    for d in report.diagnoses:
        lines.append(d.incident.sentence())
        lines += [f"  {c.sentence()}" for c in d.causes[:top]]
        if d.commonality is not None and d.commonality.top() is not None:
            lines.append(f"  {d.commonality.top().sentence()}")  # type: ignore[union-attr]
    if not report.diagnoses:
        start, end = report.anomalies.start_ns, report.anomalies.end_ns
        lines.append(f"No incident between {_clock(start)} and {_clock(end)}.")
    return lines
