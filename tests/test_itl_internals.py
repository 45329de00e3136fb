"""The ITL analyzer's fast helpers answer exactly like the straightforward forms they replaced."""

from __future__ import annotations

import duckdb
import numpy as np

from infertrace.analyzers.itl import _counterfactual_p99, _mean, _records, _sum, _weighted_quantile


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


def test_short_sums_and_means_are_numpys_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    for n in range(1, 40):
        xs = (rng.random(n) * 10 ** rng.integers(0, 9, n)).tolist()
        assert _sum(xs) == float(np.sum(np.array(xs)))
        assert _mean(xs) == float(np.mean(xs))


def test_records_equal_to_dict_records_with_nulls_lists_and_strings() -> None:
    frame = duckdb.sql("SELECT * FROM (VALUES ('a', 1::BIGINT, [1, 2]::BIGINT[], ['x', 'y'], true, 1.5, 'e0'), "
                       "(NULL, NULL, NULL, NULL, NULL, NULL, 'e1'), ('b', 3, [], [], false, NULL, 'e2')) "
                       "t(s, i, l, v, b, f, instance)").df()
    fast, slow = _records(frame), frame.to_dict("records")
    assert len(fast) == len(slow) == 3
    for a, b in zip(fast, slow, strict=True):
        assert list(a) == list(b)
        for key in a:
            x, y = a[key], b[key]
            if isinstance(y, np.ndarray):
                assert list(x) == list(y)
            elif isinstance(y, float) and np.isnan(y):
                assert isinstance(x, float) and np.isnan(x)
            else:
                assert type(x) is type(y) and (x is y or x == y)
