"""Change-points: when a signal started to move.

- `mean_shift`: the single least-squares mean shift in a sequence (one step of binary segmentation): where a
  step change happened.
- `trend_onset`: where a rise started when it may be a ramp rather than a step. The signal (binned, weighted by
  each bin's count) is fitted by least squares with a continuous piecewise-linear trend, flat, then rising
  linearly, then flat again: y = a + b · clip(t − τ1, 0, τ2 − τ1). τ1 is the onset; τ2 = τ1 + one bin is a
  step. This is the "continuous linear" cost of change-point libraries (ruptures' `clinear`) with two
  breakpoints, solved exactly by trying every pair. A component that slows ×3 over five minutes crosses an
  anomaly threshold minutes after it started; a mean-shift split then dates it to the middle of the ramp, the
  trend fit to its start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def mean_shift(values: np.ndarray, rising: bool = True) -> int | None:
    """Index of the first value after the single least-squares mean shift in `values` (one step of binary
    segmentation); None when no split raises (rising) or lowers (not rising) the mean."""
    n = len(values)
    if n < 2:
        return None
    cumulative = np.cumsum(values)
    total = cumulative[-1]
    k = np.arange(1, n)
    left_mean = cumulative[:-1] / k
    right_mean = (total - cumulative[:-1]) / (n - k)
    gain = k * (n - k) / n * (left_mean - right_mean) ** 2
    direction = right_mean > left_mean if rising else right_mean < left_mean
    gain = np.where(direction, gain, -1.0)
    best = int(np.argmax(gain))
    return best + 1 if gain[best] > 0 else None


MAX_BINS = 200


@dataclass(frozen=True)
class TrendOnset:
    onset_ns: int  # where the rise starts (τ1)
    full_ns: int  # where it stops rising (τ2): onset + one bin for a step
    rise: float  # b · (τ2 − τ1): how far the signal rose, in its own unit
    gain: float  # share of the flat fit's squared error the trend removes

    @property
    def is_ramp(self) -> bool:
        return self.full_ns - self.onset_ns > 0


def trend_onset(times_ns: np.ndarray, values: np.ndarray, lo_ns: int, hi_ns: int, bin_s: float = 5.0,
                min_per_bin: int = 1) -> TrendOnset | None:
    """The start of the rise in `values` (observed at `times_ns`) between lo_ns and hi_ns, fitted as flat →
    linear rise → flat (module docstring); None when there are too few bins or no rise."""
    keep = (times_ns >= lo_ns) & (times_ns < hi_ns) & np.isfinite(values)
    if keep.sum() < 20:
        return None
    width = int(max(bin_s, (hi_ns - lo_ns) / 1e9 / MAX_BINS) * 1e9)  # the fit tries every pair of bins
    index = (times_ns[keep] - lo_ns) // width
    nbins = int((hi_ns - lo_ns) // width) + 1
    n = np.bincount(index, minlength=nbins).astype(float)
    sums = np.bincount(index, weights=values[keep], minlength=nbins)
    ok = n >= min_per_bin
    if ok.sum() < 6:
        return None
    t = np.arange(nbins, dtype=float)[ok]
    w, y = n[ok], sums[ok] / n[ok]
    knots = np.arange(nbins + 1, dtype=float)  # candidate τ in bin units (bin k starts at k)
    sw, swy = w.sum(), (w * y).sum()
    flat = (w * (y - swy / sw) ** 2).sum()
    if flat <= 0:
        return None
    best = (np.inf, 0.0, 0.0, 0.0)
    for k1 in range(len(knots) - 1):
        tau1 = knots[k1]
        tau2 = knots[k1 + 1:]
        x = np.clip(t[None, :] - tau1, 0.0, (tau2 - tau1)[:, None]) / (tau2 - tau1)[:, None]  # 0 → 1 over the ramp
        swx = (w * x).sum(axis=1)
        swxx = (w * x * x).sum(axis=1)
        swxy = (w * x * y).sum(axis=1)
        var = swxx - swx * swx / sw
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.where(var > 1e-12, (swxy - swx * swy / sw) / var, 0.0)
        sse = flat - b * (swxy - swx * swy / sw)
        sse = np.where(b > 0, sse, np.inf)
        j = int(np.argmin(sse))
        if sse[j] < best[0]:
            best = (float(sse[j]), tau1, float(tau2[j]), float(b[j]))
    sse, tau1, tau2, rise = best
    if not np.isfinite(sse) or rise <= 0:
        return None
    onset = _refine(times_ns[keep], values[keep], lo_ns + int(tau1 * width), int((tau2 - tau1) * width), width)
    return TrendOnset(onset, onset + int((tau2 - tau1) * width), rise, 1.0 - sse / flat)


def _refine(t: np.ndarray, y: np.ndarray, onset: int, length: int, width: int) -> int:
    """The onset at the resolution of the observations: within a bin of the binned fit's, the time that best
    fits the same shape (a step when the fitted ramp is one bin long) to the raw values around it."""
    near = (t >= onset - 2 * width) & (t < onset + length + 3 * width)
    t, y = t[near], y[near]
    candidates = t[(t >= onset - width) & (t <= onset + width)]
    if len(candidates) < 2 or len(t) < 10:
        return onset
    ramp = max(length, 1) if length > width else 1
    x = np.clip((t[None, :] - candidates[:, None]) / ramp, 0.0, 1.0)
    xm = x.mean(axis=1, keepdims=True)
    ym = y.mean()
    var = ((x - xm) ** 2).sum(axis=1)
    cov = ((x - xm) * (y - ym)).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        sse = np.where(var > 0, ((y - ym) ** 2).sum() - cov ** 2 / var, np.inf)
    sse = np.where(cov > 0, sse, np.inf)
    return int(candidates[int(np.argmin(sse))]) if np.isfinite(sse).any() else onset
