"""The candidate causes of an incident and what their own telemetry says.

Candidates are every component instance the traces show (auth, rate limiter, router, global queue, KV link),
each model's engines (all its replicas and workers together), each disaggregated model's prefill and decode
pools (`pools.py`), and each tenant's traffic (load). A candidate's
own signals (`signals.py`) compare a window of the incident with a baseline before it (`Window`); its onset is
where its main signal started to rise (`changepoint.trend_onset`).

    inputs = RcaInputs.load(store)
    for c in candidates(inputs.topology, inputs.requests):
        own = OwnAnomaly(tuple(own_signals(inputs, c, window)))
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from infertrace.analyzers import materialize_once, query_text
from infertrace.analyzers.anomalies import _clock, load_requests
from infertrace.analyzers.blame import COMPONENT_WORDS
from infertrace.analyzers.changepoint import trend_onset
from infertrace.analyzers.pools import pools
from infertrace.analyzers.signals import (
    Signal,
    StepTimeFit,
    fit_step_times,
    rate_signal,
    step_time_signal,
    time_signal,
    traffic_signal,
    work_features,
    work_signal,
)
from infertrace.analyzers.topology import SHARED_KINDS, Topology, load_paths, topology_from_paths
from infertrace.store.store import Store

LATENCY_FLOOR_MS = 0.5  # a component call must be this much slower than its normal range to count as slow
SLICE_MIN_CALLS = 20  # a caller's calls (a tenant's, a model's) tested on their own: at least this many in the window
SLICE_COLUMNS = ("tenant", "model")
LOOKBACK_S = 600.0  # how far before the detected onset a candidate's own onset is looked for
BASELINE_GUARD_S = 30.0  # the baseline ends this long before the first onset (an onset is dated to ± a bin)
WAIT_SIGNALS = ("wait",)  # a wait is a consequence: it does not make a candidate a cause by itself


@dataclass(frozen=True)
class Candidate:
    id: str  # the instance (service.instance.id, or the link's name), "<model> engines", or "load: <tenant>"
    kind: str  # auth, rate_limiter, router, scheduler, link, engines, or load
    instances: tuple[str, ...]
    models: tuple[str, ...]
    tenant: str | None = None  # for load: whose traffic

    @property
    def shared(self) -> bool:
        """A shared gateway component, as opposed to a model's own data path (engines, KV link) or load."""
        return self.kind in SHARED_KINDS


@dataclass(frozen=True)
class OwnAnomaly:
    """What the candidate's own telemetry shows: its signals, the main one (largest significant effect, else the
    largest), and when that one started to move."""

    signals: tuple[Signal, ...]
    onset_ns: int | None = None
    window_ns: tuple[int, int] | None = None  # measured over its own part of the incident, when not all of it

    @property
    def main(self) -> Signal | None:
        significant = [s for s in self.signals if s.significant]
        pool = significant or list(self.signals)
        return max(pool, key=lambda s: (s.effect, -s.p_value)) if pool else None

    @property
    def significant(self) -> bool:
        return any(s.significant for s in self.signals)

    @property
    def score(self) -> float:
        """The largest effect among its significant signals, in [0, 1] (0 when none is significant)."""
        return max((s.effect for s in self.signals if s.significant), default=0.0)

    @property
    def cause_effect(self) -> float:
        """As `score`, leaving out waits (a wait is a consequence of something)."""
        return max((s.effect for s in self.signals if s.significant and s.name not in WAIT_SIGNALS), default=0.0)

    @property
    def signal(self) -> str:
        m = self.main
        return m.name if m is not None and m.significant else "none"

    @property
    def what(self) -> str:
        m = self.main
        return m.what if m is not None else ""

    @property
    def share_before(self) -> float:
        m = self.main
        return m.share_before if m is not None else 0.0

    @property
    def share_during(self) -> float:
        m = self.main
        return m.share_during if m is not None else 0.0

    def phrase(self) -> str:
        m = self.main
        if m is None or not m.significant:
            return "no significant change in its own spans"
        if self.window_ns is not None:
            return f"{m.phrase()} (from {_clock(self.window_ns[0])} to {_clock(self.window_ns[1])})"
        return m.phrase()


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

    def __post_init__(self) -> None:
        self.requests = self.requests.reset_index(drop=True)
        if "resend_count" not in self.requests:
            self.requests["resend_count"] = pd.NA
        self.paths = self.paths.reset_index(drop=True)
        if "queue_ns" not in self.paths:
            self.paths["queue_ns"] = np.nan
        self.engines = self.engines.reset_index(drop=True)
        self.steps = self.steps.reset_index(drop=True)
        for frame in (self.requests, self.paths, self.engines, self.steps):
            for column in frame.columns:  # numpy objects: row selections are many times faster than on Arrow
                if pd.api.types.is_string_dtype(frame[column]):
                    frame[column] = frame[column].astype(object)
        index = pd.Index(self.requests["trace_id"])
        self.paths["req"] = index.get_indexer(self.paths["trace_id"])  # the request's row in `requests`
        self.engines["req"] = index.get_indexer(self.engines["trace_id"])
        self._engine_rows = self.engines.groupby("instance").indices
        self._step_rows = self.steps.groupby("instance").indices
        self._step_instance = pd.factorize(self.steps["instance"])[0]  # integer codes: grouping without strings
        self._step_fits: dict[tuple, tuple[StepTimeFit, ...]] = {}  # by candidate and baseline (_engine_signals)
        self._rows = {k: np.flatnonzero(self.paths["instance"].to_numpy() == k[0])
                      for k in self.paths[["instance", "kind"]].drop_duplicates().itertuples(index=False)}
        self._features = work_features(*(self.steps[c].to_numpy(dtype=float)
                                         for c in ("prefill_tokens", "decode_tokens", "context_tokens")))

    def path_rows(self, instance: str, kind: str) -> np.ndarray:
        rows = self._rows.get((instance, kind))
        if rows is None:
            return np.zeros(0, dtype=int)
        return rows[(self.paths["kind"].to_numpy()[rows] == kind)]


# ------------------------------------------------------------------------------------ candidates
def candidates(topology: Topology, requests: pd.DataFrame | None = None) -> list[Candidate]:
    """Every component instance, every model's engines, and (given the requests) every tenant's traffic."""
    out = [Candidate(n.instance, n.kind, (n.instance,), n.models) for n in topology.components()]
    for model in topology.models:
        engines = topology.engines(model)
        if engines:
            out.append(Candidate(f"{model} engines", "engines", engines, (model,)))
    out += [Candidate(p.id, "engines", p.instances, (p.model,)) for p in pools(topology)]
    if requests is not None and len(requests):
        for tenant in sorted(requests["tenant"].dropna().unique()):
            models = tuple(sorted(requests.loc[requests["tenant"] == tenant, "model"].dropna().unique()))
            out.append(Candidate(f"load: {tenant}", "load", (), models, str(tenant)))
    return out


# ------------------------------------------------------------------------------------- windows
@dataclass(frozen=True)
class Window:
    """An incident's window [lo, hi) and its baseline: from the start of the data to `baseline_end` less the
    guard, outside other incidents' windows."""

    lo: int
    hi: int
    baseline_end: int
    others: tuple[tuple[int, int], ...]
    start: int

    def during(self, t: np.ndarray) -> np.ndarray:
        return (t >= self.lo) & (t < self.hi)

    def before(self, t: np.ndarray) -> np.ndarray:
        mask = (t >= self.start) & (t < self.baseline_end - int(BASELINE_GUARD_S * 1e9))
        for lo, hi in self.others:
            mask &= ~((t >= lo) & (t < hi))
        return mask

    @property
    def baseline_s(self) -> float:
        return max((self.baseline_end - int(BASELINE_GUARD_S * 1e9) - self.start) / 1e9, 0.0)


# ------------------------------------------------------------------------------- own signals
def _component_signals(inputs: RcaInputs, c: Candidate, w: Window) -> list[Signal]:
    rows = inputs.path_rows(c.id, c.kind)
    if not len(rows):
        return []
    paths = inputs.paths
    t = paths["start_ns"].to_numpy()[rows]
    before, during = w.before(t), w.during(t)
    latency = paths["latency_ns"].to_numpy(dtype=float)[rows]
    queue = paths["queue_ns"].to_numpy(dtype=float)[rows]
    outcome = paths["outcome"].to_numpy()[rows]
    word = COMPONENT_WORDS.get(c.kind, c.kind)
    found: list[Signal | None] = []
    if c.kind == "scheduler":
        found.append(time_signal("wait", "global-queue hold", latency[before], latency[during], LATENCY_FLOOR_MS))
    else:
        waited = np.isfinite(queue)
        service = latency - np.where(waited, queue, 0.0)
        what = f"{word} service time" if waited.any() else f"{word} latency"
        whole = time_signal("service", what, service[before], service[during], LATENCY_FLOOR_MS)
        found.append(whole)
        if whole is None or not whole.significant:
            found.append(_sliced_service(what, service, before, during,
                                         {k: paths[k].to_numpy(dtype=object)[rows] for k in SLICE_COLUMNS}))
        if waited.any():
            found.append(time_signal("wait", f"{word} wait for a worker", queue[before & waited],
                                     queue[during & waited], LATENCY_FLOOR_MS))
    for value, name, what in (("error", "errors", f"{word} errors"), ("timeout", "timeouts", f"{word} timeouts"),
                              ("rejected", "rejections", f"{word} rejections")):
        hit = outcome == value
        if hit.any():
            found.append(rate_signal(name, what, hit[before], hit[during]))
    return [s for s in found if s is not None]


def _sliced_service(what: str, service: np.ndarray, before: np.ndarray, during: np.ndarray,
                    callers: dict[str, np.ndarray]) -> Signal | None:
    """A component's service time for one caller's calls, a tenant's or a model's: a fault confined to them (the
    replica or cache shard that holds a tenant's keys, one model's routing entry) moves the component's own
    statistics by their share of its calls only, and a tenant with 9% of them slowed by 380 ms is a rank effect
    of 0.06 over all of them. Every caller with SLICE_MIN_CALLS calls in the window (and ten before) that is not
    all of them is tested; each p-value is multiplied by the number tested (Bonferroni). The most significant one
    that is still significant, with `about` naming it ("tenant=tenant-e"), else None."""
    tested: list[Signal] = []
    everyone = before | during
    for column, labels in callers.items():
        for value in pd.unique(labels[during]):
            if not isinstance(value, str) or not value:
                continue
            mine = labels == value
            if (mine & during).sum() < SLICE_MIN_CALLS or (mine & before).sum() < 10 or (mine | ~everyone).all():
                continue
            found = time_signal("service", f"{what} of {value}'s calls", service[before & mine],
                                service[during & mine], LATENCY_FLOOR_MS)
            if found is not None:
                tested.append(replace(found, about=f"{column}={value}"))
    passing = [replace(sg, p_value=min(sg.p_value * len(tested), 1.0)) for sg in tested]
    passing = [sg for sg in passing if sg.significant]
    return min(passing, key=lambda sg: (sg.p_value, -sg.effect)) if passing else None


def _slice_of(paths: pd.DataFrame, rows: np.ndarray, about: str) -> np.ndarray:
    """Which of the rows are the calls a sliced signal is about ("tenant=tenant-e"): all, when it is about none."""
    column, _, value = about.partition("=")
    if column not in SLICE_COLUMNS:
        return np.ones(len(rows), dtype=bool)
    return paths[column].to_numpy(dtype=object)[rows] == value


def _rows_of(index: dict[str, np.ndarray], instances: tuple[str, ...]) -> np.ndarray:
    found = [index[i] for i in instances if i in index]
    return np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=int)


def _engine_signals(inputs: RcaInputs, c: Candidate, w: Window) -> list[Signal]:
    found: list[Signal | None] = []
    steps = inputs.steps
    mine = _rows_of(inputs._step_rows, c.instances)
    if len(mine):
        t = steps["start_ns"].to_numpy()[mine]
        step_ns, held, features = steps["step_ns"].to_numpy(dtype=float)[mine], steps["steps"].to_numpy()[mine], \
            inputs._features[mine]
        key = (c.instances, w.start, w.baseline_end, w.others)  # what the fit depends on: one fit per baseline
        fits = inputs._step_fits.get(key)
        if fits is None:
            fits = inputs._step_fits[key] = fit_step_times(inputs._step_instance[mine], step_ns, held, features,
                                                           w.before(t))
        found.append(step_time_signal(fits, step_ns, held, features, w.during(t)))
    rows = inputs.engines
    mine = _rows_of(inputs._engine_rows, c.instances)
    t = rows["arrival_ns"].to_numpy()[mine]
    before, during = w.before(t), w.during(t)
    if not any(s is not None for s in found):
        for column, name, what in (("engine_ttft_ns", "engine_ttft", "engine TTFT"),
                                   ("tpot_ns", "tpot", "engine decode time per token")):
            values = rows[column].to_numpy(dtype=float)[mine]
            found.append(time_signal(name, what, values[before], values[during]))
    if "engine_queue_ns" in rows:
        waited = rows["engine_queue_ns"].to_numpy(dtype=float)[mine]
        found.append(time_signal("wait", "engine queue time", waited[before], waited[during]))
    failed = rows["failed"].fillna(False).to_numpy(dtype=bool)[mine]
    if failed.any():
        found.append(rate_signal("errors", "engine errors", failed[before], failed[during]))
    return [s for s in found if s is not None]


def first_attempts(requests: pd.DataFrame) -> np.ndarray:
    resend = pd.to_numeric(requests["resend_count"], errors="coerce").fillna(0).to_numpy()
    return resend == 0


def _load_signals(inputs: RcaInputs, c: Candidate, w: Window) -> list[Signal]:
    """The tenant's first attempts against everybody else's: all of them, and to each of its models; and to each
    of its models with a prefill pool, the prompt tokens they gave it (`signals.work_signal`)."""
    requests = inputs.requests
    first = first_attempts(requests)
    t = requests["arrival_ns"].to_numpy()
    tenant = (requests["tenant"] == c.tenant).to_numpy()
    models = requests["model"].to_numpy(dtype=object)
    before, during = w.before(t) & first, w.during(t) & first
    tokens = pd.to_numeric(requests["input_tokens"], errors="coerce").to_numpy(dtype=float)
    prefill_pools = {p.model for p in pools(inputs.topology) if p.role == "prefill_worker"}
    found = []
    for model in ("", *c.models):
        mine = tenant & (models == model) if model else tenant
        what = f"tenant {c.tenant}'s first attempts" + (f" to {model}" if model else "")
        found.append(traffic_signal(what, int((before & mine).sum()), int((before & ~mine).sum()),
                                    int((during & mine).sum()), int((during & ~mine).sum()), w.baseline_s,
                                    (w.hi - w.lo) / 1e9, model))
        if model in prefill_pools:
            found.append(work_signal(f"tenant {c.tenant}'s prompt tokens to {model}'s prefill pool",
                                     tokens[before & mine], float(np.nansum(tokens[before & ~mine])),
                                     tokens[during & mine], float(np.nansum(tokens[during & ~mine])),
                                     (int((before & ~mine).sum()), int((during & ~mine).sum())), w.baseline_s,
                                     (w.hi - w.lo) / 1e9, model))
    return [s for s in found if s is not None]


def own_signals(inputs: RcaInputs, c: Candidate, w: Window) -> list[Signal]:
    if c.kind == "engines":
        return _engine_signals(inputs, c, w)
    if c.kind == "load":
        return _load_signals(inputs, c, w)
    return _component_signals(inputs, c, w)


def _signal_series(inputs: RcaInputs, c: Candidate, signal: Signal) -> tuple[np.ndarray, np.ndarray]:
    """(times, values) of a signal over the whole period, in its natural unit (ms, 0/1, ratio, share)."""
    if c.kind == "load":
        requests = inputs.requests
        first = first_attempts(requests)
        mine = (requests["tenant"] == c.tenant).to_numpy()
        if signal.about:
            mine = mine & (requests["model"] == signal.about).to_numpy()
        if signal.name == "work":  # the tenant's prompt tokens per first attempt
            tokens = pd.to_numeric(requests["input_tokens"], errors="coerce").fillna(0).to_numpy(dtype=float)
            return requests["arrival_ns"].to_numpy()[first], (mine * tokens)[first]
        return requests["arrival_ns"].to_numpy()[first], mine[first].astype(float)
    if c.kind == "engines":
        if signal.name == "step_time":
            steps = inputs.steps
            mine = _rows_of(inputs._step_rows, c.instances)
            # ratio to one fit over the whole period: only where it rises matters here
            x, y = inputs._features[mine], steps["step_ns"].to_numpy(dtype=float)[mine]
            coef, *_ = np.linalg.lstsq(x, y, rcond=None)
            return steps["start_ns"].to_numpy()[mine], y / np.maximum(x @ coef, 1.0)
        rows = inputs.engines
        mine = _rows_of(inputs._engine_rows, c.instances)
        column = {"engine_ttft": "engine_ttft_ns", "tpot": "tpot_ns", "wait": "engine_queue_ns"}.get(signal.name)
        t = rows["arrival_ns"].to_numpy()[mine]
        if column is None:
            return t, rows["failed"].fillna(False).to_numpy(dtype=float)[mine]
        return t, rows[column].to_numpy(dtype=float)[mine] / 1e6
    rows = inputs.path_rows(c.id, c.kind)
    paths = inputs.paths
    t = paths["start_ns"].to_numpy()[rows]
    latency = paths["latency_ns"].to_numpy(dtype=float)[rows]
    queue = paths["queue_ns"].to_numpy(dtype=float)[rows]
    outcome = paths["outcome"].to_numpy()[rows]
    if signal.name == "service":
        mine = _slice_of(paths, rows, signal.about)
        return t[mine], (latency - np.where(np.isfinite(queue), queue, 0.0))[mine] / 1e6
    if signal.name == "wait":
        return t, (latency if c.kind == "scheduler" else queue) / 1e6
    value = {"errors": "error", "timeouts": "timeout", "rejections": "rejected"}[signal.name]
    return t, (outcome == value).astype(float)


def own_onset(inputs: RcaInputs, c: Candidate, own: OwnAnomaly, lo: int, hi: int, start: int) -> int | None:
    """When the candidate's main signal started to rise: a trend fit from up to LOOKBACK_S before the window's
    start to its middle (after which the fault may end and the signal fall back)."""
    main = own.main
    if main is None or not main.significant:
        return None
    t, values = _signal_series(inputs, c, main)
    search_lo = max(start, lo - int(LOOKBACK_S * 1e9))
    search_hi = min(hi, lo + max((hi - lo) // 2, int(60e9)))
    found = trend_onset(t, values, search_lo, search_hi)
    return None if found is None else found.onset_ns
