"""Multi-model anomaly detection: per model and per tenant, per time bucket, robust scores of TTFT, decode
time per token, E2E latency, error rate, 429 rate and truncation rate; onset and end of each anomaly by
change-point; anomalies on several models that overlap in time grouped into incidents.

Scores are robust, as BARO's are: each series' bucket is compared with the median and median absolute deviation
(MAD) of the series' normal buckets before it (the last 15 minutes of those that did not score as anomalous,
ending 3 minutes before the bucket), so a fault that lasts most of the period, a backlog that drains long after
it, or a slow ramp does not become its own baseline; the first minutes are compared with the whole series.
Latencies are scored on the mean of their logarithms per bucket (a slowdown is a ratio); rates on the
binomial upper tail of each bucket's count (alone, and pooled with the 1, 3 and 7 buckets before) under the
series' baseline rate: exact for rare events, and a failure of a few percent of calls shows once minutes of it
are pooled. A bucket is anomalous when some metric scores
at least `threshold`; an anomaly is a run of at least `min_buckets` anomalous buckets (gaps up to
`merge_gap_s` merged, so a flapping fault stays one anomaly). Its onset and end are then located at
request resolution by a single mean-shift change-point (least squares, as one step of binary segmentation)
in the dominant metric around the run's first and last bucket: a fault that starts mid-bucket is dated to
the request, not to the bucket boundary.

Model anomalies whose intervals overlap and whose onsets lie within `stagger_s` of each other (real
outages stagger) form one incident; tenant anomalies overlapping it are attached.

    report = detect_anomalies(store)
    for incident in report.incidents: print(incident.sentence())
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import numpy as np
import pandas as pd
from scipy.stats import binom, norm

from infertrace.analyzers import query_text
from infertrace.analyzers.changepoint import mean_shift
from infertrace.analyzers.signals import ms_text
from infertrace.analyzers.topology import ENGINE_KINDS, load_paths
from infertrace.store.store import Store

# metric -> (request_outcomes column, kind, what it is)
METRICS: dict[str, tuple[str, str, str]] = {
    "ttft": ("ttft_ns", "latency", "time to first token"),
    "tpot": ("tpot_ns", "latency", "decode time per output token"),
    "e2e": ("e2e_ns", "latency", "end-to-end latency"),
    "errors": ("failed", "rate", "error (5xx) rate"),
    "rate_limited": ("rejected", "rate", "429 rate"),
    "truncated": ("truncated", "rate", "share of generations cut at max_tokens"),
}
# The same per component instance, from its own calls (request_paths): its service time (latency less any wait
# for a worker; a global queue's whole hold), its failures (errors and timeouts) and its 429s. A component that
# shares a model's requests with other instances, or fails a few percent of its calls, moves the model's series
# by a fraction of what it moves its own.
COMPONENT_METRICS: dict[str, tuple[str, str, str]] = {
    "service": ("service_ns", "latency", "service time"),
    "errors": ("failed", "rate", "error (5xx) and timeout rate"),
    "rate_limited": ("rejected", "rate", "429 rate"),
}
# A tenant's first attempts to a model as a share of everybody's first attempts (retries excluded; a diurnal rise of
# everybody's traffic cancels): one tenant's surge is an incident of the model it reached even when the model's
# latency, noisy minute to minute, moves less than its own noise.
TRAFFIC_METRICS: dict[str, tuple[str, str, str]] = {
    "traffic": ("first_attempt", "rate", "share of all first attempts"),
}
ALL_METRICS = {**COMPONENT_METRICS, **METRICS, **TRAFFIC_METRICS}
RATE_CEILING = 0.5  # a failure rate's baseline is taken as at most this (a series failing half its calls is broken)
MIN_TRAFFIC_FACTOR = 2.0  # a traffic bucket counts only at twice its usual share (bursts and drift do ×1.5)
SCOPES = ("model", "tenant")
POOLED_BUCKETS = (2, 4, 8)  # a rate is also scored over this many trailing buckets together
MIN_SCORED_BUCKETS = 4  # a series is scored once it has this many buckets (latency: with min_requests each)
TRAILING_BUCKETS = 45  # a bucket is scored against up to this many normal buckets before it (15 min) ...
MIN_BASELINE = 9  # ... once there are this many (3 min); before, against the whole series
BASELINE_GAP = 9  # ... and ending this many buckets (3 min) before it, once that leaves MIN_BASELINE: a slow ramp's
# early buckets, each too little above the last to score, then do not carry the baseline up with the ramp


@dataclass(frozen=True)
class DetectionConfig:
    bucket_s: float = 20.0
    threshold: float = 5.0  # robust score of an anomalous bucket
    min_buckets: int = 2  # anomalous buckets an anomaly needs
    merge_gap_s: float = 60.0  # anomalous buckets closer than this belong to one anomaly
    stagger_s: float = 180.0  # onsets of one incident's anomalies lie within this of each other
    min_requests: int = 3  # a bucket with fewer requests has no latency score
    latency_scale_floor: float = 0.05  # in log units (≈ 5%): noise below this is not a shift
    rate_floor: float = 0.001  # the least baseline rate a rate's binomial tail assumes
    request_threshold: float = 3.5  # robust score of a single anomalous request


@dataclass(frozen=True)
class MetricShift:
    """One metric of an anomalous series: its baseline, its value during the anomaly, and the robust score
    of its worst bucket. Latencies are in milliseconds (geometric means), rates are fractions."""

    metric: str
    baseline: float
    observed: float
    score: float

    @property
    def is_rate(self) -> bool:
        return ALL_METRICS[self.metric][1] == "rate"

    def phrase(self) -> str:
        what = ALL_METRICS[self.metric][2]
        if self.is_rate:
            return f"{what} {self.baseline:.1%} → {self.observed:.1%}"
        return f"{what} {ms_text(self.baseline)} → {ms_text(self.observed)}"


@dataclass(frozen=True)
class SeriesAnomaly:
    """A model (or tenant) whose metrics departed from its own baseline between onset and end."""

    scope: str  # "model", "tenant", "component" or "traffic" (key: "tenant → model")
    key: str
    onset_ns: int
    end_ns: int
    metric: str  # the dominant metric
    peak_score: float
    anomalous_buckets: int
    shifts: tuple[MetricShift, ...]  # every metric that scored above the threshold, dominant first

    def sentence(self) -> str:
        shifts = "; ".join(s.phrase() for s in self.shifts)
        return f"{self.scope} {self.key}: anomalous from {_clock(self.onset_ns)} to {_clock(self.end_ns)} ({shifts})"


@dataclass(frozen=True)
class Incident:
    """Model (and component) anomalies that overlap in time, with the tenants anomalous meanwhile. An incident
    found only on a component's own calls has the models the component serves."""

    id: int
    onset_ns: int
    end_ns: int
    models: tuple[str, ...]
    tenants: tuple[str, ...]
    anomalies: tuple[SeriesAnomaly, ...]  # model anomalies, by onset
    tenant_anomalies: tuple[SeriesAnomaly, ...]
    severity: float  # anomalous model- and component-buckets, weighted by how far over the threshold they scored
    component_anomalies: tuple[SeriesAnomaly, ...] = ()

    def sentence(self) -> str:
        models = ", ".join(self.models)
        members = self.anomalies or self.component_anomalies
        if all(a.scope == "traffic" for a in members):  # a surge whose model's latency stayed within its noise
            surges = "; ".join(f"{a.key}, {a.shifts[0].phrase()}" for a in members)
            return (f"Incident {self.id}: traffic to {models} surged from {_clock(self.onset_ns)} to "
                    f"{_clock(self.end_ns)} ({surges}).")
        lead = min(members, key=lambda a: a.onset_ns)
        stagger = max(a.onset_ns for a in members) - lead.onset_ns
        onset = _clock(self.onset_ns)
        if stagger >= 1e9:
            onset += f" (onsets staggered over {stagger / 1e9:.0f} s)"
        return (f"Incident {self.id}: {len(self.models)} model{'s' if len(self.models) > 1 else ''} anomalous from "
                f"{onset} to {_clock(self.end_ns)}: {models}.")


@dataclass(frozen=True)
class BucketScore:
    """One cell of the models × time heatmap: the worst metric's robust score in the bucket."""

    scope: str
    key: str
    bucket_start_ns: int
    score: float
    metric: str
    requests: int


@dataclass(frozen=True)
class Unchecked:
    """A metric that detection could not score for some models, and why: a model whose 429 rate was never
    checked has not kept it steady, and "no incident" must not say it did."""

    metric: str  # a key of METRICS
    models: tuple[str, ...]
    why: str

    def what(self) -> str:
        return METRICS[self.metric][2]


@dataclass(frozen=True)
class AnomalyReport:
    start_ns: int
    end_ns: int
    config: DetectionConfig
    requests: int
    anomalies: tuple[SeriesAnomaly, ...]  # model, tenant and component anomalies, by onset
    incidents: tuple[Incident, ...]  # by severity, worst first
    heatmap: tuple[BucketScore, ...] = field(repr=False)
    unchecked: tuple[Unchecked, ...] = ()  # per metric and reason, the models it was not scored for

    def models(self) -> list[str]:
        """The models detection ran on (each with requests in the store)."""
        return sorted({b.key for b in self.heatmap if b.scope == "model"})

    def checked(self, models: Iterable[str] | None = None) -> tuple[str, ...]:
        """The metrics scored for at least one of `models` (default: every model), in METRICS' order."""
        models = set(self.models() if models is None else models)
        skipped: dict[str, set[str]] = {}
        for u in self.unchecked:
            skipped.setdefault(u.metric, set()).update(u.models)
        return tuple(m for m in METRICS if models - skipped.get(m, set()))

    def model_anomalies(self) -> tuple[SeriesAnomaly, ...]:
        return tuple(a for a in self.anomalies if a.scope == "model")

    def component_anomalies(self) -> tuple[SeriesAnomaly, ...]:
        return tuple(a for a in self.anomalies if a.scope == "component")


# ---------------------------------------------------------------------------------------- loading
def load_requests(store: Store) -> pd.DataFrame:
    """The `request_outcomes` rows, ordered by arrival."""
    frame = store.aggregate("request_outcomes", query_text("request_outcomes")).df()
    for column in ("failed", "rejected", "truncated"):
        frame[column] = frame[column].fillna(False).astype(bool)
    return frame


# --------------------------------------------------------------------------------------- scoring
def _bucket_table(requests: pd.DataFrame, scope: str, start_ns: int, bucket_ns: int,
                  config: DetectionConfig, metrics: dict[str, tuple[str, str, str]] = METRICS) -> pd.DataFrame:
    """Per (key, bucket): request (or call) count and, per metric, the bucket statistic (mean log latency in ns,
    or rate) and its robust score against the key's own buckets."""
    frame = requests[[scope, "arrival_ns"]].copy()
    frame["bucket"] = (requests["arrival_ns"].to_numpy() - start_ns) // bucket_ns
    stats = {"n": (scope, "size")}
    for metric, (column, kind, _) in metrics.items():
        if kind == "latency":
            values = requests[column].to_numpy(dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                frame[metric] = np.where(values > 0, np.log(values), np.nan)
            frame[f"{metric}_n"] = np.isfinite(frame[metric])
            stats[metric] = (metric, "mean")
            stats[f"{metric}_n"] = (f"{metric}_n", "sum")
        else:
            frame[metric] = requests[column].to_numpy(dtype=float)
            stats[metric] = (metric, "mean")
    table = frame.dropna(subset=[scope]).groupby([scope, "bucket"], sort=True).agg(**stats).reset_index()
    for metric in metrics:
        table[f"{metric}_score"] = np.nan
    for _, idx in table.groupby(scope).groups.items():
        part = table.loc[idx]
        n = part["n"].to_numpy(dtype=float)
        for metric, (_, kind, _) in metrics.items():
            values = part[metric].to_numpy(dtype=float)
            if kind == "latency":
                usable = part[f"{metric}_n"].to_numpy() >= config.min_requests
                values = np.where(usable, values, np.nan)
                if usable.sum() < MIN_SCORED_BUCKETS:
                    continue
            elif len(values) < MIN_SCORED_BUCKETS:
                continue
            table.loc[part.index, f"{metric}_score"] = _trailing_scores(values, n, kind, config)
    return table


# What a model's requests must carry for each metric to be scored, where no request does.
_NEEDS = {
    "ttft": "no request has a first-token time",
    "tpot": "no request has a decode time with two or more output tokens",
    "e2e": "no request has an end time",
    "truncated": "no span gives a finish reason",
}


def _unchecked(requests: pd.DataFrame, table: pd.DataFrame, config: DetectionConfig) -> tuple[Unchecked, ...]:
    """Per model, the metrics `_bucket_table` left unscored (every score NaN), or scored from a rate no span could
    show: why, from what the requests carry."""
    reasons: dict[tuple[str, str], list[str]] = {}
    bucket_s = f"{config.bucket_s:g} s"
    for model, part in table.groupby("model", sort=True):
        rows = requests[requests["model"] == model]
        for metric, (column, kind, _) in METRICS.items():
            # a rate whose events no span could show is 0 in every bucket: scored, but it checked nothing
            # (rows without those columns, as some callers build them, are taken as able to show the events)
            if metric == "rate_limited" and "seen_at" in rows and not (rows["seen_at"] == "entry").any():
                why = ("429s are a gateway's answers, and none of these requests passed a gateway entry span "
                       "(requests rejected before an engine are not in the store)")
            elif metric == "truncated" and "finish_reason" in rows and rows["finish_reason"].isna().all():
                why = _NEEDS[metric]
            elif part[f"{metric}_score"].notna().any():
                continue
            elif kind == "latency" and not np.isfinite(rows[column].to_numpy(dtype=float)).any():
                why = _NEEDS[metric]
            elif kind == "latency":
                usable = int((part[f"{metric}_n"] >= config.min_requests).sum())
                why = (f"too little traffic: {_buckets(usable, bucket_s)} with {config.min_requests} or more such "
                       f"requests, {MIN_SCORED_BUCKETS} are needed")
            else:
                why = (f"too little traffic: {_buckets(len(part), bucket_s)} with requests, {MIN_SCORED_BUCKETS} "
                       "are needed")
            reasons.setdefault((metric, why), []).append(str(model))
    return tuple(Unchecked(metric, tuple(models), why) for (metric, why), models in reasons.items())


def _buckets(n: int, width: str) -> str:
    return f"{n} bucket{'' if n == 1 else 's'} of {width}"


def _latency_scores(values: np.ndarray, baseline: np.ndarray, config: DetectionConfig) -> np.ndarray:
    median = float(np.median(baseline))
    scale = max(_mad(baseline - median), config.latency_scale_floor)
    return (values - median) / scale


def _latency_score(value: float, baseline: list[float], config: DetectionConfig) -> float:
    """`_latency_scores` of one value against a short baseline, with Python's `statistics.median` in place of NumPy's
    (the same arithmetic, so the same score; NumPy's per-call cost dominates at a few dozen values)."""
    median = statistics.median(baseline)
    scale = max(statistics.median([abs(v - median) for v in baseline]) * 1.4826, config.latency_scale_floor)
    return (value - median) / scale


def _trailing_scores(values: np.ndarray, n: np.ndarray, kind: str, config: DetectionConfig) -> np.ndarray:
    """Each bucket's score against the series' normal buckets before it (the last TRAILING_BUCKETS of those that
    did not score as anomalous): a fault that lasts most of the period, or drains long after, does not become
    its own baseline. That baseline ends BASELINE_GAP buckets before the bucket scored (when MIN_BASELINE normal
    buckets lie before the gap; else it ends just before it), so a ramp is scored against where it started, not
    against its own last minutes. The first buckets, with fewer than MIN_BASELINE normal ones before them, are
    scored against the whole series (median and MAD; a rate's baseline the same way). `kind` is "latency",
    "rate" (a failure rate, its baseline capped at RATE_CEILING) or "share" (a share of traffic, which may usually
    be all of it)."""
    finite = np.isfinite(values)
    latency = kind == "latency"
    ceiling = 1.0 if kind == "share" else RATE_CEILING
    whole = (_latency_scores(values, values[finite], config) if latency
             else _rate_scores(values, n, config, ceiling))
    scores = np.full(len(values), np.nan)
    normal: list[int] = []
    for i in range(len(values)):
        before_gap = bisect_left(normal, i - BASELINE_GAP)
        base = (normal[max(0, before_gap - TRAILING_BUCKETS):before_gap] if before_gap >= MIN_BASELINE
                else normal[-TRAILING_BUCKETS:])
        if not finite[i]:
            continue
        if len(base) < MIN_BASELINE:
            scores[i] = whole[i]
        elif latency:
            scores[i] = _latency_score(float(values[i]), values[base].tolist(), config)
        else:
            rate = _small_baseline_rate(values[base].tolist(), n[base].tolist(), config, ceiling)
            scores[i] = _rate_score_at(values, n, i, rate)
        if not scores[i] >= config.threshold:
            normal.append(i)
    return scores


def _baseline_rate(rates: np.ndarray, n: np.ndarray, config: DetectionConfig,
                   ceiling: float = RATE_CEILING) -> float:
    """The larger of the median bucket rate and the pooled rate of the buckets at or below it, smoothed by one
    event in the pooled count (so a series that never failed still has a finite, small rate), at most `ceiling`.
    A share of traffic needs ceiling 1: a tenant that is a model's only caller always has all of its traffic, and
    a baseline capped below that would call every bucket a surge."""
    median = float(np.median(rates))
    low = rates <= median
    pooled = (np.round(rates * n)[low].sum() + 1.0) / (n[low].sum() + 2.0)
    return min(max(median, pooled, config.rate_floor), ceiling)


def _small_baseline_rate(rates: list[float], n: list[float], config: DetectionConfig,
                         ceiling: float = RATE_CEILING) -> float:
    """`_baseline_rate` of a short baseline in Python: the same arithmetic (counts are whole numbers, so their
    sums are exact in any order), without NumPy's per-call cost."""
    median = statistics.median(rates)
    low = [(r, m) for r, m in zip(rates, n, strict=True) if r <= median]
    pooled = (sum(round(r * m) for r, m in low) + 1.0) / (sum(m for _, m in low) + 2.0)
    return min(max(median, pooled, config.rate_floor), ceiling)


def _tail_score(k: np.ndarray, m: np.ndarray, p: float) -> np.ndarray:
    """The binomial upper tail P(K ≥ k) of counts k out of m at rate p, as a normal score (0 at or below m·p)."""
    above = k > m * p
    out = np.zeros(len(k))
    if above.any():
        tail = binom.sf(k[above] - 1, m[above], p)
        out[above] = np.minimum(norm.isf(np.clip(tail, 1e-300, 1.0)), 40.0)
    return out


def _rate_scores(rates: np.ndarray, n: np.ndarray, config: DetectionConfig,
                 ceiling: float = RATE_CEILING) -> np.ndarray:
    """Per bucket, the binomial upper tail of its count under the series' baseline rate (`_baseline_rate`), as
    a normal score (exact for the small counts that a rare event gives). A rare event spread thinly over a long
    fault (a component failing a few percent of its calls) shows in buckets pooled over a few minutes before it
    shows in one: the bucket alone, and with the 1, 3 and 7 before."""
    counts = np.round(rates * n)
    p = _baseline_rate(rates, n, config, ceiling)
    best = _tail_score(counts, n, p)
    for width in POOLED_BUCKETS:
        pooled_k = np.convolve(counts, np.ones(width))[:len(counts)]
        pooled_n = np.convolve(n, np.ones(width))[:len(n)]
        best = np.maximum(best, _tail_score(pooled_k, pooled_n, p))
    return best


def _rate_score_at(rates: np.ndarray, n: np.ndarray, i: int, p: float) -> float:
    """`_rate_scores` of bucket i alone, at baseline rate p."""
    counts = np.round(rates * n)
    widths = (1, *POOLED_BUCKETS)
    k = np.array([counts[max(0, i - w + 1):i + 1].sum() for w in widths])
    m = np.array([n[max(0, i - w + 1):i + 1].sum() for w in widths])
    return float(_tail_score(k, m, p).max())


def _mad(deviations: np.ndarray) -> float:
    """Median absolute deviation, scaled to a normal standard deviation: robust to up to half the values
    being anomalous (an inter-quartile range breaks down at a quarter, and faults can last longer)."""
    return float(np.median(np.abs(deviations)) * 1.4826)


def _baselines(table: pd.DataFrame, scope: str, key: str,
               metrics: dict[str, tuple[str, str, str]] = METRICS) -> dict[str, float]:
    part = table[table[scope] == key]
    out = {}
    for metric, (_, kind, _) in metrics.items():
        if kind == "latency":
            values = part.loc[part[f"{metric}_n"] >= 1, metric]
            out[metric] = float(np.exp(np.median(values)) / 1e6) if len(values) else float("nan")
        else:
            out[metric] = float(np.median(part[metric])) if len(part) else float("nan")
    return out


def _request_values(requests: pd.DataFrame, metric: str,
                    metrics: dict[str, tuple[str, str, str]] = METRICS) -> np.ndarray:
    column, kind, _ = metrics[metric]
    values = requests[column].to_numpy(dtype=float)
    if kind == "latency":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(values > 0, np.log(values), np.nan)
    return values


def _refine(rows: pd.DataFrame, metric: str, lo_ns: int, hi_ns: int, rising: bool,
            metrics: dict[str, tuple[str, str, str]] = METRICS) -> int | None:
    """Arrival time of the first request after the change-point in [lo_ns, hi_ns)."""
    window = rows[(rows["arrival_ns"] >= lo_ns) & (rows["arrival_ns"] < hi_ns)]
    values = _request_values(window, metric, metrics)
    keep = np.isfinite(values)
    times = window["arrival_ns"].to_numpy()[keep]
    at = mean_shift(values[keep], rising)
    return None if at is None else int(times[at])


def _runs(buckets: np.ndarray, gap: int, min_buckets: int) -> list[tuple[int, int, int]]:
    """(first, last, count) of runs of anomalous bucket indices, gaps up to `gap` merged."""
    runs: list[tuple[int, int, int]] = []
    for b in buckets:
        if runs and b - runs[-1][1] <= gap:
            first, _, count = runs[-1]
            runs[-1] = (first, int(b), count + 1)
        else:
            runs.append((int(b), int(b), 1))
    return [r for r in runs if r[2] >= min_buckets]


def _series_anomalies(requests: pd.DataFrame, table: pd.DataFrame, scope: str, start_ns: int, bucket_ns: int,
                      config: DetectionConfig,
                      metrics: dict[str, tuple[str, str, str]] = METRICS) -> list[SeriesAnomaly]:
    score_columns = [f"{m}_score" for m in metrics]
    scores = table[score_columns].to_numpy(dtype=float)
    worst = np.nanmax(np.where(np.isfinite(scores), scores, -np.inf), axis=1)
    table = table.assign(worst=worst)
    gap = max(round(config.merge_gap_s * 1e9 / bucket_ns), 1)
    anomalies = []
    for key, part in table.groupby(scope, sort=True):
        hot = part[part["worst"] >= config.threshold]
        if hot.empty:
            continue
        rows = requests[requests[scope] == key]
        baselines = _baselines(table, scope, str(key), metrics)
        for first, last, count in _runs(hot["bucket"].to_numpy(), gap, config.min_buckets):
            run = part[(part["bucket"] >= first) & (part["bucket"] <= last)]
            totals = {m: float(np.nansum(np.clip(run[f"{m}_score"].to_numpy(dtype=float) - config.threshold, 0, None)))
                      for m in metrics}
            dominant = max(totals, key=lambda m: totals[m])
            if metrics[dominant][1] == "rate":
                # a rate pooled over the buckets before stays high after its events stopped: the anomaly ends
                # with the last bucket that had more of them than the baseline rate
                excess = run.loc[run[dominant].to_numpy(dtype=float) > baselines[dominant], "bucket"]
                if len(excess):
                    last = int(excess.max())
                # ... and begins with the first of the contiguous buckets above the baseline rate that the pooled
                # window which fired covered (a rare event shows in a pooled window a few buckets after it began)
                rates = part.set_index("bucket")[dominant]
                earliest = first - max(POOLED_BUCKETS) + 1
                while first - 1 >= earliest and first - 1 in rates.index and rates[first - 1] > baselines[dominant]:
                    first -= 1
            onset = start_ns + first * bucket_ns
            end = start_ns + (last + 1) * bucket_ns
            refined = _refine(rows, dominant, onset - 2 * bucket_ns, onset + bucket_ns, True, metrics)
            if refined is not None:
                onset = refined
            refined = _refine(rows, dominant, end - bucket_ns, end + 2 * bucket_ns, False, metrics)
            if refined is not None and refined > onset + bucket_ns:
                end = refined
            inside = rows[(rows["arrival_ns"] >= onset) & (rows["arrival_ns"] < end)]
            shifts = []
            for metric in sorted(metrics, key=lambda m: -totals[m]):
                peak = float(np.nanmax(run[f"{metric}_score"].to_numpy(dtype=float), initial=-np.inf))
                if peak < config.threshold:
                    continue
                values = _request_values(inside, metric, metrics)
                values = values[np.isfinite(values)]
                if not len(values):
                    continue
                latency = metrics[metric][1] == "latency"
                observed = float(np.exp(values.mean()) / 1e6) if latency else float(values.mean())
                shifts.append(MetricShift(metric, baselines[metric], observed, peak))
            if not shifts:
                continue
            anomalies.append(SeriesAnomaly(scope, str(key), int(onset), int(end), dominant,
                                           float(run["worst"].max()), int(count), tuple(shifts)))
    return anomalies


def _group(models: list[SeriesAnomaly], tenants: list[SeriesAnomaly], components: list[SeriesAnomaly],
           served: dict[str, tuple[str, ...]], config: DetectionConfig) -> list[Incident]:
    """Union of model and component anomalies that overlap in time with onsets within `stagger_s`. An incident's
    models are its model anomalies', or when it has none, those its components serve."""
    ordered = sorted(models + components, key=lambda a: a.onset_ns)
    parent = list(range(len(ordered)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    stagger = config.stagger_s * 1e9
    for i, a in enumerate(ordered):
        for j in range(i + 1, len(ordered)):
            b = ordered[j]
            if b.onset_ns - a.onset_ns > stagger:
                break
            if b.onset_ns < a.end_ns and a.onset_ns < b.end_ns:
                parent[find(j)] = find(i)
    groups: dict[int, list[SeriesAnomaly]] = {}
    for i, a in enumerate(ordered):
        groups.setdefault(find(i), []).append(a)
    incidents = []
    for members in groups.values():
        onset = min(a.onset_ns for a in members)
        end = max(a.end_ns for a in members)
        severity = sum(a.anomalous_buckets * np.log1p(a.peak_score / config.threshold) for a in members)
        attached = tuple(t for t in tenants if t.onset_ns < end and onset < t.end_ns)
        on_models = tuple(a for a in members if a.scope == "model")
        on_components = tuple(a for a in members if a.scope != "model")  # components' own calls, traffic
        keys = {a.key for a in on_models} or {m for a in on_components for m in served.get(a.key, ())}
        if not keys:
            continue
        incidents.append(Incident(0, onset, end, tuple(sorted(keys)), tuple(sorted({t.key for t in attached})),
                                  on_models, attached, float(severity), on_components))
    incidents.sort(key=lambda i: (-i.severity, i.onset_ns))
    return [replace(i, id=k + 1) for k, i in enumerate(incidents)]


def calls_by_component(paths: pd.DataFrame) -> pd.DataFrame:
    """Per call to a component instance (a `request_paths` row that is not an engine's): its arrival, its service
    time (latency less any wait for a worker; a global queue's whole hold), whether it failed and whether it
    rejected the request."""
    calls = paths[~paths["kind"].isin(ENGINE_KINDS)]
    latency = calls["latency_ns"].to_numpy(dtype=float)
    queue = calls["queue_ns"].to_numpy(dtype=float, na_value=np.nan) if "queue_ns" in calls else np.zeros(len(calls))
    outcome = calls["outcome"].to_numpy(dtype=object)
    return pd.DataFrame({"component": calls["instance"].to_numpy(dtype=object),
                         "arrival_ns": calls["start_ns"].to_numpy(),
                         "service_ns": latency - np.where(np.isfinite(queue), queue, 0.0),
                         "failed": np.isin(outcome, ["error", "timeout"]),
                         "rejected": outcome == "rejected"})


def _traffic_table(requests: pd.DataFrame, start_ns: int, bucket_ns: int, config: DetectionConfig) -> pd.DataFrame:
    """Per (tenant → model, bucket): everybody's first attempts (`n`) and the pair's share of them (`traffic`),
    scored as a rate against the pair's own buckets, and only where the share is at least MIN_TRAFFIC_FACTOR
    times its usual one (a binomial test alone calls a ×1.3 drift of a busy tenant significant)."""
    resend = pd.to_numeric(requests["resend_count"], errors="coerce").fillna(0).to_numpy()
    first = requests[(resend == 0) & requests["tenant"].notna().to_numpy() & requests["model"].notna().to_numpy()]
    bucket = (first["arrival_ns"].to_numpy() - start_ns) // bucket_ns
    total = pd.Series(bucket).value_counts().sort_index()
    pairs = pd.DataFrame({"traffic": first["tenant"].astype(str).to_numpy() + " → " + first["model"].astype(str)
                          .to_numpy(), "bucket": bucket}).value_counts().rename("k").reset_index()
    rows = []
    for key, part in pairs.groupby("traffic"):
        k = part.set_index("bucket")["k"].reindex(total.index, fill_value=0).to_numpy(dtype=float)
        n = total.to_numpy(dtype=float)
        share = k / n
        if len(share) < 4:
            continue
        scores = _trailing_scores(share, n, "share", config)
        usual = _baseline_rate(share, n, config, ceiling=1.0)
        scores = np.where(share >= MIN_TRAFFIC_FACTOR * usual, scores, 0.0)
        rows.append(pd.DataFrame({"traffic": key, "bucket": total.index.to_numpy(), "n": n, "traffic_count": k,
                                  "traffic_share": share, "traffic_score": scores}))
    columns = ["traffic", "bucket", "n", "traffic_count", "traffic_share", "traffic_score"]
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=columns)


def _traffic_anomalies(table: pd.DataFrame, start_ns: int, bucket_ns: int,
                       config: DetectionConfig) -> list[SeriesAnomaly]:
    """Runs of a tenant → model pair's buckets whose traffic share scored above the threshold (as `_runs` groups
    any series' buckets), from the first to the last bucket of the run above twice the usual share."""
    gap = max(round(config.merge_gap_s * 1e9 / bucket_ns), 1)
    found = []
    for key, part in table.groupby("traffic", sort=True):
        hot = part[part["traffic_score"].to_numpy(dtype=float) >= config.threshold]
        if hot.empty:
            continue
        n, k = part["n"].to_numpy(dtype=float), part["traffic_count"].to_numpy(dtype=float)
        usual = _baseline_rate(part["traffic_share"].to_numpy(dtype=float), n, config, ceiling=1.0)
        high = part["traffic_share"].to_numpy(dtype=float) >= MIN_TRAFFIC_FACTOR * usual
        buckets = part["bucket"].to_numpy()
        surging = set(buckets[high].tolist())
        for first, last, count in _runs(hot["bucket"].to_numpy(), gap, config.min_buckets):
            earliest = first - max(POOLED_BUCKETS) + 1  # a pooled window fires a few buckets after the rise began
            while first - 1 >= earliest and first - 1 in surging:
                first -= 1
            inside = (buckets >= first) & (buckets <= last)
            observed = float(k[inside].sum() / max(n[inside].sum(), 1.0))
            peak = float(part["traffic_score"].to_numpy(dtype=float)[inside].max())
            found.append(SeriesAnomaly("traffic", str(key), start_ns + int(first) * bucket_ns,
                                       start_ns + int(last + 1) * bucket_ns, "traffic", peak, int(count),
                                       (MetricShift("traffic", usual, observed, peak),)))
    return found


def _heatmap(table: pd.DataFrame, scope: str, start_ns: int, bucket_ns: int,
             metrics: dict[str, tuple[str, str, str]]) -> list[BucketScore]:
    scores = table[[f"{m}_score" for m in metrics]].to_numpy(dtype=float)
    filled = np.where(np.isfinite(scores), scores, -np.inf)
    best = np.argmax(filled, axis=1)
    names = list(metrics)
    cells = []
    for (key, bucket, n), b, row in zip(table[[scope, "bucket", "n"]].itertuples(index=False), best, filled,
                                        strict=True):
        value = row[b]
        cells.append(BucketScore(scope, str(key), start_ns + int(bucket) * bucket_ns,
                                 float(value) if np.isfinite(value) else 0.0, names[b], int(n)))
    return cells


def detect_in_requests(requests: pd.DataFrame, config: DetectionConfig | None = None,
                       paths: pd.DataFrame | None = None) -> AnomalyReport:
    """Anomalies and incidents in `request_outcomes` rows (see `load_requests`), and, given `request_paths` rows,
    in each component instance's own calls."""
    config = config or DetectionConfig()
    bucket_ns = int(config.bucket_s * 1e9)
    if requests.empty:
        return AnomalyReport(0, 0, config, 0, (), (), ())
    start_ns = int(requests["arrival_ns"].min())
    end_ns = int(requests["end_ns"].max())
    found: dict[str, list[SeriesAnomaly]] = {"component": []}
    heatmap: list[BucketScore] = []
    series = [(scope, requests, METRICS) for scope in SCOPES]
    served: dict[str, tuple[str, ...]] = {}
    unchecked: tuple[Unchecked, ...] = ()
    if paths is not None and len(paths):
        calls = calls_by_component(paths)
        series.append(("component", calls, COMPONENT_METRICS))
        known = paths.dropna(subset=["instance", "model"])
        served = {str(i): tuple(sorted(part.unique())) for i, part in known.groupby("instance")["model"]}
    for scope, rows, metrics in series:
        table = _bucket_table(rows, scope, start_ns, bucket_ns, config, metrics)
        found[scope] = _series_anomalies(rows, table, scope, start_ns, bucket_ns, config, metrics)
        if scope == "model":
            unchecked = _unchecked(rows, table, config)
        heatmap += _heatmap(table, scope, start_ns, bucket_ns, metrics)
    found["traffic"] = _traffic_anomalies(_traffic_table(requests, start_ns, bucket_ns, config), start_ns,
                                          bucket_ns, config)
    served.update({a.key: (a.key.split(" → ", 1)[1],) for a in found["traffic"]})
    incidents = _group(found["model"], found["tenant"], found["component"] + found["traffic"], served, config)
    anomalies = tuple(sorted(found["model"] + found["tenant"] + found["component"] + found["traffic"],
                             key=lambda a: (a.onset_ns, a.scope, a.key)))
    return AnomalyReport(start_ns, end_ns, config, len(requests), anomalies, tuple(incidents), tuple(heatmap),
                         unchecked)


def detect_anomalies(store: Store, config: DetectionConfig | None = None) -> AnomalyReport:
    """Anomalies per model, tenant and component instance, and the incidents they form, over everything in the
    store."""
    return detect_in_requests(load_requests(store), config, load_paths(store))


# ------------------------------------------------------------------------------ request-level flags
def request_scores(requests: pd.DataFrame, windows: list[tuple[int, int]],
                   config: DetectionConfig | None = None, baseline: np.ndarray | None = None) -> pd.DataFrame:
    """Per request: whether it is anomalous and why. Failed, rate-limited and truncated requests are; so is a
    request whose TTFT or decode time per token scores at least `request_threshold` against its model's
    baseline requests: those marked in `baseline`, else those outside every window in `windows`. Columns:
    anomalous, reason, score (the largest robust latency score), slowest (its metric: ttft or tpot)."""
    config = config or DetectionConfig()
    arrival = requests["arrival_ns"].to_numpy()
    outside = np.ones(len(requests), dtype=bool)
    for lo, hi in windows:
        outside &= ~((arrival >= lo) & (arrival < hi))
    if baseline is not None:
        outside = baseline
    score = np.zeros(len(requests))
    reason = np.full(len(requests), "", dtype=object)
    models = requests["model"].to_numpy()
    for metric in ("ttft", "tpot"):
        values = _request_values(requests, metric)
        z = np.full(len(requests), np.nan)
        for model in pd.unique(models):
            mine = models == model
            base = values[mine & outside & np.isfinite(values)]
            if len(base) < 10:
                base = values[mine & np.isfinite(values)]
            if len(base) < 10:
                continue
            q1, median, q3 = np.quantile(base, [0.25, 0.5, 0.75])
            scale = max((q3 - q1) / 1.349, config.latency_scale_floor)
            z[mine] = (values[mine] - median) / scale
        better = np.isfinite(z) & (z > score)
        score = np.where(better, z, score)
        reason = np.where(better, metric, reason)
    slowest = reason.copy()  # the latency metric that scored highest, anomalous or not
    anomalous = score >= config.request_threshold
    for flag, why in (("truncated", "truncated"), ("rejected", "rate_limited"), ("failed", "error")):
        hit = requests[flag].to_numpy(dtype=bool)
        anomalous |= hit
        reason = np.where(hit, why, reason)
    reason = np.where(anomalous, reason, "")
    return pd.DataFrame({"anomalous": anomalous, "reason": reason, "score": score, "slowest": slowest},
                        index=requests.index)


# ----------------------------------------------------------------------------------------- wording
def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%H:%M:%S")
