"""MoE experts in host memory: streamed over PCIe per prefill micro-batch or computed on the host CPU, whichever
is faster; the deployment story of docs/cost_model.md reproduced from exported spans, and the roofline
analyzer's diagnosis and fix checked against the engine."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertrace import semconv as sc
from infertrace.analyzers.roofline import PrefillRoofline, analyze_prefill_roofline
from infertrace.cli import app
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.cost_model import StepCostModel
from reference_engine.engine.hardware import hardware
from reference_engine.engine.llm_engine import num_kv_blocks
from reference_engine.engine.models import model
from reference_engine.fleet.config import FleetFileError, FleetSpec, parse_fleet
from reference_engine.scenarios.bank import TRACES_FILE, run_scenario
from reference_engine.scenarios.families import OFFLOAD_STORY_MODEL, Scenario, make_scenario
from tests.fleet_traces import Traces

MIXTRAL_Q4, L4 = model("mixtral-8x7b-q4_k"), hardware("L4")


def _story(tmp: Path, name: str, **engine: object) -> tuple[PrefillRoofline, Path]:
    """The moe_offload_prefill scenario on a fleet of its own, its story model's engine options replaced by
    `engine`; returns the roofline analyzer's result for that engine, from the exported and ingested spans."""
    scenario: Scenario = make_scenario("moe_offload_prefill", 1, duration_s=300, fleet=FleetSpec("offload", "local",
                                                                                                 (), ()))
    if engine:
        models = tuple(dataclasses.replace(m, engine={**{k: v for k, v in m.engine.items() if k != "offload_experts"},
                                                      **engine}) for m in scenario.fleet.models)
        scenario = dataclasses.replace(scenario, fleet=dataclasses.replace(scenario.fleet, models=models))
    run_scenario(scenario, tmp / name)
    ingest_paths(tmp / f"store-{name}", [tmp / name / TRACES_FILE])
    with Store.open(tmp / f"store-{name}") as store:
        (result,) = [e for e in analyze_prefill_roofline(store).engines if e.model == OFFLOAD_STORY_MODEL]
    return result, tmp / name / TRACES_FILE


def test_large_prefill_micro_batches_stream_host_experts_over_pcie_and_decodes_compute_them_on_the_host() -> None:
    cost = StepCostModel(MIXTRAL_Q4, L4, cpu_moe_layers=32, prefill_microbatch=1024)
    prefill = cost.offload(4096, 1)
    assert prefill is not None and (prefill.streamed_microbatches, prefill.host_microbatches) == (4, 0)
    # Each 1024-token micro-batch touches all 8 experts of every offloaded layer and copies them once.
    assert prefill.host_link_bytes == pytest.approx(4 * 32 * MIXTRAL_Q4.expert_layer_bytes, rel=1e-6)
    assert prefill.transfer_s == pytest.approx(prefill.host_link_bytes / L4.host_link_bandwidth)
    decode = cost.offload(1, 1)
    assert decode is not None and (decode.streamed_microbatches, decode.host_microbatches, decode.host_link_bytes) == (
        0, 1, 0)
    assert decode.host_compute_s > 0


def test_the_micro_batch_size_sets_prefill_speed_when_experts_are_streamed() -> None:
    small = StepCostModel(MIXTRAL_Q4, L4, cpu_moe_layers=32, prefill_microbatch=128).step_seconds([(4096, 0)], 0, 0, 1)
    large = StepCostModel(MIXTRAL_Q4, L4, cpu_moe_layers=32, prefill_microbatch=1024).step_seconds([(4096, 0)], 0, 0,
                                                                                                   1)
    on_gpu = StepCostModel(MIXTRAL_Q4, L4, prefill_microbatch=1024).step_seconds([(4096, 0)], 0, 0, 1)
    assert small > 6 * large > 6 * on_gpu  # 32 copies of the experts against 4, against none


def test_expert_layers_moved_to_the_host_free_device_memory_for_kv_blocks() -> None:
    blocks = [num_kv_blocks(EngineConfig(model="mixtral-8x7b-q4_k", hardware="L4", cpu_moe_layers=k), MIXTRAL_Q4)
              for k in (8, 16, 32)]
    assert blocks[0] < blocks[1] < blocks[2]
    per_layer = MIXTRAL_Q4.expert_layer_bytes / (MIXTRAL_Q4.kv_bytes_per_token * 16)
    assert blocks[1] - blocks[0] == pytest.approx(8 * per_layer, abs=1)
    with pytest.raises(ValueError, match="does not fit"):
        num_kv_blocks(EngineConfig(model="mixtral-8x7b-q4_k", hardware="L4"), MIXTRAL_Q4)


@pytest.mark.parametrize("options, message", [
    ({"model": "llama-3-8b", "cpu_moe_layers": 4}, "dense"),
    ({"model": "mixtral-8x7b", "cpu_moe_layers": 40}, r"\[0, 32\]"),
    ({"model": "mixtral-8x7b", "cpu_moe_layers": (3, 3)}, "each listed once"),
    ({"model": "mixtral-8x7b", "cpu_moe_layers": (0, 32)}, "0..31"),
    ({"model": "mixtral-8x7b", "cpu_moe_layers": 2, "offload_experts": True}, "not both"),
])
def test_an_impossible_expert_placement_is_refused_with_the_reason(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**options)


def test_a_fleet_file_places_expert_layers_by_count_or_by_index() -> None:
    raw = {"name": "f", "model": [{"name": "mixtral-8x7b", "engine": {"cpu_moe_layers": [1, 5, 9]}}],
           "tenant": [{"name": "t"}]}
    config = parse_fleet(raw).models[0].engine_config("m-0")
    assert config.host_expert_layers() == (1, 5, 9) and config.cost_model().cpu_moe_layers == 3
    raw["model"][0]["engine"] = {"cpu_moe_layers": [40]}
    with pytest.raises(FleetFileError, match=r"model\[0\].engine: .*0\.\.31"):
        parse_fleet(raw)


def test_the_offload_story_prefills_below_200_tokens_per_s_and_about_800_after_its_fix(tmp_path: Path) -> None:
    """Mixtral-8x7B (4.5-bit) on one L4, every expert layer in host memory, 128-token micro-batches: each
    micro-batch copies 25 GB of experts over a 25 GB/s PCIe link, ≈ 1.1 s per 128 tokens. 1024-token micro-batches
    with 4 expert layers back on the GPU copy 22 GB per 1024 tokens, and the GPU computes them in ≈ 0.3 s."""
    before, trace = _story(tmp_path, "before")
    after, _ = _story(tmp_path, "after", prefill_microbatch=1024, cpu_moe_layers=28)
    assert before.steps >= 5 and after.steps >= 5
    assert before.measured_tokens_per_s < 200
    assert 0.85 * 800 < after.measured_tokens_per_s < 1.15 * 800
    assert after.measured_tokens_per_s > 4 * before.measured_tokens_per_s
    # Where the experts ran and what moved is on the exported step spans themselves.
    prefills = [s for s in Traces.read(trace).named(sc.SPAN_STEP)
                if s.resource[sc.ENGINE_MODEL] == OFFLOAD_STORY_MODEL and s.attrs[sc.STEP_PREFILL_TOKENS] >= 1024]
    assert prefills and all(s.resource[sc.ENGINE_CPU_MOE_LAYERS] == 32 for s in prefills)
    for s in prefills:
        a = s.attrs
        assert a[sc.STEP_OFFLOAD_STREAMED_MICROBATCHES] >= a[sc.STEP_PREFILL_TOKENS] // 128
        assert a[sc.STEP_OFFLOAD_HOST_LINK_BYTES] >= a[sc.STEP_OFFLOAD_STREAMED_MICROBATCHES] * 31 * (
            MIXTRAL_Q4.expert_layer_bytes)
        assert a[sc.STEP_OFFLOAD_TRANSFER_NS] > 0.8 * a[sc.STEP_DURATIONS_NS][0]


def test_the_roofline_analyzer_names_both_causes_and_predicts_its_fix_within_15_percent(tmp_path: Path) -> None:
    before, _ = _story(tmp_path, "before")
    assert before.diagnosis == "offloaded_experts"
    assert set(before.causes) == {"experts_offloaded", "microbatch_recopies_experts"}
    assert before.offload_share is not None and before.offload_share > 0.8
    assert before.host_link_bytes_per_s == pytest.approx(L4.host_link_bandwidth, rel=0.01)
    assert "128-token micro-batch copies the experts again" in before.evidence and "room for" in before.evidence
    assert before.recommended_microbatch_tokens is not None and before.recommended_microbatch_tokens >= 1024
    assert before.recommended_cpu_moe_layers is not None and before.recommended_cpu_moe_layers < 32
    assert before.fix_tokens_per_s is not None
    fixed, _ = _story(tmp_path, "fixed", prefill_microbatch=before.recommended_microbatch_tokens,
                      cpu_moe_layers=before.recommended_cpu_moe_layers)
    assert abs(before.fix_tokens_per_s - fixed.measured_tokens_per_s) / fixed.measured_tokens_per_s < 0.15
    assert fixed.measured_tokens_per_s > 10 * before.measured_tokens_per_s


def test_simulate_places_expert_layers_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(app, ["simulate", "--model", "mixtral-8x7b-q4_k", "--hardware", "L4",
                                      "--cpu-moe-layers", "0,2,4,6,8,10,12,14", "--prefill-microbatch", "512",
                                      "--duration", "20", "--rate", "0.2", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    resources = [json.loads(line)["resourceSpans"][0]["resource"]["attributes"] for line in out.open()]
    assert {"key": sc.ENGINE_CPU_MOE_LAYERS, "value": {"intValue": "8"}} in resources[0]
    bad = CliRunner().invoke(app, ["simulate", "--model", "mixtral-8x7b", "--cpu-moe-layers", "a,b", "--duration",
                                   "1", "--out", str(tmp_path / "bad.jsonl"), "--no-progress"])
    assert bad.exit_code == 2 and "--cpu-moe-layers" in bad.output
