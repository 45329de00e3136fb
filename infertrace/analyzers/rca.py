"""Root-cause ranking for multi-model incidents: which shared component instance (auth, rate limiter, router,
global queue, KV link), which model's engines, or which tenant's traffic (load) most likely caused an
incident, with evidence. docs/rca.md explains every signal with a worked example.

For each incident that `anomalies.detect_in_requests` finds:

1. **Baseline before the first deviation.** Every candidate's own signals (`signals.py`) are measured, window
   against the time before the incident. A candidate that changed significantly gets its own onset, fitted on
   the trend of its main signal (`changepoint.trend_onset`): a component that slowed over five minutes started
   minutes before the models' anomaly crossed a threshold. The baseline is then taken again, before the first
   of those onsets, and the window starts there.
2. **Blame along the call path** (`blame.py`). Each anomalous request is blamed on the hop where it went wrong,
   then passed on from effect to cause: waits to what made them wait, a limiter's 429s to the extra traffic or
   the retries behind them.
3. **Split by cause.** A candidate that explains a good part of the anomalous requests on its own (its own
   change significant) forms its own incident: two unrelated culprits whose onsets lie close together, or another
   model's engines slowing meanwhile, are not one incident.
4. **Rank.** Within each incident, candidates by their blame share (blamed requests over the incident's
   anomalous requests), then by their own anomaly. Ochiai coverage (e_f anomalous requests through it, n_f not,
   e_p normal ones through it) is reported as evidence.

    report = analyze_incidents(store)
    for d in report.diagnoses: print(d.causes[0].sentence())
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from infertrace.analyzers.anomalies import (
    AnomalyReport,
    DetectionConfig,
    Incident,
    _clock,
    detect_in_requests,
    request_scores,
)
from infertrace.analyzers.blame import BlameContext, Blamed, blame_requests, soft_weight
from infertrace.analyzers.candidates import (
    Candidate,
    OwnAnomaly,
    RcaInputs,
    Window,
    candidates,
    first_attempts,
    own_onset,
    own_signals,
)
from infertrace.analyzers.commonality import Commonality, attribute_lift
from infertrace.analyzers.pools import pool_of
from infertrace.analyzers.topology import Topology
from infertrace.store.store import Store

__all__ = ["Candidate", "IncidentDiagnosis", "OwnAnomaly", "RankedCause", "RcaInputs", "RcaReport",
           "analyze_incidents", "analyze_inputs", "candidates", "describe", "diagnose", "ochiai"]

PASS1_MARGIN_S = 300.0  # before onsets are known, the baseline ends this long (at most half of it) before detection
SPLIT_SHARE = 0.02  # a candidate explaining this share of an incident's anomalous requests ...
SPLIT_REQUESTS = 10  # ... and at least this many, with a significant change of its own, is an incident of its own


@dataclass(frozen=True)
class RankedCause:
    rank: int
    candidate: Candidate
    score: float  # blame share: anomalous requests blamed on it over the incident's anomalous requests
    ochiai: float
    e_f: int  # anomalous requests through the candidate
    n_f: int  # anomalous requests not through it
    e_p: int  # normal requests through it
    own: OwnAnomaly
    anomalous_models: tuple[str, ...]  # the incident's models the candidate serves
    other_models: tuple[str, ...]  # models it serves that were not anomalous
    blamed: float = 0.0  # troubled requests blamed on it, by weight (blame.py)
    troubled: float = 0.0  # the incident's troubled requests, by weight
    received: tuple[tuple[str, float], ...] = ()  # blame that reached it from effects elsewhere: (how, requests)
    passed_on: tuple[tuple[str, float], ...] = ()  # where its own symptoms' blame went: (candidate, requests)

    def label(self) -> str:
        c = self.candidate
        if c.kind == "load":
            main = self.own.main
            factor = ""
            if main is not None and main.name in ("traffic", "work") and main.significant:
                what = "traffic" if main.name == "traffic" else "prompt tokens"
                factor = f" (×{main.factor:.1f} {what}" + (f" to {main.about})" if main.about else ")")
            return f"load: tenant {c.tenant}{factor}"
        return f"{c.id} ({c.kind})"

    def evidence(self) -> tuple[str, ...]:
        c = self.candidate
        lines = []
        if c.kind == "load":
            reached = ", ".join(self.anomalous_models) or "no anomalous model"
            lines.append(f"{self.label()}: its traffic reached {reached}.")
        else:
            served = ", ".join(c.models) or "no model"
            cover = (f"it serves {served}; {self.e_f} of the {self.e_f + self.n_f} anomalous requests passed through "
                     f"it, and {self.e_p} normal ones (Ochiai {self.ochiai:.2f})")
            if self.other_models:
                cover += f"; it also serves {', '.join(self.other_models)}, which stayed normal"
            lines.append(f"{c.id} ({c.kind}): {cover}.")
        lines.append(f"Its own spans: {self.own.phrase()}.")
        lines.append(f"Blamed for {self.blamed:.0f} of the incident's {self.troubled:.0f} troubled requests (weighted; "
                     f"share {self.score:.2f}).")
        if self.received:
            lines.append("Including " + "; ".join(f"{n:.0f} through {how}" for how, n in self.received[:3]) + ".")
        if self.passed_on:
            lines.append("Its own symptoms followed from elsewhere: " + "; ".join(
                f"{n:.0f} requests' to {target}" for target, n in self.passed_on[:3]) + ".")
        return tuple(lines)

    def sentence(self) -> str:
        """One line to paste into an incident channel."""
        c = self.candidate
        serves = ", ".join(self.anomalous_models) or "none of the anomalous models"
        if self.other_models:
            serves += f" (and {', '.join(self.other_models)}, not anomalous)"
        via = ""
        if self.received:
            how, n = self.received[0]
            via = f", {n:.0f} of them through {how}"
        symptom = ""
        if self.passed_on and self.blamed < sum(n for _, n in self.passed_on):
            target, n = self.passed_on[0]
            symptom = f"; a symptom: {n:.0f} requests' trouble at it traces to {target}"
        if c.kind == "load":
            return (f"#{self.rank} {self.label()}, score {self.score:.2f}: reaches {serves}; "
                    f"{self.blamed:.0f} of {self.troubled:.0f} troubled requests follow from it{via}; "
                    f"{self.own.phrase()}.")
        return (f"#{self.rank} {c.id} ({c.kind}, score {self.score:.2f}): serves {serves}; "
                f"{self.blamed:.0f} of {self.troubled:.0f} troubled requests blamed on it{via} "
                f"({self.e_f} of {self.e_f + self.n_f} anomalous ones passed through it, Ochiai {self.ochiai:.2f}); "
                f"{self.own.phrase()}{symptom}.")


@dataclass(frozen=True)
class IncidentDiagnosis:
    incident: Incident
    window_ns: tuple[int, int]  # the window the ranking used
    requests: int  # requests that arrived in the window
    anomalous_requests: int
    causes: tuple[RankedCause, ...]  # best first
    commonality: Commonality | None
    baseline_end_ns: int = 0  # the baseline ended here (before the first deviation)
    detected: Incident | None = None  # the incident as detection found it (this may be a part of it)

    @property
    def explained(self) -> bool:
        """Whether the top cause is blamed for any troubled request: candidates that all score 0 are a listing
        of what the requests passed through, not an explanation."""
        return bool(self.causes) and self.causes[0].score > 0

    def summary(self) -> str:
        lines = [self.incident.sentence()]
        if not self.explained:
            lines.append("Unexplained: no traced component, engine or tenant's load accounts for its troubled "
                         "requests.")
        elif self.causes:
            top = self.causes[0]
            kind = ("load, not a component" if top.candidate.kind == "load"
                    else "a shared component" if top.candidate.shared else "the models' own data path")
            lines.append(f"Most likely cause: {top.label()} ({kind}). " + " ".join(top.evidence()))
        if self.commonality is not None and self.commonality.top() is not None:
            lines.append(self.commonality.top().sentence())  # type: ignore[union-attr]
        return "\n".join(lines)


@dataclass(frozen=True)
class RcaReport:
    anomalies: AnomalyReport
    topology: Topology
    diagnoses: tuple[IncidentDiagnosis, ...]  # one per incident (several when one detected incident had several
    # causes), by severity


def ochiai(e_f: int, n_f: int, e_p: int) -> float:
    """Ochiai coefficient e_f / sqrt((e_f + n_f)(e_f + e_p)); 0 when either factor is empty."""
    denominator = np.sqrt((e_f + n_f) * (e_f + e_p))
    return float(e_f / denominator) if denominator > 0 else 0.0


# ------------------------------------------------------------------------------------ ranking
def _baseline_medians(inputs: RcaInputs, w: Window) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per instance, baseline medians of service time, wait (a global queue's hold), and engine TTFT."""
    paths = inputs.paths
    base = paths[w.before(paths["start_ns"].to_numpy()) & (paths["kind"] != "engine")]
    queue = base["queue_ns"].to_numpy(dtype=float)
    latency = base["latency_ns"].to_numpy(dtype=float)
    scheduler = (base["kind"] == "scheduler").to_numpy()
    frame = pd.DataFrame({"instance": base["instance"].to_numpy(),
                          "service": np.where(scheduler, 0.0, latency - np.where(np.isfinite(queue), queue, 0.0)),
                          "wait": np.where(scheduler, latency, np.where(np.isfinite(queue), queue, 0.0))})
    medians = frame.groupby("instance")[["service", "wait"]].median()
    engines = inputs.engines
    engine_base = engines[w.before(engines["arrival_ns"].to_numpy())].groupby("instance")["engine_ttft_ns"].median()
    return medians["service"].to_dict(), medians["wait"].to_dict(), engine_base.to_dict()


@dataclass
class _Ranked:
    """One incident's candidates with their own signals, the blame, and the troubled requests."""

    window: Window
    own: dict[str, OwnAnomaly]
    cands: list[Candidate]
    blamed: Blamed
    troubled: pd.DataFrame  # req, model, tenant, reason, http_status, weight, flagged
    inside: np.ndarray  # requests arriving in the window
    models: tuple[str, ...]  # the detected incident's models


def _rejection_router(inputs: RcaInputs, w: Window, loads: dict[str, float],
                      triggers: dict[str, list[tuple[str, float]]]) -> Callable[[str, str], list[tuple[str, float]]]:
    """Where a limiter's 429s for a tenant go. Its rejections of first attempts are explained, as far as they go,
    by the tenant's extra first attempts (load), then by retries after its requests' failures elsewhere
    (whatever those were blamed on); the rest are the limiter's own. A rejected retry is the same request again:
    its 429 goes where the first attempts' did."""
    requests = inputs.requests
    t = requests["arrival_ns"].to_numpy()
    during = w.during(t)
    tenants = requests["tenant"].to_numpy(dtype=object)
    first = first_attempts(requests)
    paths = inputs.paths
    rejected = paths[(paths["kind"] == "rate_limiter") & (paths["outcome"] == "rejected")
                     & w.during(paths["start_ns"].to_numpy())]
    rejected_first = rejected[first[rejected["req"].to_numpy()]]
    counts = rejected_first.groupby(["instance", "tenant"]).size().to_dict()
    failed = requests["failed"].to_numpy(dtype=bool)
    before = w.before(t)
    scale = (w.hi - w.lo) / 1e9 / max(w.baseline_s, 1e-9)
    cache: dict[tuple[str, str], list[tuple[str, float]]] = {}

    def route(limiter: str, tenant: str) -> list[tuple[str, float]]:
        key = (limiter, tenant)
        if key not in cache:
            k = float(counts.get(key, 0))
            load_id = f"load: {tenant}"
            x_load = min(k, loads.get(load_id, 0.0))
            mine = tenants == tenant
            elsewhere = float((during & mine & failed).sum())  # each may be retried once
            usual = float((before & mine & first).sum()) * scale  # first attempts expected in the window
            # retries can empty a bucket with headroom only when they add half the tenant's usual traffic or more
            x_retry = min(k - x_load, elsewhere) if triggers.get(tenant) and elsewhere >= 0.5 * usual else 0.0
            own_part = max(k - x_load - x_retry, 0.0)
            out = [(load_id, x_load / k)] if k and x_load else []
            out += [(target, x_retry / k * share) for target, share in triggers.get(tenant, ()) if k and x_retry]
            out += [(limiter, own_part / k)] if k and own_part else []
            cache[key] = out or [(limiter, 1.0)]
        return cache[key]

    return route


def _troubled(inputs: RcaInputs, w: Window, config: DetectionConfig, models: tuple[str, ...],
              elsewhere: frozenset[str]) -> pd.DataFrame:
    """The window's troubled requests with their weight (`blame.soft_weight`): failed, rejected, cut at max_tokens
    (weight 1), or slow, of the incident's models and of every model no other incident claims (`elsewhere`): a
    component failing a few percent of its calls shows on models too quiet to be detected on their own.
    Columns: req, model, tenant, reason, http_status, weight, flagged (anomalous on its own), arrival_ns."""
    requests = inputs.requests
    t = requests["arrival_ns"].to_numpy()
    before, during = w.before(t), w.during(t)
    flags = request_scores(requests, [], config, baseline=before)
    flagged = flags["anomalous"].to_numpy()
    weight = np.where(flagged, 1.0, soft_weight(flags["score"].to_numpy(dtype=float)))
    reason = np.where(flags["reason"].to_numpy(dtype=object) != "", flags["reason"].to_numpy(dtype=object),
                      flags["slowest"].to_numpy(dtype=object))
    # a failure counts by how far its kind's rate on its model rose: a model that always truncates or fails a
    # request now and then still does, and those are not the incident's
    model = requests["model"].to_numpy(dtype=object)
    for why in ("error", "rate_limited", "truncated"):
        hit = reason == why
        for m in pd.unique(model[hit & during]):
            mine = model == m
            rate_before = (hit & mine & before).sum() / max((mine & before).sum(), 1)
            rate_during = (hit & mine & during).sum() / max((mine & during).sum(), 1)
            weight[hit & mine] = max(0.0, 1.0 - rate_before / rate_during) if rate_during > 0 else 0.0
    claimed = requests["model"].isin(elsewhere - set(models)).to_numpy()
    reqs = np.flatnonzero(during & ~claimed & (weight > 0))
    return pd.DataFrame({"req": reqs, "model": requests["model"].to_numpy(dtype=object)[reqs],
                         "tenant": requests["tenant"].to_numpy(dtype=object)[reqs], "reason": reason[reqs],
                         "http_status": requests["http_status"].to_numpy(dtype=object)[reqs],
                         "weight": weight[reqs], "flagged": flagged[reqs], "arrival_ns": t[reqs]})


def _context(inputs: RcaInputs, w: Window, own: dict[str, OwnAnomaly], cands: list[Candidate],
             hops: pd.DataFrame) -> BlameContext:
    """What the blame rules need: which candidates changed, what load there is and where it went, how much each
    component's service time rose, which routers each global queue releases to."""
    requests, paths = inputs.requests, inputs.paths
    significant = {c.id: own[c.id].cause_effect for c in cands if own[c.id].cause_effect > 0 and c.kind != "load"}
    changed = {c.id for c in cands if own[c.id].significant and c.kind != "load"}
    window_paths = paths[w.during(paths["start_ns"].to_numpy()) & (paths["kind"] != "engine")]
    calls_through = window_paths.groupby("instance").size().to_dict()
    first = first_attempts(requests)
    inside = w.during(requests["arrival_ns"].to_numpy())
    loads: dict[str, float] = {}
    load_models: dict[str, set[str]] = {}
    load_through: dict[str, dict[str, float]] = {}
    for c in cands:
        main = own[c.id].main
        if c.kind != "load" or main is None or not main.significant:
            continue
        loads[c.id] = main.calls_during * (1.0 - 1.0 / main.factor)  # its first attempts beyond the usual
        load_models[c.id] = {s.about for s in own[c.id].signals if s.about and s.significant}
        mine = np.flatnonzero(inside & first & (requests["tenant"] == c.tenant).to_numpy())
        through = window_paths[np.isin(window_paths["req"].to_numpy(), mine)].groupby("instance").size()
        # a component's workers are loaded per call: its extra calls, not the prompt tokens (work) a pool got
        calls = max((s for s in own[c.id].signals if s.name == "traffic"), key=lambda s: s.effect, default=main)
        for instance, n in through.items():
            extra = n * (1.0 - 1.0 / calls.factor)
            rest = max(calls_through.get(instance, 0) - extra, 1.0)
            load_through.setdefault(str(instance), {})[c.id] = float(np.log1p(extra / rest))
    service_rise = {}
    for c in cands:
        service = next((s for s in own[c.id].signals if s.name == "service" and s.significant), None)
        if service is not None and service.before > 0:
            service_rise[c.id] = float(max(np.log(service.during / service.before), 0.0))
    router_rows = hops[hops["kind"] == "router"]
    kinds = window_paths["kind"].to_numpy(dtype=object)
    pairs = window_paths[kinds == "scheduler"][["req", "instance"]].merge(
        window_paths[kinds == "router"][["req", "instance"]], on="req", suffixes=("_queue", "_router"))
    released_to = {str(q): set(part.astype(str)) for q, part in pairs.groupby("instance_queue")["instance_router"]}
    return BlameContext({m: f"{m} engines" for m in inputs.topology.models}, significant, changed, loads,
                        load_models, dict(zip(router_rows["req"].tolist(), router_rows["instance"].tolist(),
                                              strict=True)), released_to, service_rise, load_through,
                        pool_of=pool_of(inputs.topology))


def _arrival_span(inputs: RcaInputs, reqs: np.ndarray, weights: np.ndarray) -> tuple[int, int]:
    """When the requests `reqs` arrived: the weighted 5th and 95th percentiles of their arrival times."""
    return _weighted_span(inputs.requests["arrival_ns"].to_numpy()[reqs], weights)


def _weighted_span(arrivals: np.ndarray, weights: np.ndarray) -> tuple[int, int]:
    """The weighted 5th and 95th percentiles of arrival times."""
    order = np.argsort(arrivals)
    cumulative = np.cumsum(weights[order]) / weights.sum()
    lo = int(arrivals[order][np.searchsorted(cumulative, 0.05)])
    hi = int(arrivals[order][min(np.searchsorted(cumulative, 0.95), len(order) - 1)])
    return lo, hi


LOCAL_MIN_WEIGHT = 5.0  # a candidate that could be blamed for this much is tested over its own part of the window
LOCAL_SCAN_PARTS = 4  # ... and over its halves, thirds and quarters


def _local_own(inputs: RcaInputs, w: Window, c: Candidate, reqs: np.ndarray, weights: np.ndarray,
               config: DetectionConfig) -> OwnAnomaly | None:
    """A candidate's own signals over the part of the window where the requests it could be blamed for arrived
    (weighted 5th to 95th percentile, padded by a bucket): a short slowdown of one model's engines, diluted over
    a long incident, is significant over its own minute. A change confined to part of that span is found by a
    scan over its halves, thirds and quarters, each p-value multiplied by the number of spans tested
    (Bonferroni): a router saturated by load nobody traces serves few traced calls while it is slow, and many,
    at its usual speed, once it drains the backlog its slowness built up; the drain outnumbers the slow calls."""
    lo, hi = _arrival_span(inputs, reqs, weights)
    pad = int(config.bucket_s * 1e9)
    lo, hi = max(lo - pad, w.lo), min(hi + pad, w.hi)
    spans = [(lo + (hi - lo) * k // parts, lo + (hi - lo) * (k + 1) // parts)
             for parts in range(1, LOCAL_SCAN_PARTS + 1) for k in range(parts)]
    best: OwnAnomaly | None = None
    for a, b in spans:
        if b - a < pad:
            continue
        local = Window(a, b, w.baseline_end, w.others, w.start)
        signals = tuple(replace(s, p_value=min(1.0, s.p_value * len(spans))) for s in own_signals(inputs, c, local))
        own = OwnAnomaly(signals, window_ns=(a, b))
        if own.significant and (best is None or own.score > best.score):
            best = own
    return best


def _rank(inputs: RcaInputs, models: tuple[str, ...], w: Window, config: DetectionConfig,
          elsewhere: frozenset[str] = frozenset()) -> _Ranked:
    """Own signals, troubled requests and blame for a window (module docstring, blame.py)."""
    requests = inputs.requests
    cands = candidates(inputs.topology, requests)
    own = {c.id: OwnAnomaly(tuple(own_signals(inputs, c, w))) for c in cands}
    troubled = _troubled(inputs, w, config, models, elsewhere)
    reqs = troubled["req"].to_numpy()
    paths = inputs.paths
    hops = paths[np.isin(paths["req"].to_numpy(), reqs)]
    engines = inputs.engines[np.isin(inputs.engines["req"].to_numpy(), reqs)]
    service_base, wait_base, engine_base = _baseline_medians(inputs, w)

    def blame(ctx: BlameContext, rejections: Callable[[str, str], list[tuple[str, float]]]) -> Blamed:
        return blame_requests(troubled, hops, engines, service_base, wait_base, engine_base, rejections, ctx)

    def no_rejections(limiter: str, tenant: str) -> list[tuple[str, float]]:
        return [(limiter, 1.0)]

    # where trouble could come from, taking every hop at its word; test those candidates over their own part
    ctx = replace(_context(inputs, w, own, cands, hops), strict=False)
    potential = blame(ctx, no_rejections).rows
    by_id = {c.id: c for c in cands}
    rejected = troubled[troubled["reason"] == "rate_limited"]
    for tenant, part in rejected.groupby("tenant"):  # did the tenant's rejections come with extra traffic?
        c = by_id.get(f"load: {tenant}")
        if c is not None and not own[c.id].significant and part["weight"].sum() >= LOCAL_MIN_WEIGHT:
            local = _local_own(inputs, w, c, part["req"].to_numpy(), part["weight"].to_numpy(dtype=float), config)
            if local is not None:
                own[c.id] = local
    for target, part in potential.groupby("target"):
        c = by_id.get(str(target))
        if c is None or c.kind == "load" or own[c.id].significant or part["weight"].sum() < LOCAL_MIN_WEIGHT:
            continue
        grouped = part.groupby("req")["weight"].sum()
        local = _local_own(inputs, w, c, grouped.index.to_numpy(), grouped.to_numpy(), config)
        if local is not None:
            own[c.id] = local
    ctx = _context(inputs, w, own, cands, hops)
    first_pass = blame(ctx, no_rejections)
    triggers: dict[str, list[tuple[str, float]]] = {}
    failed_rows = first_pass.rows.merge(troubled[troubled["reason"] == "error"][["req", "tenant"]], on="req")
    for tenant, part in failed_rows.groupby("tenant"):
        mass = part.groupby("target")["weight"].sum()
        triggers[str(tenant)] = [(str(k), float(v / mass.sum())) for k, v in mass.items() if v > 0]
    blamed = blame(ctx, _rejection_router(inputs, w, ctx.loads, triggers))
    return _Ranked(w, own, cands, blamed, troubled, w.during(requests["arrival_ns"].to_numpy()), models)


def _causes(ranked: _Ranked, inputs: RcaInputs, reqs: np.ndarray, models: tuple[str, ...]) -> tuple[RankedCause, ...]:
    """The candidates ranked over the troubled requests `reqs` (rows of `requests`; a subset of the ranked
    incident's): by blame share, then own anomaly, then Ochiai coverage over the anomalous ones."""
    rows = ranked.blamed.rows[np.isin(ranked.blamed.rows["req"].to_numpy(), reqs)]
    mass = rows.groupby("target")["weight"].sum().to_dict()
    troubled = ranked.troubled[np.isin(ranked.troubled["req"].to_numpy(), reqs)]
    total = max(float(troubled["weight"].sum()), 1e-9)
    flagged = troubled.loc[troubled["flagged"].to_numpy(dtype=bool), "req"].to_numpy()
    requests = inputs.requests
    inside = np.flatnonzero(ranked.inside)
    normal = np.setdiff1d(inside, ranked.troubled.loc[ranked.troubled["flagged"].to_numpy(dtype=bool), "req"])
    paths = inputs.paths
    window_paths = paths[np.isin(paths["req"].to_numpy(), inside)]
    touched = {str(i): np.unique(part.to_numpy()) for i, part in window_paths.groupby("instance", sort=False)["req"]}
    tenants = requests["tenant"].to_numpy(dtype=object)
    empty = np.zeros(0, dtype=int)
    scored = []
    for c in ranked.cands:
        if c.kind == "load":
            through = inside[tenants[inside] == c.tenant]
        else:
            through = np.unique(np.concatenate([touched.get(i, empty) for i in c.instances] or [empty]))
        e_f = int(np.isin(flagged, through).sum())
        e_p = int(np.isin(normal, through).sum())
        n_f = len(flagged) - e_f
        blamed = float(mass.get(c.id, 0.0))
        part = rows[rows["target"] == c.id]
        received = tuple((str(k), float(v)) for k, v in part[part["how"] != "own"].groupby("how")["weight"].sum()
                         .sort_values(ascending=False).items())
        sent = rows[(rows["source"] == c.id) & (rows["target"] != c.id)]
        passed = tuple((str(k), float(v)) for k, v in sent.groupby("target")["weight"].sum()
                       .sort_values(ascending=False).items())
        own = ranked.own[c.id]
        scored.append((blamed / total, own.score, ochiai(e_f, n_f, e_p), c, e_f, n_f, e_p, blamed, received, passed))
    scored.sort(key=lambda s: (-s[0], -s[1], -s[2], s[3].id))
    incident_models = set(models)
    return tuple(
        RankedCause(k + 1, c, float(score), float(coverage), e_f, n_f, e_p, ranked.own[c.id],
                    tuple(m for m in c.models if m in incident_models),
                    tuple(m for m in c.models if m not in incident_models), blamed, total, received, passed)
        for k, (score, _, coverage, c, e_f, n_f, e_p, blamed, received, passed) in enumerate(scored))


def _split(ranked: _Ranked, pad_ns: int = int(DetectionConfig().bucket_s * 1e9)) -> list[np.ndarray]:
    """The incident's troubled requests grouped by cause: each candidate that explains at least SPLIT_SHARE
    of their weight (and SPLIT_REQUESTS), with a significant change of its own, takes the requests it explains
    most of; the rest of the incident's models' go with the largest group whose cause reaches their model and was
    at work when they arrived (the requests blamed on it arrived from a bucket, `pad_ns`, before to a bucket after:
    `_arrival_span`), else the largest whose cause reaches their model, else the largest (other models' only where
    a cause explains them), and so does a group left with less than that minimum weight (its requests mostly taken
    by another cause: no incident of its own). Largest group first."""
    rows = ranked.blamed.rows
    troubled = ranked.troubled
    everything = troubled["req"].to_numpy()
    mine = everything[troubled["model"].isin(ranked.models).to_numpy()]
    if not len(rows):
        return [mine]
    mass = rows.groupby("target")["weight"].sum().sort_values(ascending=False)
    least = max(SPLIT_SHARE * ranked.blamed.weight, SPLIT_REQUESTS)
    majors = [str(c) for c, m in mass.items() if m >= least
              and ranked.own.get(str(c)) is not None and ranked.own[str(c)].significant]
    best = rows[rows["target"].isin(majors)].sort_values("weight", ascending=False, kind="stable")
    best = best.drop_duplicates("req")
    if len(majors) <= 1:
        return [np.union1d(mine, best["req"].to_numpy())]
    groups = {m: list(best.loc[best["target"] == m, "req"]) for m in majors}
    # Trouble no cause explains goes with the largest cause that reaches its model (one model's engines are no
    # home for another model's leftovers, which would name that model in the engines' incident) and was at work
    # when it arrived (a limiter flapping for 30 s explains nothing of the minutes around it), else with the
    # largest that reaches its model, else the largest.
    reaches = {c.id: set(c.models) for c in ranked.cands if c.id in groups}
    arrival = troubled["arrival_ns"].to_numpy()
    position = {r: k for k, r in enumerate(troubled["req"].to_numpy())}
    active = {}
    for m in majors:
        blamed = rows[rows["target"] == m].groupby("req")["weight"].sum()
        at = arrival[[position[r] for r in blamed.index]]
        lo, hi = _weighted_span(at, blamed.to_numpy(dtype=float))
        active[m] = (lo - pad_ns, hi + pad_ns)
    model_of = dict(zip(troubled["req"], troubled["model"], strict=True))
    for r in np.setdiff1d(mine, best["req"].to_numpy()):
        home = [m for m in majors if model_of.get(r) in reaches.get(m, ())]
        now = [m for m in home if active[m][0] <= arrival[position[r]] <= active[m][1]]
        groups[(now or home or majors)[0]].append(r)
    weight = dict(zip(troubled["req"], troubled["weight"], strict=True))
    sized = sorted(((sum(weight[r] for r in g), g) for g in groups.values() if g), key=lambda wg: -wg[0])
    if not sized:
        return []
    (_, largest), *rest = sized
    largest += [r for w, g in rest if w < least for r in g]
    return [np.sort(np.array(g, dtype=int)) for g in (largest, *(g for w, g in rest if w >= least))]


def _sub_incident(incident: Incident, reqs: np.ndarray, troubled: pd.DataFrame, onset: int, end: int,
                  share: float) -> Incident:
    """The part of a detected incident whose troubled requests are `reqs`: its models (those with a fifth of
    their trouble in it, by weight), their anomalies, and its share of the severity."""
    mine = troubled[np.isin(troubled["req"].to_numpy(), reqs)]
    per_model = troubled.groupby("model")["weight"].sum()
    counts = mine.groupby("model")["weight"].sum()
    models = tuple(sorted(m for m, n in counts.items() if n >= 0.2 * per_model.get(m, 0) and n >= 3)) \
        or tuple(sorted(counts.sort_values(ascending=False).index[:1]))
    members = tuple(a for a in incident.anomalies if a.key in models) or incident.anomalies
    return replace(incident, onset_ns=onset, end_ns=end, models=models, anomalies=members,
                   severity=incident.severity * share)


def diagnose(inputs: RcaInputs, incident: Incident, windows: list[tuple[int, int]],
             config: DetectionConfig | None = None, shift_ns: int = 0,
             claims: tuple[Incident, ...] = ()) -> list[IncidentDiagnosis]:
    """Rank the candidate causes of one detected incident, splitting it by cause (module docstring).
    `windows` are every incident's windows (kept out of the baselines); `shift_ns` moves its detected onset
    (to measure how much the ranking depends on it: then the onset is not re-estimated); `claims` are every
    detected incident (the models another one claims are left to it)."""
    config = config or DetectionConfig()
    start = int(inputs.requests["arrival_ns"].min()) if len(inputs.requests) else 0
    lo, hi = incident.onset_ns + shift_ns, incident.end_ns
    if hi <= lo:
        hi = lo + int(config.bucket_s * 1e9)
    others = tuple(win for win in windows if win != (incident.onset_ns, incident.end_ns))
    elsewhere = frozenset(m for i in claims if i.onset_ns < hi and lo < i.end_ns and i is not incident
                          for m in i.models)
    # first pass: a baseline that ends well before the detected onset (a slow start is not yet a deviation)
    w = Window(lo, hi, lo - min(int(PASS1_MARGIN_S * 1e9), (lo - start) // 2), others, start)
    ranked = _rank(inputs, incident.models, w, config, elsewhere=elsewhere)
    onsets: dict[str, int] = {}
    if not shift_ns:
        # each cause's own onset; the baseline then ends before the first of them, and the window starts there
        for c, part_lo in _part_tops(inputs, ranked, int(config.bucket_s * 1e9)):
            # looked for from where its own part's trouble starts: another cause's may start minutes earlier
            onset = own_onset(inputs, c, ranked.own[c.id], min(max(part_lo, lo), hi), hi, start)
            if onset is not None:
                onsets[c.id] = onset
        first = min([lo, *onsets.values()])
        w = Window(first, hi, first, others, start)
        ranked = _rank(inputs, incident.models, w, config, elsewhere=elsewhere)
        for cid, onset in onsets.items():
            ranked.own[cid] = replace(ranked.own[cid], onset_ns=onset)
    requests = inputs.requests
    arrival = requests["arrival_ns"].to_numpy()
    weight = dict(zip(ranked.troubled["req"], ranked.troubled["weight"], strict=True))
    total = max(sum(weight.values()), 1e-9)
    parts = _split(ranked, int(config.bucket_s * 1e9))
    out = []
    for reqs in parts:
        mine = ranked.troubled[np.isin(ranked.troubled["req"].to_numpy(), reqs)]
        causes = _causes(ranked, inputs, reqs, tuple(sorted(mine["model"].unique())))
        top = causes[0] if causes else None
        # when it started: its top cause's own onset, else the models' detected onset
        onset = top.own.onset_ns if top is not None and top.own.onset_ns is not None else lo
        part = ranked
        if len(parts) > 1:  # each part's own signals over its own window, from the same baseline
            began, ended = _blamed_span(ranked, top.candidate.id if top is not None else None, reqs, arrival)
            if top is None or top.own.onset_ns is None:
                onset = max(began, w.lo)
            part_window = Window(onset, min(ended + int(config.bucket_s * 1e9), hi), w.baseline_end, others, start)
            own = {c.id: OwnAnomaly(tuple(own_signals(inputs, c, part_window)), ranked.own[c.id].onset_ns)
                   for c in ranked.cands}
            part = replace(ranked, window=part_window, own=own, inside=part_window.during(arrival))
        share = sum(weight[r] for r in reqs) / total
        sub = _sub_incident(incident, reqs, ranked.troubled, onset, part.window.hi, share)
        causes = _causes(part, inputs, reqs, sub.models)
        window = (part.window.lo, part.window.hi)
        flagged = int(mine["flagged"].sum())
        out.append(IncidentDiagnosis(sub, window, int(part.inside.sum()), flagged, causes,
                                     _incident_commonality(requests, ranked.troubled, reqs, sub, window),
                                     w.baseline_end, incident))
    return out


def _blamed_span(ranked: _Ranked, cause: str | None, reqs: np.ndarray, arrival: np.ndarray) -> tuple[int, int]:
    """When the trouble blamed on `cause` among the requests `reqs` arrived, by weight (`_weighted_span`): a
    request it is blamed for a thousandth of (a limiter's microsecond of a slow request's latency) does not stretch
    a 30 s flap over minutes. All of `reqs`' arrivals when none of their trouble is blamed on it."""
    rows = ranked.blamed.rows
    core = rows[(rows["target"] == cause) & np.isin(rows["req"].to_numpy(), reqs)].groupby("req")["weight"].sum()
    if core.sum() > 0:
        return _weighted_span(arrival[core.index.to_numpy()], core.to_numpy(dtype=float))
    return int(arrival[reqs].min()), int(arrival[reqs].max())


def _part_tops(inputs: RcaInputs, ranked: _Ranked, pad_ns: int, most: int = 3) -> list[tuple[Candidate, int]]:
    """The candidate blamed most in each part of the incident (`_split`), if its own change is significant, with
    when the requests blamed on it in that part started to arrive (`_arrival_span`): where its own onset is
    looked for."""
    rows = ranked.blamed.rows
    by_id = {c.id: c for c in ranked.cands}
    tops = []
    for reqs in _split(ranked, pad_ns)[:most]:
        mine = rows[np.isin(rows["req"].to_numpy(), reqs)]
        mass = mine.groupby("target")["weight"].sum()
        if len(mass):
            top = by_id.get(str(mass.idxmax()))
            if top is not None and ranked.own[top.id].significant:
                blamed = mine[mine["target"] == top.id].groupby("req")["weight"].sum()
                tops.append((top, _arrival_span(inputs, blamed.index.to_numpy(), blamed.to_numpy())[0]))
    return tops


def _incident_commonality(requests: pd.DataFrame, troubled: pd.DataFrame, reqs: np.ndarray, incident: Incident,
                          window: tuple[int, int]) -> Commonality | None:
    """What the requests showing the incident's main symptom have in common, against all requests to the
    incident's models (the population the selection is drawn from: the model the selection is restricted to is
    no finding): the symptom is the metric that dominated most of the incident's model anomalies."""
    lo, hi = window
    arrival = requests["arrival_ns"].to_numpy()
    scope = requests["model"].isin(incident.models).to_numpy()
    symptoms = [a.metric for a in incident.anomalies] or ["ttft"]  # found on a component alone: its slowness
    symptom = max(set(symptoms), key=symptoms.count)
    anomalous = troubled[troubled["flagged"].to_numpy(dtype=bool)]
    reason = np.full(len(requests), "", dtype=object)
    reason[anomalous["req"].to_numpy()] = anomalous["reason"].to_numpy(dtype=object)
    mine = np.zeros(len(requests), dtype=bool)
    mine[np.intersect1d(reqs, anomalous["req"].to_numpy())] = True
    mine &= scope & (arrival >= lo) & (arrival < hi)
    selected = mine & (reason == ("error" if symptom == "errors" else symptom))
    if selected.sum() < 5:
        selected = mine
    if selected.sum() < 5:
        return None
    return attribute_lift(requests[scope], selected[scope],
                          population_name=f"all requests to {', '.join(incident.models)}")


def analyze_incidents(store: Store, config: DetectionConfig | None = None) -> RcaReport:
    """Detect anomalies and incidents, read the topology, and rank the candidate causes of each incident."""
    return analyze_inputs(RcaInputs.load(store), config)


def analyze_inputs(inputs: RcaInputs, config: DetectionConfig | None = None) -> RcaReport:
    config = config or DetectionConfig()
    report = detect_in_requests(inputs.requests, config, inputs.paths)
    windows = [(i.onset_ns, i.end_ns) for i in report.incidents]
    diagnoses = [d for incident in report.incidents
                 for d in diagnose(inputs, incident, windows, config, claims=report.incidents)]
    diagnoses.sort(key=lambda d: (-d.incident.severity, d.incident.onset_ns))
    numbered = tuple(replace(d, incident=replace(d.incident, id=k + 1)) for k, d in enumerate(diagnoses))
    return RcaReport(report, inputs.topology, numbered)


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
