"""TTFT decomposition and prefill scaling.

Time to first token is gateway (auth, rate limit, route, global queue) + engine queue + prefill (its own
chunks' steps, and the waits between chunks behind other prefills), and when prefill and decode are
disaggregated + KV transfer + the decode worker's queue + its first decode step (each from its own leg).
`analyze_ttft(store)` reports, per model, the median share of each component and the one that dominates, per
model and time bucket the TTFT p50/p99, and per engine a fit of prefill compute time against the uncached
prompt tokens n over c cached ones (scipy, non-negative, robust loss):

    t ≈ a + b·n + q·(n·c + n²/2)        (linear layers; attention's quadratic term)

with the effective prefill throughput (uncached tokens per second of prefill compute).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from infertrace.analyzers import materialize_once, query_text
from infertrace.analyzers.disaggregation import DisaggregationAnalysis, analyze_disaggregation
from infertrace.store.store import Store

COMPONENTS = ("gateway_ns", "queue_ns", "prefill_compute_ns", "prefill_wait_ns", "kv_transfer_ns", "decode_queue_ns",
              "first_decode_ns")


@dataclass(frozen=True)
class PrefillFit:
    instance: str
    model: str | None
    requests: int
    intercept_ns: float  # a
    ns_per_token: float  # b
    ns_per_attention_pair: float  # q
    tokens_per_s: float  # Σ uncached tokens / Σ prefill compute time
    median_relative_error: float

    def predict_ns(self, uncached: np.ndarray, cached: np.ndarray) -> np.ndarray:
        return self.intercept_ns + self.ns_per_token * uncached + self.ns_per_attention_pair * (
            uncached * cached + uncached * uncached / 2)


@dataclass(frozen=True)
class TtftBreakdown:
    model: str
    requests: int
    ttft_p50_ns: int
    ttft_p99_ns: int  # as the client saw it (from the gateway when there is one)
    shares: dict[str, float | None]  # component → share of the summed TTFT; None: not measured (see
    # `_component_totals`); `prefill` (the whole prefill, not split into compute and wait) only where requests
    # have no step spans
    dominant: str


@dataclass(frozen=True)
class TtftBucket:
    model: str
    start_ns: int
    requests: int
    ttft_p50_ns: int
    ttft_p99_ns: int


@dataclass(frozen=True)
class TtftAnalysis:
    models: tuple[TtftBreakdown, ...]
    fits: tuple[PrefillFit, ...]
    buckets: tuple[TtftBucket, ...]
    disaggregation: DisaggregationAnalysis  # P/D models' transfer and legs; GPU prefill host for CPU-only hosts


def fit_prefill(instance: str, model: str | None, uncached: np.ndarray, cached: np.ndarray,
                compute_ns: np.ndarray) -> PrefillFit | None:
    if len(uncached) < 4:
        return None
    n, c, y = (np.asarray(x, dtype=np.float64) for x in (uncached, cached, compute_ns))
    pairs = n * c + n * n / 2
    scale = np.array([max(float(np.median(y)), 1.0), max(float(np.median(y / np.maximum(n, 1))), 1e-9),
                      max(float(np.median(y / np.maximum(pairs, 1))), 1e-12)])

    def residual(theta: np.ndarray) -> np.ndarray:
        a, b, q = theta * scale
        return (a + b * n + q * pairs - y) / np.maximum(y, 1.0)

    fit = least_squares(residual, x0=np.array([0.1, 0.5, 0.1]), bounds=(0, np.inf), loss="soft_l1")
    a, b, q = fit.x * scale
    rel = float(np.median(np.abs(residual(fit.x))))
    return PrefillFit(instance, model, len(n), float(a), float(b), float(q), float(n.sum() / y.sum() * 1e9), rel)


def _component_totals(rows: pd.DataFrame) -> dict[str, float | None]:
    """Summed time per component over a model's requests; None for a component none of them measured (no
    gateway span: gateway; no step spans: the prefill's split, its whole then under `prefill_ns`), so that an
    unmeasured share is not read as none. A colocated request has no KV transfer or decode leg: 0, not None."""
    def total(values: pd.Series) -> float:
        return float(values.fillna(0).clip(lower=0).sum())

    colocated = rows["serving"] != "disaggregated"
    totals: dict[str, float | None] = {}
    for c in COMPONENTS:
        measured = rows["prefill_compute_ns" if c == "prefill_wait_ns" else c].notna()
        if c in ("kv_transfer_ns", "decode_queue_ns", "first_decode_ns"):
            measured |= colocated
        totals[c] = total(rows.loc[measured, c]) if measured.any() else None
    unsplit = rows["prefill_compute_ns"].isna()  # request spans only: the prefill is one piece
    if unsplit.any():
        totals["prefill_ns"] = total(rows.loc[unsplit, "prefill_ns"])
    return totals


def analyze_ttft(store: Store, bucket_s: float = 60.0) -> TtftAnalysis:
    materialize_once(store, ("steps", "step_membership", "requests"))
    df = store.sql(query_text("ttft_components")).df()
    models = []
    for model, rows in df.groupby("model", sort=True):
        totals = _component_totals(rows)
        whole = sum(v for v in totals.values() if v is not None) or 1.0
        shares = {c.removesuffix("_ns"): None if v is None else round(v / whole, 4) for c, v in totals.items()}
        ttft = rows["client_ttft_ns"].to_numpy(dtype=np.float64)
        known = {k: v for k, v in shares.items() if v is not None}
        models.append(TtftBreakdown(str(model), len(rows), int(np.percentile(ttft, 50)), int(np.percentile(ttft, 99)),
                                    shares, max(known, key=lambda k: known[k])))
    fits = []
    alone = df[(df["preemptions"] == 0) & df["prefill_compute_ns"].notna()]
    for instance, rows in alone.groupby("instance", sort=True):
        cached = rows["cached_tokens"].fillna(0).to_numpy()
        uncached = rows["input_tokens"].to_numpy() - cached
        fit = fit_prefill(str(instance), str(rows["model"].iloc[0]), uncached, cached,
                          rows["prefill_compute_ns"].to_numpy())
        if fit is not None:
            fits.append(fit)
    buckets = []
    if len(df):
        width = round(bucket_s * 1e9)
        df = df.assign(bucket=(df["arrival_ns"] // width) * width)
        grouped = df.groupby(["model", "bucket"], sort=True)["client_ttft_ns"]
        stats = pd.DataFrame({"n": grouped.size(), "p50": grouped.quantile(0.5), "p99": grouped.quantile(0.99)})
        buckets = [TtftBucket(str(m), int(b), int(r.n), int(r.p50), int(r.p99)) for (m, b), r in stats.iterrows()]
    return TtftAnalysis(tuple(models), tuple(fits), tuple(buckets), analyze_disaggregation(store))
