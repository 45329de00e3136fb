"""KV tiers behind the GPU: evicted prefix blocks move to host memory (then a remote pool), least recently used
first; a prompt prefix found there is copied back and its TTFT pays the copy. On the public Mooncake trace the
hit rate, read from exported spans, rises toward the trace's infinite-cache bound as the host tier grows, and
what the prefix-cache analyzer says more capacity would buy matches what the larger tier then measures."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infertrace import semconv as sc
from infertrace.analyzers.prefix_cache import analyze_prefix_cache
from infertrace.report import ReportOptions, build_report, render
from infertrace.store.store import Store
from reference_engine.engine.block_manager import BlockManager
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.hardware import hardware
from reference_engine.engine.kv_tiers import KvTiers
from reference_engine.engine.llm_engine import num_kv_blocks
from reference_engine.engine.models import model
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request, Sequence
from reference_engine.workload import mooncake_requests, mooncake_reusable_tokens
from tests.engine_runs import T0, run_to_store
from tests.fleet_traces import Traces

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "workloads" / "mooncake_synthetic.jsonl"
needs_mooncake = pytest.mark.skipif(not MOONCAKE.exists(), reason="the Mooncake trace is in ../shared/workloads")
LLAMA = model("llama-3-8b")
SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "infertrace" / "report" / "schema.json").read_text())


def _seq(rid: str, *segments: tuple[str, int]) -> Sequence:
    return Sequence(Request(rid, 0, Prompt(segments), 1, 1))


def test_tiers_pass_evicted_blocks_down_least_recently_used_first_and_give_them_back_once() -> None:
    tiers = KvTiers(host_blocks=2, remote_blocks=1)
    tiers.demote([1, 2, 3])  # the host holds 2, 3; 1 went on to the remote tier
    assert [tiers.tier_of(h) for h in (1, 2, 3)] == ["remote", "host", "host"]
    tiers.demote([4, 5])  # 2 then 3 go down; the remote tier keeps 3 and drops 1, then 2
    assert [tiers.tier_of(h) for h in (1, 2, 3, 4, 5)] == [None, None, "remote", "host", "host"]
    tiers.take(4)
    assert tiers.tier_of(4) is None and len(tiers.blocks[0]) == 1
    # 1 left the last tier first, 2 after it: keeping both needs as many more blocks as evictions since 1 left.
    assert tiers.evicted_run([1, 2, 9]) == (2, 2)
    assert tiers.evicted_run([2]) == (1, 1)
    assert tiers.evicted_run([9, 1]) == (0, 0)


def test_a_prefix_evicted_from_the_gpu_is_found_in_the_host_tier_and_copied_back() -> None:
    bm = BlockManager(num_blocks=8, block_size=16, tiers=KvTiers(host_blocks=16, remote_blocks=0))
    first = _seq("a", ("doc", 64), ("a", 16))
    bm.allocate(first, 80)
    first.num_computed_tokens = 80
    bm.cache_computed_blocks(first)
    bm.deallocate(first)
    other = _seq("b", ("other", 128))  # takes all 8 blocks: the 5 cached ones are evicted to the host
    bm.allocate(other, 128)
    assert not bm.hash_to_block and len(bm.tiers.blocks[0]) == 5
    bm.deallocate(other)
    again = _seq("c", ("doc", 64), ("c", 32))
    assert bm.can_allocate(again, 96) and bm.cached_prefix_tokens(again, 96) == 64
    assert bm.allocate(again, 96) == 64
    hit = bm.last_hit
    assert hit is not None and (hit.device_tokens, hit.host_tokens, hit.remote_tokens) == (0, 64, 0)
    assert len(bm.tiers.blocks[0]) == 1  # the four loaded blocks left the tier; "a"'s own block stays
    assert all(bm.hash_to_block[h] in again.block_table for h in again.block_hashes[:4])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6), st.integers(1, 4)), min_size=1, max_size=40),
       st.integers(0, 6), st.integers(0, 6))
def test_blocks_live_in_one_place_and_references_stay_consistent(
        script: list[tuple[int, int, int]], host: int, remote: int) -> None:
    """Random prompts sharing document prefixes are admitted, computed and released on a small GPU with small
    tiers: no block hash is both on the GPU and in a tier, no block is held twice, free blocks add up."""
    bm = BlockManager(num_blocks=12, block_size=4, tiers=KvTiers(host, remote))
    held: list[Sequence] = []
    for k, (doc, doc_blocks, own) in enumerate(script):
        seq = _seq(f"r{k}", (f"doc{doc}", 4 * doc_blocks), (f"own{k}", 4 * own))
        tokens = seq.num_prompt_tokens
        while held and not bm.can_allocate(seq, tokens):
            bm.deallocate(held.pop(0))
        if not bm.can_allocate(seq, tokens):
            continue
        computed = bm.allocate(seq, tokens)
        assert computed == bm.last_hit.device_tokens + bm.last_hit.host_tokens + bm.last_hit.remote_tokens
        seq.num_computed_tokens = tokens
        bm.cache_computed_blocks(seq)
        held.append(seq)
        tables = [b for s in held for b in s.block_table]
        assert sum(bm.ref_counts) == len(tables)
        assert bm.num_used_blocks == len(set(tables))
        for tier in bm.tiers.blocks:
            assert not set(tier) & set(bm.hash_to_block)
        assert sum(len(t) for t in bm.tiers.blocks) <= host + remote


def test_a_step_that_copies_a_prefix_back_is_longer_by_the_copy_over_pcie_or_the_network() -> None:
    config = EngineConfig(kv_host_tier_gb=10, kv_remote_tier_gb=10, kv_remote_bandwidth_gb_s=12.5)
    cost = config.cost_model()
    h100 = hardware("H100-SXM")
    assert cost.kv_load_seconds(1024, 0) == pytest.approx(1024 * LLAMA.kv_bytes_per_token / h100.host_link_bandwidth)
    assert cost.kv_load_seconds(0, 1024) == pytest.approx(1024 * LLAMA.kv_bytes_per_token / 12.5e9)
    assert config.kv_tier_blocks() == (10e9 // (LLAMA.kv_bytes_per_token * 16),) * 2
    with pytest.raises(ValueError, match="prefix_caching"):
        EngineConfig(kv_host_tier_gb=10, enable_prefix_caching=False)


def test_a_remote_tier_holds_what_the_host_tier_evicts_and_costs_the_network(tmp_path: Path) -> None:
    """Three 4096-token documents on a GPU that holds about one and a host tier of about one: the second and third
    push the first out of the GPU (its tail first: a finished request releases its blocks tail first) and most of
    it on to the remote tier. Asking for it again copies its head back from the host tier over PCIe and the rest
    from the remote tier over the network."""
    per_doc_gb = 4096 * LLAMA.kv_bytes_per_token / 1e9
    config = EngineConfig(num_kv_blocks=300, kv_host_tier_gb=1.01 * per_doc_gb, kv_remote_tier_gb=4 * per_doc_gb,
                          instance_id="tiers")
    docs = ["d0", "d1", "d2", "d0"]
    requests = [Request(f"r{i}", T0 + i * 10**9, Prompt(((d, 4096), (f"q{i}", 16))), 2, 2) for i, d in enumerate(docs)]
    store, _, log = run_to_store(tmp_path, config, requests)
    with store:
        result = analyze_prefix_cache(store)
        doc = build_report(store, ReportOptions(sections=("prefix_cache",)), cache=result)
    (tier,) = result.by_tier
    assert tier.device_tokens == 0 and tier.host_tokens > 0 and tier.remote_tokens > tier.host_tokens
    assert tier.host_tokens + tier.remote_tokens == 4096
    (load,) = [r.kv_load for r in log.reports if r.kv_load is not None]
    assert load[:2] == (tier.host_tokens, tier.remote_tokens)
    pcie = hardware("H100-SXM").host_link_bandwidth
    assert load[2] == pytest.approx(LLAMA.kv_bytes_per_token * (tier.host_tokens / pcie + tier.remote_tokens / 25e9))
    assert tier.load_s == pytest.approx(load[2], abs=1e-9)
    # The report shows the same, validated against its schema, and says what more capacity would buy.
    jsonschema.validate(json.loads(render(doc, "json")), SCHEMA, cls=jsonschema.Draft202012Validator)
    (shown,) = doc["sections"]["prefix_cache"]["kv_tiers"]
    assert (shown["host_hit_rate"], shown["remote_hit_rate"]) == (round(tier.host_hit_rate, 4),
                                                                  round(tier.remote_hit_rate, 4))
    assert [c["extra_blocks"] for c in shown["more_capacity"]][-1] is None
    text = render(doc, "table")
    assert "Hit rate by KV tier" in text and "What more KV capacity would buy" in text


@pytest.mark.slow
@needs_mooncake
def test_a_host_tier_lifts_the_mooncake_hit_rate_toward_the_infinite_cache_bound_and_ttft_pays_the_copy(
        tmp_path: Path) -> None:
    requests = mooncake_requests(MOONCAKE, duration_s=300, speedup=0.5)  # 150 s of the trace at half its rate
    reusable, total = mooncake_reusable_tokens(MOONCAKE, len(requests))
    bound = reusable / total
    gpu = EngineConfig(hardware="H100-SXM", policy="decode_first", chunked_prefill=True, max_num_batched_tokens=8192,
                       max_num_seqs=64, kv_reuse_accounting=True, instance_id="gpu-only")
    gpu_gb = num_kv_blocks(gpu, LLAMA) * gpu.block_size * LLAMA.kv_bytes_per_token / 1e9
    runs = {}
    for times in (0, 1, 12):  # host tiers of 0, 1 and 12 times the GPU's own KV memory
        config = EngineConfig(**{**gpu.__dict__, "kv_host_tier_gb": times * gpu_gb * 1.0001,
                                 "instance_id": f"host-{times}x"})
        store, _, _ = run_to_store(tmp_path, config, requests)
        with store:
            (runs[times],) = analyze_prefix_cache(store).by_tier
    rates = [runs[t].hit_rate for t in (0, 1, 12)]
    assert rates == sorted(rates) and rates[0] < rates[-1]
    assert rates[0] < 0.2 * bound  # one GPU's KV keeps little of a 15k-token-prompt trace
    assert rates[-1] > 0.97 * bound  # a large enough host tier keeps nearly everything the trace reuses
    assert runs[12].host_tokens > 0 and runs[0].host_tokens == 0
    # What the GPU-only run said more capacity would buy is what the larger tiers measure.
    with Store.open(tmp_path / "store-host-0x") as store:
        capacity = {c.extra_blocks: c.hit_rate for c in analyze_prefix_cache(store).capacity}
    gpu_blocks = runs[0].gpu_blocks
    assert capacity[None] == pytest.approx(bound, rel=0.02)
    assert capacity[gpu_blocks] == pytest.approx(runs[1].hit_rate, rel=0.1)
    # TTFT pays the copy: each step that copied KV back is longer by tokens × KV bytes over PCIe, and the
    # requests whose prefix came from the host tier got their first token after it.
    traces = Traces.read(tmp_path / "host-12x.jsonl")
    steps = [s for s in traces.named(sc.SPAN_STEP) if sc.STEP_KV_LOAD_NS in s.attrs]
    assert steps
    pcie = hardware("H100-SXM").host_link_bandwidth
    for s in steps:
        copy_ns = s.attrs[sc.STEP_KV_LOAD_HOST_TOKENS] * LLAMA.kv_bytes_per_token / pcie * 1e9
        assert s.attrs[sc.STEP_KV_LOAD_NS] == pytest.approx(copy_ns, abs=1)
        assert s.attrs[sc.STEP_DURATIONS_NS][0] > s.attrs[sc.STEP_KV_LOAD_NS]
    loaded = {s.attrs[sc.REQUEST_ID] for s in traces.named(sc.SPAN_PREFILL)
              if s.attrs.get(sc.PREFILL_KV_HOST_TOKENS, 0) > 0}
    ttft = {s.attrs[sc.REQUEST_ID]: s.attrs[sc.LATENCY_TIME_TO_FIRST_TOKEN] for s in traces.named(sc.SPAN_REQUEST)}
    smallest_copy = min(s.attrs[sc.STEP_KV_LOAD_NS] for s in steps) / 1e9
    assert loaded and all(ttft[r] > smallest_copy for r in loaded)


def test_an_engine_without_tiers_says_its_hits_by_tier_were_not_analysed(tmp_path: Path) -> None:
    config = EngineConfig(instance_id="plain")
    requests = [Request(f"r{i}", T0 + i * 10**9, Prompt((("sys", 512), (f"u{i}", 64))), 2, 2) for i in range(3)]
    store, _, _ = run_to_store(tmp_path, config, requests)
    with store:
        result = analyze_prefix_cache(store)
    assert result.by_tier == () and result.capacity == ()
    assert len(result.tiers_not_analysed) == 1 and "plain" in result.tiers_not_analysed[0]

