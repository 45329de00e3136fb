"""Calibration beyond one device and the built-in models: a declared or fitted tensor-parallel degree, a Hugging
Face config.json, and a published measurement table scored on the half it was not fitted to."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reference_engine.api import calibration_report, table_calibration_report
from reference_engine.compute.published import TABLES, load_table, split_halves
from reference_engine.engine.cost_model import StepCostModel
from reference_engine.engine.hardware import hardware
from reference_engine.engine.model_config import spec_from_hf_config
from reference_engine.engine.models import model


def test_a_hugging_face_config_gives_the_architecture_the_cost_model_reads(tmp_path: Path) -> None:
    spec = spec_from_hf_config(TABLES / "configs" / "llama-2-7b.config.json")
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (32, 4096, 32, 32,
                                                                                                     128)
    assert (spec.intermediate_size, spec.vocab_size, spec.dtype_bytes) == (11008, 32000, 2)
    mixtral = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
               "torch_dtype": "bfloat16"}
    assert spec_from_hf_config(mixtral, name="m").active_block_params == model("mixtral-8x7b").active_block_params
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 4096}))
    with pytest.raises(ValueError, match=r"config\.json: missing num_hidden_layers"):
        spec_from_hf_config(bad)


def _steps_csv(path: Path, tp: int) -> None:
    """Steps of llama-3-70b on H100s as the TP-`tp` cost model times them."""
    cost = StepCostModel(model("llama-3-70b"), hardware("H100-SXM"), tensor_parallel=tp)
    lines = ["phase,batch_size,prompt_tokens,context_tokens,measured_ms"]
    for batch in (1, 2, 4):
        for prompt in (128, 512, 2048, 4096):
            ms = cost.step_seconds([(prompt, 0)] * batch, 0, 0, batch) * 1e3
            lines.append(f"prefill,{batch},{prompt},0,{ms:.6f}")
    for batch in (1, 8, 32, 128):
        for context in (256, 1024, 4096):
            ms = cost.step_seconds([], batch, batch * context, batch) * 1e3
            lines.append(f"decode,{batch},0,{context},{ms:.6f}")
    path.write_text("\n".join(lines) + "\n")


def test_a_declared_tp_degree_fits_steps_of_that_degree_and_a_fitted_one_finds_it(tmp_path: Path) -> None:
    csv = tmp_path / "steps.csv"
    _steps_csv(csv, tp=4)
    report, text = calibration_report(csv, "llama-3-70b", "H100-SXM", tensor_parallel=4)
    assert report["tensor_parallel"] == 4 and report["median_error"] < 0.02
    fitted, text = calibration_report(csv, "llama-3-70b", "H100-SXM", tensor_parallel=None)
    assert fitted["tensor_parallel"] == 4, fitted["tensor_parallel_fit"]
    assert set(fitted["tensor_parallel_fit"]) == {"1", "2", "4", "8"}
    assert "(fitted:" in text


def test_the_published_table_is_split_into_halves_that_share_no_step_shape() -> None:
    doc, _specs, steps = load_table(TABLES / "lmdeploy_a100_fp16.json")
    assert doc["source"]["url"].startswith("https://github.com/InternLM/lmdeploy/")
    fit, held = split_halves(steps)
    assert abs(len(fit) - len(held)) <= 1 and len(fit) + len(held) == len(steps)
    assert not {(s.model, s.phase, s.shape) for s in fit} & {(s.model, s.phase, s.shape) for s in held}
    assert {s.tensor_parallel for s in held} == {1, 4}


def test_calibrating_on_the_published_table_reports_held_out_error_per_phase_and_tp_beside_the_roofline() -> None:
    report, text = table_calibration_report(Path("lmdeploy-a100"))
    groups = {(g["tensor_parallel"], g["phase"]): g for g in report["held_out"]}
    assert {(4, "prefill"), (4, "decode"), (None, "prefill"), (None, "decode")} <= set(groups)
    for g in groups.values():
        assert 0 <= g["calibrated_median_error"] < 1 and 0 <= g["roofline_median_error"] < 10
    assert "roofline median" in text and report["source"]["commit"]


def test_calibrate_tp_must_be_a_degree_or_fit() -> None:
    result = subprocess.run([sys.executable, "-m", "infertrace.cli", "calibrate", "--tp", "four"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "--tp" in result.stderr


@pytest.mark.parametrize("table", ["splitwise-a100", "splitwise-h100"])
def test_calibrating_on_a_published_tp_2_4_8_table_predicts_the_held_out_half_within_10_percent_per_phase(
        table: str) -> None:
    report, text = table_calibration_report(Path(table))
    assert report["source"]["url"].startswith("https://github.com/Mutinifni/splitwise-sim/blob/")
    groups = {(g["tensor_parallel"], g["phase"]): g for g in report["held_out"]}
    assert {tp for tp, _ in groups if tp is not None} == {2, 4, 8}
    for phase in ("prefill", "decode"):
        overall = groups[(None, phase)]
        assert overall["calibrated_median_error"] <= 0.10, text
        assert overall["calibrated_median_error"] < overall["roofline_median_error"], text
    # fitted from two or more degrees: the all-reduce latency is the table's, not the interconnect's default
    assert report["params"]["allreduce_latency_s"] is not None


def test_repeated_measurements_of_one_shape_are_one_step_and_a_prefill_shape_ignores_the_output_length() -> None:
    doc, _specs, steps = load_table(TABLES / "splitwise_h100_llama2_70b.json")
    rows = doc["models"]["llama-2-70b"]["rows"]
    assert len(rows) == 315 and {r[1] for r in rows} == {2, 4, 8}
    shapes = [(s.tensor_parallel, s.phase, s.shape) for s in steps]
    assert len(shapes) == len(set(shapes))
    prefills = [s for s in steps if s.phase == "prefill"]
    assert len(prefills) == 3 * 7 and all(s.shape[2] == 0 for s in prefills)
