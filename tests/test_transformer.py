"""The transformer on its own: deterministic from its seed, causal, and rejecting what it cannot run."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from reference_engine.compute.ops import make_ops
from reference_engine.compute.transformer import Transformer
from reference_engine.engine.models import model

SPEC = model("tiny")


def test_the_same_seed_gives_the_same_model_and_another_seed_another() -> None:
    tokens = np.arange(12)
    a = Transformer(SPEC, seed=3).reference_logits(tokens)
    b = Transformer(SPEC, seed=3).reference_logits(tokens)
    c = Transformer(SPEC, seed=4).reference_logits(tokens)
    assert a.shape == (12, SPEC.vocab_size)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_a_position_never_sees_later_tokens() -> None:
    m = Transformer(SPEC, seed=0, dtype="float64")
    tokens = np.random.default_rng(0).integers(0, SPEC.vocab_size, 40)
    changed = tokens.copy()
    changed[30:] = (changed[30:] + 1) % SPEC.vocab_size
    a, b = m.reference_logits(tokens), m.reference_logits(changed)
    np.testing.assert_allclose(a[:30], b[:30], rtol=0, atol=1e-12)
    assert not np.allclose(a[30:], b[30:])


def test_logits_are_spread_enough_for_greedy_decoding_to_be_stable() -> None:
    logits = Transformer(SPEC, seed=0).reference_logits(np.arange(64))
    top2 = np.sort(logits, axis=-1)[:, -2:]
    assert np.isfinite(logits).all()
    assert np.median(top2[:, 1] - top2[:, 0]) > 1e-3  # far above float32 noise (≈ 1e-5)


def test_mixture_of_experts_and_uneven_heads_are_rejected() -> None:
    with pytest.raises(ValueError, match="mixture"):
        Transformer(model("mixtral-8x7b"))
    with pytest.raises(ValueError, match="multiple"):
        Transformer(dataclasses.replace(SPEC, num_kv_heads=3))


def test_numpy_runs_on_the_cpu_only_and_unknown_backends_are_named() -> None:
    with pytest.raises(ValueError, match="CPU only"):
        make_ops("numpy", device="cuda")
    with pytest.raises(ValueError, match="unknown backend"):
        make_ops("jax")
