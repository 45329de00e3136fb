"""The roofline step cost model reproduces DESIGN.md's worked examples and its qualitative claims."""

from __future__ import annotations

import itertools

import pytest

from reference_engine.engine.cost_model import StepCostModel
from reference_engine.engine.hardware import hardware
from reference_engine.engine.models import model


def cost(model_name: str = "llama-3-8b", hw: str = "H100-SXM", **kwargs: object) -> StepCostModel:
    return StepCostModel(model(model_name), hardware(hw), **kwargs)  # type: ignore[arg-type]


def test_a_4096_token_llama_3_8b_prefill_on_one_h100_takes_95_to_100_ms_within_15_percent() -> None:
    seconds = cost().step_seconds([(4096, 0)], num_decodes=0, decode_ctx=0, sampled=1)
    assert seconds == pytest.approx(0.0975, rel=0.15)


def test_a_decode_step_of_64_sequences_at_2k_context_takes_about_12_ms_within_15_percent() -> None:
    seconds = cost().step_seconds([], num_decodes=64, decode_ctx=64 * 2048, sampled=64)
    assert seconds == pytest.approx(0.012, rel=0.15)


def test_prefill_and_decodes_in_one_step_take_about_as_long_as_the_prefill_alone() -> None:
    c = cost()
    both = c.step_seconds([(4096, 0)], num_decodes=64, decode_ctx=64 * 2048, sampled=65)
    decode = c.step_seconds([], num_decodes=64, decode_ctx=64 * 2048, sampled=64)
    assert both == pytest.approx(0.100, rel=0.15)
    assert both / decode > 7  # every decoding sequence sees an ~8x ITL spike


def test_the_decode_run_matches_step_by_step_costs_as_context_grows() -> None:
    c = cost()
    run = c.decode_run_ns(num_decodes=10, decode_ctx=10 * 500, steps=50)
    for i in (0, 17, 49):
        single = c.step_seconds([], num_decodes=10, decode_ctx=10 * (500 + i), sampled=10)
        assert run[i] == pytest.approx(single * 1e9, abs=1)
    assert all(a < b for a, b in itertools.pairwise(run)), "longer context, longer step"


def test_a_128_token_prefill_micro_batch_is_memory_bound_and_slower_than_1024() -> None:
    small = cost(prefill_microbatch=128).step_seconds([(4096, 0)], 0, 0, 1)
    large = cost(prefill_microbatch=1024).step_seconds([(4096, 0)], 0, 0, 1)
    assert small > 1.5 * large  # the weights are re-read for each of 32 micro-batches


def test_cached_prefix_tokens_cost_attention_but_not_linear_layers() -> None:
    c = cost()
    fresh = c.step_seconds([(512, 0)], 0, 0, 1)
    behind_cache = c.step_seconds([(512, 3584)], 0, 0, 1)
    full = c.step_seconds([(4096, 0)], 0, 0, 1)
    assert fresh < behind_cache < full / 4


def test_tensor_parallelism_speeds_up_a_70b_prefill_but_not_linearly() -> None:
    tp4 = cost("llama-3-70b", tensor_parallel=4).step_seconds([(4096, 0)], 0, 0, 1)
    tp8 = cost("llama-3-70b", tensor_parallel=8).step_seconds([(4096, 0)], 0, 0, 1)
    assert tp8 < tp4 < 2.2 * tp8


def test_moe_experts_on_the_host_cpu_make_steps_far_slower() -> None:
    on_gpu = cost("mixtral-8x7b", tensor_parallel=2).step_seconds([], 8, 8 * 2048, 8)
    offloaded = cost("mixtral-8x7b", offload_experts=True).step_seconds([], 8, 8 * 2048, 8)
    assert offloaded > 5 * on_gpu


def test_a_dense_model_cannot_offload_experts() -> None:
    with pytest.raises(ValueError, match="dense"):
        cost(offload_experts=True)


def test_h200_decodes_faster_than_h100_and_l4_far_slower() -> None:
    args = ([], 64, 64 * 2048, 64)
    h100, h200, l4 = (cost(hw=h).step_seconds(*args) for h in ("H100-SXM", "H200", "L4"))
    assert h200 < h100 < l4 / 5
