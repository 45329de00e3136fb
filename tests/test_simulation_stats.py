"""The simulation summary's ITL percentiles come from (gap, tokens) pairs, never from one array with a value per
token; they must still equal numpy's percentile of that array to the last bit."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_engine.stats import weighted_percentile, weighted_percentiles


@settings(max_examples=300, deadline=None)
@given(gaps=st.lists(st.tuples(st.integers(1, 10**9), st.integers(1, 50)), min_size=1, max_size=60),
       q=st.one_of(st.sampled_from([0.0, 50.0, 99.0, 100.0]), st.floats(0, 100)))
def test_percentiles_of_repeated_gaps_equal_numpys_on_the_expanded_array(gaps: list[tuple[int, int]],
                                                                          q: float) -> None:
    values = np.array([g for g, _ in gaps], dtype=np.int64) / 1e9
    counts = np.array([c for _, c in gaps], dtype=np.int64)
    assert weighted_percentile(values, counts, q) == float(np.percentile(np.repeat(values, counts), q))


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(-10**12, 10**12), min_size=1, max_size=80),
       qs=st.lists(st.floats(0, 100), min_size=1, max_size=8))
def test_one_sort_answers_every_percentile_as_numpy_does(values: list[int], qs: list[float]) -> None:
    """`weighted_percentiles` sorts once and answers any q: with every count 1 it is numpy's percentile of the
    values themselves, integers included (a replay's distribution asks for dozens of quantiles)."""
    array = np.array(values, dtype=np.int64)
    at = weighted_percentiles(array, np.ones(len(values), dtype=np.int64))
    assert [at(q) for q in qs] == [float(np.percentile(array, q)) for q in qs]
