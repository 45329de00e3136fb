"""The statistics root-cause ranking is built on: a trend fit dates the start of a ramp (not its middle), a
rank effect sees a jittery ×2 slowdown that a tail threshold misses, a binomial test finds a few percent of
failures in a rare-event baseline, and a tenant's traffic rise is measured against everybody else's (a
diurnal rise of all traffic is not a surge)."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings
from hypothesis.extra.numpy import arrays
from scipy.stats import mannwhitneyu

from infertrace.analyzers.anomalies import (
    DetectionConfig,
    _baseline_rate,
    _latency_score,
    _latency_scores,
    _small_baseline_rate,
)
from infertrace.analyzers.changepoint import mean_shift, trend_onset
from infertrace.analyzers.signals import mann_whitney_greater, rank_effect, rate_signal, time_signal, traffic_signal


def test_a_ramp_is_dated_to_where_it_starts_not_where_it_crosses_a_threshold() -> None:
    rng = np.random.default_rng(4)
    errors = []
    for _ in range(10):
        t = np.sort(rng.uniform(0, 1000, 8000))
        start, ramp, factor = rng.uniform(300, 400), rng.uniform(180, 360), rng.uniform(2, 4)
        level = np.clip((t - start) / ramp, 0, 1)
        service_ms = 40 * (1 + (factor - 1) * level) * rng.lognormal(0, 0.3, len(t))
        found = trend_onset((t * 1e9).astype(np.int64), service_ms, 0, int((start + ramp + 60) * 1e9))
        assert found is not None and found.is_ramp
        errors.append(found.onset_ns / 1e9 - start)
        # a mean-shift split of the same data lands well inside the ramp
        split = mean_shift(service_ms[t < start + ramp + 60])
        assert split is not None and t[split] - start > 0.25 * ramp
    assert np.median(np.abs(errors)) < 10


def test_a_step_is_a_ramp_of_one_bin() -> None:
    rng = np.random.default_rng(5)
    t = np.sort(rng.uniform(0, 600, 6000))
    values = rng.normal(0, 0.3, len(t)) + (t > 300) * 0.7
    found = trend_onset((t * 1e9).astype(np.int64), values, 0, int(600e9))
    assert found is not None and abs(found.onset_ns / 1e9 - 300) <= 5 and found.full_ns - found.onset_ns <= 5e9


def test_a_flat_series_has_no_onset() -> None:
    rng = np.random.default_rng(6)
    t = np.sort(rng.uniform(0, 600, 3000))
    found = trend_onset((t * 1e9).astype(np.int64), rng.normal(0, 1, len(t)), 0, int(600e9))
    assert found is None or found.gain < 0.05


def test_a_jittery_x2_slowdown_has_a_large_rank_effect_though_few_calls_cross_the_tail() -> None:
    rng = np.random.default_rng(7)
    before = 10e6 * rng.lognormal(0, 0.6, 3000)
    during = 20e6 * rng.lognormal(0, 0.6, 1000)
    signal = time_signal("service", "route service time", before, during)
    assert signal is not None and signal.significant
    assert signal.effect > 0.55  # P(during > before) ≈ Φ(ln 2 / (0.6 √2)) ≈ 0.80
    assert signal.share_during < 0.15  # a median + 3.5 MAD threshold sees a handful
    assert not rank_effect(before, 10e6 * rng.lognormal(0, 0.6, 1000))[1] < 1e-4


def test_a_few_percent_of_failures_in_a_quiet_component_is_significant() -> None:
    rng = np.random.default_rng(8)
    before = rng.random(4000) < 0.001
    during = rng.random(1500) < 0.04
    signal = rate_signal("errors", "route errors", before, during)
    assert signal is not None and signal.significant and signal.p_value < 1e-20
    assert 0.02 < signal.effect < 0.06
    unchanged = rate_signal("errors", "route errors", before, rng.random(1500) < 0.001)
    assert unchanged is not None and not unchanged.significant


def test_a_tenant_surge_is_measured_against_the_others_and_a_diurnal_rise_is_not_a_surge() -> None:
    surge = traffic_signal("tenant-b", 600, 2400, 1200, 950, 300.0, 100.0)  # b ×6 while the others stay
    assert surge is not None and surge.significant and 5 < surge.factor < 7.5
    everybody = traffic_signal("tenant-b", 600, 2400, 300, 1200, 300.0, 100.0)  # all ×1.5 (the day's peak)
    assert everybody is not None and not everybody.significant and 0.8 < everybody.factor < 1.25


@settings(max_examples=200, deadline=None)
@given(x=arrays(np.float64, st.integers(1, 60), elements=st.floats(-5, 5, allow_nan=False, width=16)),
       y=arrays(np.float64, st.integers(1, 400), elements=st.floats(-5, 5, allow_nan=False, width=16)))
def test_the_rank_test_is_scipys_mann_whitney_to_the_last_bit_ties_included(x: np.ndarray, y: np.ndarray) -> None:
    # width-16 floats repeat often: many ties, the case where the tie correction matters
    expected = mannwhitneyu(x, y, alternative="greater")
    assert mann_whitney_greater(x, y) == (float(expected.statistic), float(expected.pvalue))


@settings(max_examples=200, deadline=None)
@given(value=st.floats(-1e3, 1e3), baseline=st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=45))
def test_a_buckets_score_against_a_short_baseline_is_the_numpy_score(value: float, baseline: list[float]) -> None:
    config = DetectionConfig()
    expected = _latency_scores(np.array([value]), np.array(baseline), config)[0]
    assert _latency_score(value, baseline, config) == expected


@settings(max_examples=200, deadline=None)
@given(buckets=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 400)), min_size=1, max_size=45))
def test_a_buckets_rate_baseline_from_a_short_baseline_is_the_numpy_baseline(buckets: list[tuple[int, int]]) -> None:
    config = DetectionConfig()
    n = np.array([float(total) for _, total in buckets])
    rates = np.array([min(k, total) for k, total in buckets]) / n
    assert _small_baseline_rate(rates.tolist(), n.tolist(), config) == _baseline_rate(rates, n, config)
