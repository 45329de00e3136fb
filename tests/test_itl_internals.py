"""The ITL analyzer's fast helpers answer exactly like the straightforward forms they replaced."""

from __future__ import annotations

import numpy as np

from infertrace.analyzers.itl import _counterfactual_p99, _segment_sums, _top_culprits, _weighted_quantile


def _weighted_quantile_by_unique(values: np.ndarray, weights: np.ndarray, q: float) -> int:
    """The straightforward form: weights summed per distinct value, then the first value reaching q."""
    if len(values) == 0:
        return 0
    uniq, inverse = np.unique(values, return_inverse=True)
    cum = np.cumsum(np.bincount(inverse, weights))
    if cum[-1] <= 0:
        return 0
    return int(uniq[min(int(np.searchsorted(cum, q * cum[-1], side="left")), len(uniq) - 1)])


def test_weighted_quantile_and_counterfactual_equal_the_per_distinct_value_form() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(0, 400))
        values = rng.integers(0, 50, n).astype(np.int64) * 1_000_003  # many repeated values
        weights = rng.integers(0, 5, n).astype(np.float64)
        for q in (0.0, 0.5, 0.99, 1.0):
            assert _weighted_quantile(values, weights, q) == _weighted_quantile_by_unique(values, weights, q)
        # Counterfactual: some tokens' ITLs cut (their old value out, the new one in).
        k = min(n, int(rng.integers(0, 30)))
        olds = values[:k]
        cuts = rng.integers(0, 3_000_000, k).astype(np.int64)
        expected = _weighted_quantile_by_unique(
            np.concatenate([values, olds, olds - cuts]),
            np.concatenate([weights, -np.ones(k), np.ones(k)]), 0.99)
        assert _counterfactual_p99(values, weights, olds, cuts) == expected


def test_segment_sums_add_left_to_right_like_pythons_sum() -> None:
    rng = np.random.default_rng(3)
    for _ in range(100):
        counts = rng.integers(1, 12, int(rng.integers(0, 30))).astype(np.int64)
        starts = (np.cumsum(counts) - counts).astype(np.int64)
        values = rng.random(int(counts.sum())) * 10.0 ** rng.integers(0, 9, int(counts.sum()))
        expected = [sum(values[a:a + n].tolist()) for a, n in zip(starts, counts, strict=True)]
        assert _segment_sums(values, starts, counts).tolist() == expected  # the same floats, not close ones


def _top_culprits_by_loop(victim_codes: np.ndarray, victim_stall: np.ndarray, culprit_stall: np.ndarray,
                          culprit_codes: np.ndarray, culprit_excess: np.ndarray) -> list[int]:
    """The straightforward form: walk every victim row's stall culprits, sum per (victim, culprit), keep the
    largest, ties to the first met."""
    totals: dict[int, dict[int, int]] = {}
    for victim, stall in zip(victim_codes.tolist(), victim_stall.tolist(), strict=True):
        for row in np.flatnonzero(culprit_stall == stall).tolist():
            per = totals.setdefault(victim, {})
            per[int(culprit_codes[row])] = per.get(int(culprit_codes[row]), 0) + int(culprit_excess[row])
    top = [-1] * (int(victim_codes.max()) + 1 if len(victim_codes) else 0)
    for victim, per in totals.items():
        top[victim] = max(per.items(), key=lambda kv: kv[1])[0]  # max keeps the first of equal values
    return top


def test_top_culprits_equal_the_straightforward_form() -> None:
    rng = np.random.default_rng(11)
    for _ in range(300):
        stalls = int(rng.integers(1, 8))
        victim_stall = np.sort(rng.integers(0, stalls, int(rng.integers(0, 25)))).astype(np.int64)
        victim_codes = rng.integers(0, 6, len(victim_stall)).astype(np.int64)
        culprit_stall = np.sort(rng.integers(0, stalls, int(rng.integers(0, 12)))).astype(np.int64)
        culprit_codes = rng.integers(0, 5, len(culprit_stall)).astype(np.int64)
        culprit_excess = rng.integers(0, 4, len(culprit_stall)).astype(np.int64) * 1000  # many ties
        fast = _top_culprits(victim_codes, victim_stall, culprit_stall, culprit_codes, culprit_excess, stalls)
        assert fast.tolist() == _top_culprits_by_loop(victim_codes, victim_stall, culprit_stall, culprit_codes,
                                                      culprit_excess)
