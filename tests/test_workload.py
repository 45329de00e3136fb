"""Synthetic workloads and replay of the public traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from reference_engine.engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.workload import (
    SyntheticWorkload,
    azure_requests,
    mooncake_requests,
    mooncake_reusable_tokens,
    synthetic_requests,
)

WORKLOADS = Path(__file__).resolve().parents[2] / "shared" / "workloads"
needs_workloads = pytest.mark.skipif(not WORKLOADS.is_dir(), reason="../shared/workloads is not beside the repo")


def test_synthetic_traffic_has_the_requested_rate_shares_and_is_reproducible() -> None:
    w = SyntheticWorkload(rate=20, system_prompt_fraction=0.5, assistant_prefill_fraction=0.25)
    reqs = synthetic_requests(w, 200, seed=7)
    assert reqs == synthetic_requests(w, 200, seed=7)
    assert len(reqs) == pytest.approx(4000, rel=0.1)
    assert np.mean([r.system_prompt_id is not None for r in reqs]) == pytest.approx(0.5, abs=0.05)
    with_prefill = [r for r in reqs if r.assistant_prefill_tokens]
    assert len(with_prefill) / len(reqs) == pytest.approx(0.25, abs=0.05)
    assert all(r.prompt.segments[-1] == (f"assistant-{r.request_id}", 24) for r in with_prefill)
    for r in reqs:
        if r.system_prompt_id:
            assert r.system_prompt_id.startswith(f"sys-{r.tenant}-")


def test_gamma_arrivals_with_cv_above_one_are_burstier_than_poisson() -> None:
    def cv(arrival: str) -> float:
        reqs = synthetic_requests(SyntheticWorkload(rate=10, arrival=arrival, arrival_cv=3.0), 500, seed=1)
        gaps = np.diff([r.arrival_ns for r in reqs])
        return float(gaps.std() / gaps.mean())
    assert cv("poisson") == pytest.approx(1.0, abs=0.1)
    assert cv("gamma") > 2.0


def test_bad_synthetic_parameters_are_refused_with_the_parameter_named() -> None:
    with pytest.raises(ValueError, match="rate"):
        SyntheticWorkload(rate=0)
    with pytest.raises(ValueError, match="assistant_prefill_fraction"):
        SyntheticWorkload(assistant_prefill_fraction=1.5)


@needs_workloads
def test_azure_replay_reads_seven_digit_fractions_and_crlf_lines() -> None:
    reqs = azure_requests(WORKLOADS / "azure_conv_2023.csv")
    assert len(reqs) == 19366
    assert reqs[0].arrival_ns % 10**9 == 680_590_000  # 18:15:46.6805900
    assert (reqs[-1].arrival_ns - reqs[0].arrival_ns) / 1e9 == pytest.approx(3501.7, abs=0.1)
    assert np.mean([r.prompt.num_tokens for r in reqs]) == pytest.approx(1155, abs=1)
    assert reqs[1].output_tokens == 109 and reqs[1].prompt.num_tokens == 396
    fast = azure_requests(WORKLOADS / "azure_conv_2023.csv", duration_s=100, speedup=4)
    assert len(fast) == sum(1 for r in reqs if r.arrival_ns - reqs[0].arrival_ns < 400 * 10**9)
    for original, compressed in zip(reqs, fast, strict=False):
        assert compressed.arrival_ns - fast[0].arrival_ns == (original.arrival_ns - reqs[0].arrival_ns) // 4


@needs_workloads
def test_mooncake_block_hashes_become_shared_prefixes_that_hit_the_cache() -> None:
    path = WORKLOADS / "mooncake_synthetic.jsonl"
    reqs = mooncake_requests(path, duration_s=300)
    assert all(r.prompt.num_tokens == sum(n for _, n in r.prompt.segments) for r in reqs)
    # What the trace itself says can be reused: each prompt's leading blocks already seen earlier.
    reusable, _ = mooncake_reusable_tokens(path, len(reqs))
    # A cache large enough never to evict, and a budget that admits requests one at a time.
    config = EngineConfig(hardware="H200", chunked_prefill=True, max_num_batched_tokens=8192, max_num_seqs=4,
                          num_kv_blocks=2_000_000)
    ended = LLMEngine(config).run(reqs)
    cached = sum(s.num_cached_tokens for s in ended)
    assert reusable > 0.1 * sum(r.prompt.num_tokens for r in reqs)
    assert 0.95 * reusable <= cached <= reusable


def test_a_malformed_replay_file_names_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "trace.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.1,12,x\r\n")
    with pytest.raises(ValueError, match=r"trace\.csv:2"):
        azure_requests(bad)
    wrong = tmp_path / "other.csv"
    wrong.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing columns"):
        azure_requests(wrong)
    moon = tmp_path / "m.jsonl"
    moon.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{"timestamp": 1}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2"):
        mooncake_requests(moon)
