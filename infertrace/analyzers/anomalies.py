"""Multi-model anomaly detection: per model and per tenant, per time bucket, robust scores of TTFT, decode
time per token, E2E latency, error rate, 429 rate and truncation rate; onset and end of each anomaly by
change-point; anomalies on several models that overlap in time grouped into incidents.

Scores are robust, as BARO's are: each series' buckets are compared with that series' own median and
median absolute deviation (MAD) over the whole period, so a fault shorter than half the period cannot hide
itself in the baseline (BARO's inter-quartile range breaks down when a fault covers a quarter of it).
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

from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pandas as pd
from scipy.stats import binom, norm

from infertrace.analyzers import query_text
from infertrace.analyzers.changepoint import mean_shift
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
SCOPES = ("model", "tenant")
POOLED_BUCKETS = (2, 4, 8)  # a rate is also scored over this many trailing buckets together


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
        return METRICS[self.metric][1] == "rate"

    def phrase(self) -> str:
        what = METRICS[self.metric][2]
        if self.is_rate:
            return f"{what} {self.baseline:.1%} → {self.observed:.1%}"
        return f"{what} {_ms(self.baseline)} → {_ms(self.observed)}"


@dataclass(frozen=True)
class SeriesAnomaly:
    """A model (or tenant) whose metrics departed from its own baseline between onset and end."""

    scope: str  # "model" or "tenant"
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
    """Model anomalies that overlap in time, with the tenants anomalous meanwhile."""

    id: int
    onset_ns: int
    end_ns: int
    models: tuple[str, ...]
    tenants: tuple[str, ...]
    anomalies: tuple[SeriesAnomaly, ...]  # model anomalies, by onset
    tenant_anomalies: tuple[SeriesAnomaly, ...]
    severity: float  # anomalous model-buckets, weighted by how far over the threshold they scored

    def sentence(self) -> str:
        models = ", ".join(self.models)
        lead = min(self.anomalies, key=lambda a: a.onset_ns)
        stagger = max(a.onset_ns for a in self.anomalies) - lead.onset_ns
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
class AnomalyReport:
    start_ns: int
    end_ns: int
    config: DetectionConfig
    requests: int
    anomalies: tuple[SeriesAnomaly, ...]  # model and tenant anomalies, by onset
    incidents: tuple[Incident, ...]  # by severity, worst first
    heatmap: tuple[BucketScore, ...] = field(repr=False)

    def model_anomalies(self) -> tuple[SeriesAnomaly, ...]:
        return tuple(a for a in self.anomalies if a.scope == "model")


# ---------------------------------------------------------------------------------------- loading
def load_requests(store: Store) -> pd.DataFrame:
    """The `request_outcomes` rows, ordered by arrival."""
    frame = store.sql(query_text("request_outcomes")).df()
    for column in ("failed", "rejected", "truncated"):
        frame[column] = frame[column].fillna(False).astype(bool)
    return frame


# --------------------------------------------------------------------------------------- scoring
def _bucket_table(requests: pd.DataFrame, scope: str, start_ns: int, bucket_ns: int,
                  config: DetectionConfig) -> pd.DataFrame:
    """Per (key, bucket): request count and, per metric, the bucket statistic (mean log latency in ns, or
    rate) and its robust score against the key's own buckets."""
    frame = requests[[scope, "arrival_ns"]].copy()
    frame["bucket"] = (requests["arrival_ns"].to_numpy() - start_ns) // bucket_ns
    stats = {"n": (scope, "size")}
    for metric, (column, kind, _) in METRICS.items():
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
    for metric in METRICS:
        table[f"{metric}_score"] = np.nan
    for _, idx in table.groupby(scope).groups.items():
        part = table.loc[idx]
        for metric, (_, kind, _) in METRICS.items():
            if kind == "latency":
                ok = part[f"{metric}_n"] >= config.min_requests
                values = part.loc[ok, metric]
                if len(values) < 4:
                    continue
                median = float(np.median(values))
                scale = max(_mad(values.to_numpy() - median), config.latency_scale_floor)
                table.loc[values.index, f"{metric}_score"] = (values - median) / scale
            else:
                rates = part[metric]
                if len(rates) < 4:
                    continue
                table.loc[part.index, f"{metric}_score"] = _rate_scores(rates.to_numpy(dtype=float),
                                                                        part["n"].to_numpy(dtype=float), config)
    return table


def _rate_scores(rates: np.ndarray, n: np.ndarray, config: DetectionConfig) -> np.ndarray:
    """Per bucket, the binomial upper tail of its count under the series' baseline rate, as a normal score
    (exact for the small counts that a rare event gives). The baseline rate is the larger of the median
    bucket rate and the pooled rate of the buckets at or below it, smoothed by one event in the pooled
    count (so a series that never failed still has a finite, small rate)."""
    counts = np.round(rates * n)
    median = float(np.median(rates))
    low = rates <= median
    pooled = (counts[low].sum() + 1.0) / (n[low].sum() + 2.0)
    p = min(max(median, pooled, config.rate_floor), 0.5)

    def score(k: np.ndarray, m: np.ndarray) -> np.ndarray:
        tail = binom.sf(k - 1, m, p)  # P(K >= k)
        return np.where(k > m * p, np.minimum(norm.isf(np.clip(tail, 1e-300, 1.0)), 40.0), 0.0)

    # A rare event spread thinly over a long fault (a component failing a few percent of its calls) shows in
    # buckets pooled over a few minutes before it shows in one: the bucket alone, and with the 1, 3 and 7 before.
    best = score(counts, n)
    for width in POOLED_BUCKETS:
        pooled_k = np.convolve(counts, np.ones(width))[:len(counts)]
        pooled_n = np.convolve(n, np.ones(width))[:len(n)]
        best = np.maximum(best, score(pooled_k, pooled_n))
    return best


def _mad(deviations: np.ndarray) -> float:
    """Median absolute deviation, scaled to a normal standard deviation: robust to up to half the values
    being anomalous (an inter-quartile range breaks down at a quarter, and faults can last longer)."""
    return float(np.median(np.abs(deviations)) * 1.4826)


def _baselines(table: pd.DataFrame, scope: str, key: str) -> dict[str, float]:
    part = table[table[scope] == key]
    out = {}
    for metric, (_, kind, _) in METRICS.items():
        if kind == "latency":
            values = part.loc[part[f"{metric}_n"] >= 1, metric]
            out[metric] = float(np.exp(np.median(values)) / 1e6) if len(values) else float("nan")
        else:
            out[metric] = float(np.median(part[metric])) if len(part) else float("nan")
    return out


def _request_values(requests: pd.DataFrame, metric: str) -> np.ndarray:
    column, kind, _ = METRICS[metric]
    values = requests[column].to_numpy(dtype=float)
    if kind == "latency":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(values > 0, np.log(values), np.nan)
    return values


def _refine(rows: pd.DataFrame, metric: str, lo_ns: int, hi_ns: int, rising: bool) -> int | None:
    """Arrival time of the first request after the change-point in [lo_ns, hi_ns)."""
    window = rows[(rows["arrival_ns"] >= lo_ns) & (rows["arrival_ns"] < hi_ns)]
    values = _request_values(window, metric)
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
                      config: DetectionConfig) -> list[SeriesAnomaly]:
    score_columns = [f"{m}_score" for m in METRICS]
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
        baselines = _baselines(table, scope, str(key))
        for first, last, count in _runs(hot["bucket"].to_numpy(), gap, config.min_buckets):
            run = part[(part["bucket"] >= first) & (part["bucket"] <= last)]
            totals = {m: float(np.nansum(np.clip(run[f"{m}_score"].to_numpy(dtype=float) - config.threshold, 0, None)))
                      for m in METRICS}
            dominant = max(totals, key=lambda m: totals[m])
            if METRICS[dominant][1] == "rate":
                # a rate pooled over the buckets before stays high after its events stopped: the anomaly ends
                # with the last bucket that had more of them than the baseline rate
                excess = run.loc[run[dominant].to_numpy(dtype=float) > baselines[dominant], "bucket"]
                if len(excess):
                    last = int(excess.max())
            onset = start_ns + first * bucket_ns
            end = start_ns + (last + 1) * bucket_ns
            refined = _refine(rows, dominant, onset - 2 * bucket_ns, onset + bucket_ns, rising=True)
            if refined is not None:
                onset = refined
            refined = _refine(rows, dominant, end - bucket_ns, end + 2 * bucket_ns, rising=False)
            if refined is not None and refined > onset + bucket_ns:
                end = refined
            inside = rows[(rows["arrival_ns"] >= onset) & (rows["arrival_ns"] < end)]
            shifts = []
            for metric in sorted(METRICS, key=lambda m: -totals[m]):
                peak = float(np.nanmax(run[f"{metric}_score"].to_numpy(dtype=float), initial=-np.inf))
                if peak < config.threshold:
                    continue
                values = _request_values(inside, metric)
                values = values[np.isfinite(values)]
                if not len(values):
                    continue
                latency = METRICS[metric][1] == "latency"
                observed = float(np.exp(values.mean()) / 1e6) if latency else float(values.mean())
                shifts.append(MetricShift(metric, baselines[metric], observed, peak))
            if not shifts:
                continue
            anomalies.append(SeriesAnomaly(scope, str(key), int(onset), int(end), dominant,
                                           float(run["worst"].max()), int(count), tuple(shifts)))
    return anomalies


def _group(models: list[SeriesAnomaly], tenants: list[SeriesAnomaly], config: DetectionConfig) -> list[Incident]:
    """Union of model anomalies that overlap in time with onsets within `stagger_s`."""
    ordered = sorted(models, key=lambda a: a.onset_ns)
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
        incidents.append(Incident(0, onset, end, tuple(sorted({a.key for a in members})),
                                  tuple(sorted({t.key for t in attached})), tuple(members), attached,
                                  float(severity)))
    incidents.sort(key=lambda i: (-i.severity, i.onset_ns))
    return [Incident(k + 1, *(getattr(i, f) for f in ("onset_ns", "end_ns", "models", "tenants", "anomalies",
                                                      "tenant_anomalies", "severity")))
            for k, i in enumerate(incidents)]


def detect_in_requests(requests: pd.DataFrame, config: DetectionConfig | None = None) -> AnomalyReport:
    """Anomalies and incidents in `request_outcomes` rows (see `load_requests`)."""
    config = config or DetectionConfig()
    bucket_ns = int(config.bucket_s * 1e9)
    if requests.empty:
        return AnomalyReport(0, 0, config, 0, (), (), ())
    start_ns = int(requests["arrival_ns"].min())
    end_ns = int(requests["end_ns"].max())
    found: dict[str, list[SeriesAnomaly]] = {}
    heatmap: list[BucketScore] = []
    for scope in SCOPES:
        table = _bucket_table(requests, scope, start_ns, bucket_ns, config)
        found[scope] = _series_anomalies(requests, table, scope, start_ns, bucket_ns, config)
        score_columns = [f"{m}_score" for m in METRICS]
        scores = table[score_columns].to_numpy(dtype=float)
        filled = np.where(np.isfinite(scores), scores, -np.inf)
        best = np.argmax(filled, axis=1)
        names = list(METRICS)
        for (key, bucket, n), b, row in zip(table[[scope, "bucket", "n"]].itertuples(index=False), best, filled,
                                            strict=True):
            value = row[b]
            heatmap.append(BucketScore(scope, str(key), start_ns + int(bucket) * bucket_ns,
                                       float(value) if np.isfinite(value) else 0.0, names[b], int(n)))
    incidents = _group(found["model"], found["tenant"], config)
    anomalies = tuple(sorted(found["model"] + found["tenant"], key=lambda a: (a.onset_ns, a.scope, a.key)))
    return AnomalyReport(start_ns, end_ns, config, len(requests), anomalies, tuple(incidents), tuple(heatmap))


def detect_anomalies(store: Store, config: DetectionConfig | None = None) -> AnomalyReport:
    """Anomalies per model and tenant, and the incidents they form, over everything in the store."""
    return detect_in_requests(load_requests(store), config)


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


def _ms(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    if value >= 10:
        return f"{value:.0f} ms"
    return f"{value:.2f} ms"
