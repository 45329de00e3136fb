"""What a candidate cause's own telemetry says: did its own behaviour change between a baseline (before the
incident's first deviation) and the incident's window? Each `Signal` is one measurement with an effect size
and a p-value; root-cause ranking (`rca.py`) uses the significant ones.

- **Service time** (latency less any wait for a worker) of a component's calls, and a KV link's transfers: the
  effect is 2·AUC − 1, where AUC is the probability that a call during the window took longer than one before
  (Mann–Whitney U, one-sided, gives the p-value). A rank effect sees a ×2 shift under jitter that puts only a few
  percent of calls above a tail threshold, and is not moved by a handful of outliers.
- **Wait** for a free worker (`infertrace.component.queue_ns`), a global queue's hold, an engine's own queue: the
  same statistic. A wait is a consequence (of the component's own service time, of its load, or of what is
  downstream of a queue); the ranking decides which (`rca.py`).
- **Errors, timeouts, rejections** of a component's calls: the binomial upper tail of the window's count under
  the baseline's rate (smoothed by one event: a component that never failed still has a small rate), exact for
  the rare events a partial failure gives. The effect is the rise in their share.
- **Step time for the work** of a model's engines: each step's duration over a least-squares fit of duration to
  its work (prefill tokens, linear and quadratic, decode tokens, context) on the baseline steps of the same
  instance; the effect is the rank effect of that ratio. A burst of requests makes steps larger, not slower for
  their size; a regression makes the same work slower. Without step spans (vLLM's request spans only), the
  engines' own TTFT and decode time per token stand in.
- **Traffic** of a tenant: its first attempts (retries excluded, `http.request.resend_count`) as a share of all
  first attempts, window against baseline (a binomial test, conditional on the total: a diurnal rise of
  everybody's traffic cancels). The factor is its rate's rise relative to the others'.
- **Work** a tenant gives a prefill pool: its first attempts' prompt tokens per second, its rise relative to
  everybody else's (the factor). A prefill pool's only work is the prompts it is given: a tenant that less than
  doubles its requests (no traffic signal) but sends prompts twenty times as long gives the pool many times its
  usual work. It rose if its first attempts did (the binomial test above) or their prompts grew (Mann–Whitney,
  one-sided), the smaller p-value doubled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr
from scipy.stats import binom, mannwhitneyu

SIGNIFICANCE = 1e-4  # p-value a change must beat: an incident tests a few dozen candidates × signals
MIN_EFFECT = 0.2  # a latency or step-time shift smaller than this rank effect is not the component's problem
# ... nor one that moved neither its median by a tenth (and MIN_RISE_MS) nor the share of calls beyond the normal
# range by MIN_TAIL_RISE: thousands of steps make a 0.1% shift significant, and a fault on a third of the calls
# (one tenant's, one model's) leaves the median where it was
MIN_RATIO = 1.1
MIN_RISE_MS = 0.5
MIN_TAIL_RISE = 0.05
MIN_RATE_EFFECT = 0.01  # nor a rise in failures of under one call in a hundred
MIN_TRAFFIC_FACTOR = 2.0  # nor a tenant's traffic less than doubled (bursts and diurnal drift do ×1.5)
SLOW_Z = 3.5  # a call beyond median + SLOW_Z robust standard deviations (of log latency) is outside its normal range
LOG_SCALE_FLOOR = 0.05


@dataclass(frozen=True)
class Signal:
    """One measurement of a candidate's own behaviour, baseline against window."""

    name: str  # service, wait, errors, timeouts, rejections, step_time, engine_ttft, tpot, traffic
    what: str  # e.g. "route service time", "auth timeouts", "tenant-b first attempts"
    effect: float  # in [0, 1]
    p_value: float
    before: float  # median (ms) for times; the share for rates; the ratio to the fit for step time; req/s
    during: float
    share_before: float  # calls beyond the normal range (times), or failing (rates); for traffic the tenant's share
    share_during: float
    threshold: float  # top of the normal range (ms, or ×) for times; NaN otherwise
    calls_before: int
    calls_during: int
    about: str = ""  # what part of the candidate it measures, when not all of it (a tenant's traffic to one model)

    @property
    def significant(self) -> bool:
        if self.p_value >= SIGNIFICANCE:
            return False
        if self.name in ("errors", "timeouts", "rejections"):
            return self.effect >= MIN_RATE_EFFECT
        if self.name in ("traffic", "work"):
            return self.factor >= MIN_TRAFFIC_FACTOR
        floor = 0.05 if self.name == "step_time" else MIN_RISE_MS
        median_moved = self.during >= MIN_RATIO * self.before and self.during - self.before >= floor
        tail_grew = self.share_during - self.share_before >= MIN_TAIL_RISE
        return self.effect >= MIN_EFFECT and (median_moved or tail_grew)

    @property
    def factor(self) -> float:
        """For traffic (work): how many times its usual rate of requests (prompt tokens) the tenant sent, relative
        to everybody else's change."""
        return 1.0 / (1.0 - self.effect) if self.effect < 1 else float("inf")

    @property
    def is_rate(self) -> bool:
        return self.name in ("errors", "timeouts", "rejections")

    def phrase(self) -> str:
        if self.name == "traffic":
            return (f"{self.what}: {self.before:.2f} → {self.during:.2f} requests/s, ×{self.factor:.1f} against the "
                    f"other tenants' change ({self.share_before:.0%} → {self.share_during:.0%} of first attempts, "
                    f"{_p(self.p_value)})")
        if self.name == "work":
            return (f"{self.what}: {self.before:,.0f} → {self.during:,.0f} prompt tokens/s, ×{self.factor:.1f} against "
                    f"the other tenants' change ({self.share_before:.0%} → {self.share_during:.0%} of prompt tokens, "
                    f"{_p(self.p_value)})")
        if self.is_rate:
            verb = {"errors": "failed (5xx)", "timeouts": "timed out", "rejections": "were rejected (429)"}[self.name]
            return (f"{self.share_during:.1%} of its {self.calls_during} calls during the incident {verb}, against "
                    f"{self.share_before:.1%} of {self.calls_before} before ({_p(self.p_value)})")
        if self.name == "step_time":
            return (f"its steps took {self.during:.2f}× the time its own baseline predicts for the same work "
                    f"(prefill, decode and context tokens), against {self.before:.2f}× before; "
                    f"{self.share_during:.0%} of its {self.calls_during} steps during the incident exceeded the "
                    f"normal range ({self.threshold:.2f}×), against {self.share_before:.0%} before")
        return (f"{self.what} median {ms_text(self.before)} → {ms_text(self.during)}; {self.share_during:.0%} of its "
                f"{self.calls_during} calls during the incident exceeded its normal range ({ms_text(self.threshold)}), "
                f"against {self.share_before:.0%} before (rank effect {self.effect:.2f}, {_p(self.p_value)})")


def _p(p: float) -> str:
    return "p < 1e-300" if p < 1e-300 else f"p = {p:.0e}"


def ms_text(value: float) -> str:
    """Milliseconds as a sentence prints them: seconds from 1,000, whole from 10, else two decimals."""
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    if value >= 10:
        return f"{value:.0f} ms"
    return f"{value:.2f} ms"


def normal_range_top(logs: np.ndarray) -> float:
    """Top of the normal range of log values: median + SLOW_Z robust standard deviations (1.4826 × MAD)."""
    median = float(np.median(logs))
    scale = max(float(np.median(np.abs(logs - median))) * 1.4826, LOG_SCALE_FLOOR)
    return median + SLOW_Z * scale


def rank_effect(before: np.ndarray, during: np.ndarray) -> tuple[float, float]:
    """(2·AUC − 1 clipped at 0, one-sided Mann–Whitney p-value) for `during` being larger than `before`."""
    if len(before) < 10 or len(during) < 5:
        return 0.0, 1.0
    if np.all(before == before[0]) and np.all(during == before[0]):
        return 0.0, 1.0
    u, p = mann_whitney_greater(during, before)
    auc = u / (len(before) * len(during))
    return max(2.0 * auc - 1.0, 0.0), p


def mann_whitney_greater(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(U of x, one-sided p-value for x being larger): scipy's `mannwhitneyu(x, y, alternative="greater")` to the
    last bit, by one sort of both samples and a search for x's values in it instead of ranking every value (the
    ranking runs for every candidate and window). The exact test scipy uses for small tie-free samples is left
    to scipy."""
    n1, n2 = len(x), len(y)
    if min(n1, n2) <= 8:
        u, p = mannwhitneyu(x, y, alternative="greater")
        return float(u), float(p)
    both = np.sort(np.concatenate((x, y)))
    below, through = np.searchsorted(both, x, "left"), np.searchsorted(both, x, "right")
    r1 = float(np.sum((below + through + 1) / 2.0))  # x's mid-ranks (half-integers: the sum is exact)
    u = r1 - n1 * (n1 + 1) / 2
    n = n1 + n2
    starts = np.flatnonzero(np.concatenate(([True], both[1:] != both[:-1])))
    ties = np.zeros(n)
    ties[starts] = np.diff(starts, append=n)  # scipy's tie counts: at each value's first position, in order
    tie_term = np.sum(ties ** 3 - ties)
    s = np.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (u - n1 * n2 / 2 - 0.5) / s
    return u, float(np.clip(ndtr(-z), 0.0, 1.0))


def time_signal(name: str, what: str, before: np.ndarray, during: np.ndarray, floor_ms: float = 0.0,
                scale: float = 1e-6) -> Signal | None:
    """A latency-like signal (values in ns, reported in ms; or ratios with scale 1) from its two samples."""
    before, during = before[np.isfinite(before)], during[np.isfinite(during)]
    if len(before) < 10 or not len(during):
        return None
    effect, p = rank_effect(before, during)
    top = float(np.exp(normal_range_top(np.log(np.maximum(before * scale, 1e-9))))) + floor_ms
    return Signal(name, what, effect, p, float(np.median(before)) * scale, float(np.median(during)) * scale,
                  float((before * scale > top).mean()), float((during * scale > top).mean()), top,
                  len(before), len(during))


def rate_signal(name: str, what: str, before: np.ndarray, during: np.ndarray) -> Signal | None:
    """A failure-rate signal from boolean samples: binomial upper tail of the window's count under the
    baseline's (smoothed) rate."""
    if len(before) < 10 or not len(during):
        return None
    k, n = int(during.sum()), len(during)
    p0 = (float(before.sum()) + 1.0) / (len(before) + 2.0)
    share_before, share_during = float(before.mean()), k / n
    p = float(binom.sf(k - 1, n, p0)) if k > n * p0 else 1.0
    return Signal(name, what, max(share_during - share_before, 0.0), p, share_before, share_during, share_before,
                  share_during, float("nan"), len(before), n)


def traffic_signal(what: str, mine_before: int, others_before: int, mine_during: int, others_during: int,
                   before_s: float, during_s: float, about: str = "") -> Signal | None:
    """A tenant's first attempts against everybody else's: conditional on the window's total, is its share
    higher than in the baseline (binomial upper tail)? The effect is 1 − 1/factor, the factor its rate's rise
    over the others'."""
    if mine_before < 20 or others_before < 20 or before_s <= 0 or during_s <= 0:
        return None
    share_before = mine_before / (mine_before + others_before)
    total = mine_during + others_during
    if not total:
        return None
    share_during = mine_during / total
    p = float(binom.sf(mine_during - 1, total, share_before)) if share_during > share_before else 1.0
    mine_ratio = (mine_during / during_s) / (mine_before / before_s)
    others_ratio = max((others_during / during_s) / (others_before / before_s), 1e-9)
    factor = mine_ratio / others_ratio
    return Signal("traffic", what, max(1.0 - 1.0 / factor, 0.0) if factor > 0 else 0.0, p, mine_before / before_s,
                  mine_during / during_s, share_before, share_during, float("nan"), mine_before, mine_during, about)


def work_features(prefill: np.ndarray, decode: np.ndarray, context: np.ndarray) -> np.ndarray:
    """Features of a step's work: a constant, prefill tokens (linear and quadratic: attention), decode tokens,
    decode context, and whether it prefills at all."""
    return np.column_stack([np.ones(len(prefill)), prefill, prefill ** 2 / 1e4, decode, context / 1e3, prefill > 0])


@dataclass(frozen=True)
class StepTimeFit:
    """One engine instance's step time against its work, fitted on its baseline steps: the rows it fitted
    (indices into the arrays given to `fit_step_times`), the coefficients, and the baseline's ratios of step
    time to the fit with the top of their normal range."""

    rows: np.ndarray
    coef: np.ndarray
    ratios_before: np.ndarray
    weights_before: np.ndarray
    top: float


def fit_step_times(instance: np.ndarray, step_ns: np.ndarray, steps: np.ndarray, features: np.ndarray,
                   before: np.ndarray) -> tuple[StepTimeFit, ...]:
    """Per engine instance with at least 20 baseline steps, a least-squares fit of step time to its work on the
    baseline steps (weighted by the steps each span holds). The fit depends on the baseline alone, so one fit
    serves every window scored against that baseline."""
    fits = []
    for name in np.unique(instance):
        rows = np.flatnonzero(instance == name)
        base = rows[before[rows]]
        if len(base) < 20:
            continue
        w = np.sqrt(steps[base].astype(float))
        coef, *_ = np.linalg.lstsq(features[base] * w[:, None], step_ns[base] * w, rcond=None)
        rb = step_ns[base] / np.maximum(features[base] @ coef, 1.0)
        top = float(np.exp(normal_range_top(np.log(np.maximum(rb, 1e-9)))))
        fits.append(StepTimeFit(rows, coef, rb, steps[base].astype(float), top))
    return tuple(fits)


def step_time_signal(fits: tuple[StepTimeFit, ...], step_ns: np.ndarray, steps: np.ndarray, features: np.ndarray,
                     during: np.ndarray) -> Signal | None:
    """The rank effect of the ratio of step time to each instance's baseline fit (`fit_step_times`), window
    against baseline, over the instances that stepped in the window."""
    ratios_before, ratios_during, thresholds = [], [], []
    share_before, share_during, weights_before, weights_during = [], [], [], []
    for fit in fits:
        now = fit.rows[during[fit.rows]]
        if not len(now):
            continue
        rd = step_ns[now] / np.maximum(features[now] @ fit.coef, 1.0)
        ratios_before.append(fit.ratios_before)
        ratios_during.append(rd)
        share_before.append(fit.ratios_before > fit.top)
        share_during.append(rd > fit.top)
        weights_before.append(fit.weights_before)
        weights_during.append(steps[now].astype(float))
        thresholds.append(fit.top)
    if not thresholds:
        return None
    rb, rd = np.concatenate(ratios_before), np.concatenate(ratios_during)
    effect, p = rank_effect(rb, rd)
    wb, wd = np.concatenate(weights_before), np.concatenate(weights_during)
    return Signal("step_time", "engine step time for its work", effect, p, float(np.median(rb)),
                  float(np.median(rd)), float(np.average(np.concatenate(share_before), weights=wb)),
                  float(np.average(np.concatenate(share_during), weights=wd)), float(np.median(thresholds)),
                  int(wb.sum()), int(wd.sum()))


def work_signal(what: str, mine_before: np.ndarray, others_before: float, mine_during: np.ndarray,
                others_during: float, others_calls: tuple[int, int], before_s: float, during_s: float,
                about: str = "") -> Signal | None:
    """The prompt tokens a tenant's first attempts gave a prefill pool (`mine_*`: each first attempt's prompt
    tokens; `others_*`: everybody else's prompt tokens in all, `others_calls` their first attempts before and
    during): the factor is its token rate's rise over the others'; it rose if its requests' share did (binomial,
    as `traffic_signal`) or its prompts grew (rank test), Bonferroni over the two. The effect is 1 − 1/factor."""
    mine_before, mine_during = mine_before[np.isfinite(mine_before)], mine_during[np.isfinite(mine_during)]
    if len(mine_before) < 20 or others_calls[0] < 20 or before_s <= 0 or during_s <= 0 or not len(mine_during):
        return None
    tokens_before, tokens_during = float(mine_before.sum()), float(mine_during.sum())
    if tokens_before <= 0 or others_before <= 0:
        return None
    calls = traffic_signal(what, len(mine_before), others_calls[0], len(mine_during), others_calls[1], before_s,
                           during_s)
    _, p_size = rank_effect(mine_before, mine_during)
    p = min(1.0, 2.0 * min(1.0 if calls is None else calls.p_value, p_size))
    mine_ratio = (tokens_during / during_s) / (tokens_before / before_s)
    others_ratio = max((others_during / during_s) / (others_before / before_s), 1e-9)
    factor = mine_ratio / others_ratio
    return Signal("work", what, max(1.0 - 1.0 / factor, 0.0) if factor > 0 else 0.0, p, tokens_before / before_s,
                  tokens_during / during_s, tokens_before / (tokens_before + others_before),
                  tokens_during / max(tokens_during + others_during, 1.0), float("nan"), len(mine_before),
                  len(mine_during), about)
