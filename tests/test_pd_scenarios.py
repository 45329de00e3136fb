"""The two prefill/decode scenario families in the bank, scored by `infertrace evaluate`: CPU-only hosts whose
report recommends a GPU prefill host (quoting the TTFT the disaggregated twin measured, within 15%), and
read/write separation across data centres, where root-cause ranking names the fibre link, or a tenant's surge and
the prefill pool it saturated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertrace.cli import app


def _generate(out: Path, family: str | tuple[str, ...], count: int, duration_s: int, seed: int = 1) -> None:
    families = [a for f in ((family,) if isinstance(family, str) else family) for a in ("--family", f)]
    result = CliRunner().invoke(app, ["scenarios", "generate", "--out", str(out), "--seed", str(seed), "--count",
                                      str(count), "--duration", str(duration_s), *families, "--no-progress"])
    assert result.exit_code == 0, result.output


def test_the_report_recommends_a_gpu_prefill_host_for_cpu_only_hosts_within_15_percent_of_the_twin(
        tmp_path: Path) -> None:
    bank = tmp_path / "bank"
    _generate(bank, "cpu_decode_host", 2, 600)  # seed 1: 22 CPU hosts sharing the GPU host, then one CPU host
    truths = {t["scenario"]: t for t in (json.loads(p.read_text()) for p in bank.glob("*/ground_truth.json"))}
    for truth in truths.values():
        twin = truth["details"]["twin"]
        assert twin["answered"] == twin["requests"] == truth["summary"]["requests"] > 10
    assert sorted(t["details"]["cpu_hosts"] > 1 for t in truths.values()) == [False, True]
    result = CliRunner().invoke(app, ["evaluate", str(bank), "--section", "pd", "--format", "json"])
    assert result.exit_code == 0, result.output
    pd = json.loads(result.stdout)["pd"]
    assert pd["cases"] == 2 and pd["not_analysed"] == []
    for row in pd["scenarios"]:
        assert row["recommended"] and abs(row["relative_error"]) <= 0.15, row
        # the CPU-only host prefills for minutes; the twin's GPU prefill host answers in seconds
        assert row["measured_ttft_p50_ms"] < 5_000
    assert pd["within_tolerance"] == 2
    # the naive estimates (and the estimate without the engine's batching) are scored beside it
    assert set(pd["baselines"]) == {"gpu_prefill_alone", "flops_ratio", "unbatched_fifo"}
    for row in pd["scenarios"]:
        assert all(b["relative_error"] is not None for b in row["baselines"].values()), row
    # where the CPU hosts share the GPU host, it is busy and its queue is what the prefill time alone misses
    shared = next(r for r in pd["scenarios"] if r["cpu_hosts"] > 1)
    assert shared["variant"] == "CPU hosts sharing a GPU prefill host" and shared["gpu_utilization"] > 0.5
    assert abs(shared["baselines"]["gpu_prefill_alone"]["relative_error"]) > 0.15, shared
    assert set(pd["per_variant"]) == {"one CPU host", "CPU hosts sharing a GPU prefill host"}
    assert pd["rca"]["cases"] == 0  # no root-cause family in this bank


def test_evaluate_pd_says_when_a_bank_has_nothing_to_score(tmp_path: Path) -> None:
    bank = tmp_path / "bank"
    _generate(bank, "auth_slowdown", 1, 60)
    result = CliRunner().invoke(app, ["evaluate", str(bank), "--section", "pd"])
    assert result.exit_code == 0, result.output
    assert "no scenario of the bank has the pd task: nothing scored" in result.stdout
    assert "P/D root-cause ranking: no scenario of cross_dc_read_write, kv_transfer_congestion with the rca task: " \
        "nothing scored" in result.stdout


@pytest.mark.slow
def test_rca_names_the_fibre_link_or_the_prefill_pool_across_data_centres(tmp_path: Path) -> None:
    bank = tmp_path / "bank"
    # the first six of BENCHMARKS.md's P/D bank: three cross-DC scenarios (surge, link, surge), three CPU-only hosts
    _generate(bank, ("cross_dc_read_write", "cpu_decode_host"), 6, 600, seed=0)
    truths = [t for t in (json.loads(p.read_text()) for p in sorted(bank.glob("*/ground_truth.json")))
              if t["family"] == "cross_dc_read_write"]
    assert sorted(t["root_cause"]["kind"] for t in truths) == ["link", "load", "load"]
    for t in truths:
        model = t["details"]["model"]
        assert t["topology"][model]["link"] == "fibre-dc1-dc2"
        if t["root_cause"]["kind"] == "load":  # a tenant's surge, and the prefill pool it saturated
            assert t["root_cause"]["pool"] == f"{model} prefill pool"
    result = CliRunner().invoke(app, ["evaluate", str(bank), "--section", "pd", "--format", "json"])
    assert result.exit_code == 0, result.output
    pd = json.loads(result.stdout)["pd"]
    assert pd["within_tolerance"] == pd["cases"] == 3
    rca = pd["rca"]
    assert rca["cases"] == 3
    assert rca["infertrace"]["ac@1"] >= 2 / 3  # measured 1.0 (the twelve-scenario bank: 1.0, BARO-style 0.33)
    assert rca["infertrace"]["ac@1"] > rca["highest_own_anomaly"]["ac@1"]
    assert rca["pool_named"] == {**rca["pool_named"], "cases": 2, "named": 2}


@pytest.mark.slow
def test_rca_names_the_prefill_pool_when_its_machine_slows_and_the_tenant_when_its_long_prompts_fill_it(
        tmp_path: Path) -> None:
    bank = tmp_path / "bank"
    # the first two of BENCHMARKS.md's seed-7 bank: a surge into the prefill pool, then the pool slowing ×2.96
    _generate(bank, "cross_dc_read_write", 2, 600, seed=7)
    truths = {t["scenario"]: t for t in (json.loads(p.read_text()) for p in bank.glob("*/ground_truth.json"))}
    slowed = truths["001-cross_dc_read_write"]
    model = slowed["details"]["model"]
    assert slowed["details"]["mode"] == "prefill_pool_slowdown" and slowed["fault"]["kind"] == "instance_slowdown"
    assert slowed["root_cause"] == {**slowed["root_cause"], "kind": "engine", "pool": f"{model} prefill pool",
                                    "instances": [f"{model}-prefill-0"]}
    result = CliRunner().invoke(app, ["evaluate", str(bank), "--section", "pd", "--format", "json"])
    assert result.exit_code == 0, result.output
    rca = json.loads(result.stdout)["pd"]["rca"]
    row = next(r for r in rca["scenarios"] if r["scenario"] == "001-cross_dc_read_write")
    assert row["top"] == f"{model} prefill pool" and row["hit@1"] == 1.0
    pool = next(p for p in rca["pool_named"]["scenarios"] if p["scenario"] == "001-cross_dc_read_write")
    assert pool["ok"] and pool["top_is_culprit"] and pool["named"] == f"{model} prefill pool"
    # 000: tenant-c's 12k-token prompts (some longer than the prefill worker accepts) fill llama-3-8b's prefill
    # pool, its steps no slower for the work: the tenant's load, its blame through queueing at that pool
    surge = truths["000-cross_dc_read_write"]
    assert surge["root_cause"] == {**surge["root_cause"], "kind": "load", "tenant": "tenant-c",
                                   "pool": "llama-3-8b prefill pool"}
    row = next(r for r in rca["scenarios"] if r["scenario"] == "000-cross_dc_read_write")
    assert row["top"] == "load: tenant-c" and row["hit@1"] == 1.0, row
    pool = next(p for p in rca["pool_named"]["scenarios"] if p["scenario"] == "000-cross_dc_read_write")
    assert pool["ok"] and pool["named"] == "llama-3-8b prefill pool", pool
