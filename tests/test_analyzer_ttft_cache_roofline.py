"""TTFT decomposition, prefix cache and roofline diagnoses on engine runs with known answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from infertrace.analyzers.prefix_cache import Price, PriceTable, analyze_prefix_cache
from infertrace.analyzers.roofline import HARDWARE, MODELS, analyze_prefill_roofline
from infertrace.analyzers.ttft import analyze_ttft
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.cost_model import StepCostModel
from reference_engine.engine.hardware import HARDWARE as ENGINE_HARDWARE
from reference_engine.engine.hardware import hardware
from reference_engine.engine.models import MODELS as ENGINE_MODELS
from reference_engine.engine.models import model
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request
from tests.engine_runs import T0, run_to_store


def _spaced(prompts: list[int], gap_s: float = 1.0, prefix: str = "r") -> list[Request]:
    return [Request(f"{prefix}-{i}", T0 + round(i * gap_s * 1e9), Prompt(((f"{prefix}-user-{i}", n),)), 2, 64)
            for i, n in enumerate(prompts)]


def test_prefill_fit_recovers_the_engines_own_prefill_cost(tmp_path: Path) -> None:
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM", policy="prefill_first")
    prompts = [256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8000]
    store, _, _ = run_to_store(tmp_path, config, _spaced(prompts))
    with store:
        result = analyze_ttft(store)
    (fit,) = result.fits
    cost = StepCostModel(model("llama-3-8b"), hardware("H100-SXM"))
    truth = np.array([cost.step_seconds([(n, 0)], 0, 0, 1) * 1e9 for n in prompts])
    predicted = fit.predict_ns(np.array(prompts, dtype=float), np.zeros(len(prompts)))
    assert np.max(np.abs(predicted - truth) / truth) < 0.05
    assert abs(fit.tokens_per_s - sum(prompts) / truth.sum() * 1e9) / fit.tokens_per_s < 1e-6
    (breakdown,) = result.models
    assert breakdown.dominant == "prefill_compute"  # one request at a time: nothing queues


def test_a_tenant_that_puts_fresh_tokens_before_its_system_prompt_busts_the_cache(tmp_path: Path) -> None:
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM", policy="prefill_first")
    requests = []
    for i in range(20):
        good = Prompt((("sys-a", 1024), (f"a-user-{i}", 200)))
        busted = Prompt(((f"b-stamp-{i}", 8), ("sys-b", 1024), (f"b-user-{i}", 200)))
        requests.append(Request(f"a-{i}", T0 + i * 10**9, good, 2, 64, tenant="a", system_prompt_id="sys-a",
                                system_prompt_tokens=1024))
        requests.append(Request(f"b-{i}", T0 + i * 10**9 + 5 * 10**8, busted, 2, 64, tenant="b",
                                system_prompt_id="sys-b", system_prompt_tokens=1024))
    store, _, _ = run_to_store(tmp_path, config, requests)
    prices = PriceTable(Price(input_per_mtok=2.0, cached_input_per_mtok=0.5, output_per_mtok=0.0))
    with store:
        result = analyze_prefix_cache(store, prices, bucket_s=3600)
    assert [b.tenant for b in result.busting] == ["b"]
    (b,) = result.busting
    assert (b.requests, b.full_hits, b.other_tenants_full_hit_rate) == (19, 0, 1.0)
    hits = {g.key: g for g in result.by_tenant}
    assert hits["a"].cached_tokens == 19 * 1024  # every request after the first reads the whole prompt
    assert hits["b"].cached_tokens == 0
    assert result.billing.savings == 19 * 1024 * (2.0 - 0.5) / 1e6
    assert b.lost_cached_tokens == 19 * 1024


def test_a_128_token_prefill_microbatch_is_diagnosed_memory_bound_and_the_fix_matches_an_unbatched_engine(
        tmp_path: Path) -> None:
    prompts = [2048, 4096, 3000, 1024, 6000]
    runs = {}
    for mb in (128, 0):
        config = EngineConfig(model="llama-3-8b", hardware="H100-SXM", prefill_microbatch=mb,
                              instance_id=f"mb-{mb}")
        store, _, _ = run_to_store(tmp_path, config, _spaced(prompts))
        with store:
            (runs[mb],) = analyze_prefill_roofline(store).engines
    slow, fast = runs[128], runs[0]
    assert slow.diagnosis == "microbatch_memory_bound"
    assert fast.diagnosis == "at_roofline"
    assert slow.measured_tokens_per_s < 0.7 * fast.measured_tokens_per_s
    assert slow.recommended_microbatch_tokens is not None and slow.recommended_microbatch_tokens >= 1024
    assert slow.fix_tokens_per_s is not None
    assert abs(slow.fix_tokens_per_s - fast.measured_tokens_per_s) / fast.measured_tokens_per_s < 0.05


def test_the_roofline_figures_mirror_the_engines_specs() -> None:
    for name, shape in MODELS.items():
        spec = ENGINE_MODELS[name]
        assert (shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                shape.intermediate_size, shape.vocab_size, shape.num_experts, shape.experts_per_token,
                shape.weight_bits) == (
            spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
            spec.intermediate_size, spec.vocab_size, spec.num_experts, spec.experts_per_token, spec.weight_bits)
        assert shape.attention_params == spec.num_layers * spec.attention_params_per_layer
        assert shape.expert_layer_bytes == spec.expert_layer_bytes
    for name, acc in HARDWARE.items():
        hw = ENGINE_HARDWARE[name]
        assert (acc.peak_flops, acc.mem_bandwidth, acc.host_flops, acc.host_mem_bandwidth, acc.host_link_bandwidth) == (
            hw.peak_flops, hw.mem_bandwidth, hw.host_flops, hw.host_mem_bandwidth, hw.host_link_bandwidth)
