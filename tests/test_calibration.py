"""Calibration recovers the cost model's parameters from step times, reads measured CSVs strictly, and its output
drives the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from infertrace.cli import app
from reference_engine.compute.calibration import (
    calibrate,
    evaluate,
    load_cost_params,
    measure_calibration_run,
    predict_seconds,
    steps_from_csv,
)
from reference_engine.compute.real_executor import MeasuredStep, RealExecutor
from reference_engine.engine.cost_model import CostParams, StepCostModel
from reference_engine.engine.hardware import hardware
from reference_engine.engine.models import model

SPEC, HW = model("llama-3-8b"), hardware("H100-SXM")


def synthetic_steps(params: CostParams, seed: int = 0) -> list[MeasuredStep]:
    """Step shapes like a serving engine's, timed by the cost model itself."""
    rng = np.random.default_rng(seed)
    cost = StepCostModel(SPEC, HW, params=params)
    steps = []
    for _ in range(120):
        chunks = tuple((int(rng.integers(16, 8192)), int(rng.integers(0, 4096)))
                       for _ in range(int(rng.integers(0, 3))))
        decodes = int(rng.integers(0 if chunks else 1, 128))
        ctx = decodes * int(rng.integers(64, 4096))
        step = MeasuredStep(chunks, decodes, ctx, decodes + len(chunks), 1)
        steps.append(MeasuredStep(chunks, decodes, ctx, decodes + len(chunks),
                                  round(predict_seconds(cost, step) * 1e9)))
    return steps


def test_fitting_steps_timed_by_known_parameters_recovers_them() -> None:
    truth = CostParams(compute_efficiency=0.55, memory_efficiency=0.7, attention_efficiency=0.35,
                       step_overhead_s=0.002)
    result = calibrate(synthetic_steps(truth), SPEC, HW)
    assert result.median_error < 0.01
    assert {e.phase for e in result.phases} == {"prefill", "decode"}
    p = result.params
    assert p.compute_efficiency == pytest.approx(0.55, rel=0.05)
    assert p.memory_efficiency == pytest.approx(0.7, rel=0.05)
    assert p.step_overhead_s == pytest.approx(0.002, rel=0.05)


def test_a_fit_to_one_phase_uses_only_that_phases_steps() -> None:
    result = calibrate(synthetic_steps(CostParams()), SPEC, HW, phase="decode")
    assert [e.phase for e in result.phases] == ["decode"]
    with pytest.raises(ValueError, match="phase"):
        calibrate(synthetic_steps(CostParams()), SPEC, HW, phase="both")


def test_default_parameters_mispredict_steps_timed_by_others() -> None:
    steps = synthetic_steps(CostParams(compute_efficiency=0.2, memory_efficiency=0.3, step_overhead_s=0.01))
    _, median = evaluate(steps, SPEC, HW, CostParams())
    assert median > 0.3


def test_a_measured_csv_becomes_prefill_and_decode_steps(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("phase,batch_size,prompt_tokens,context_tokens,measured_ms\n"
                    "prefill,2,512,128,40.5\ndecode,32,0,1024,12.25\n")
    prefill, decode = steps_from_csv(path)
    assert prefill == MeasuredStep(((512, 128), (512, 128)), 0, 0, 2, 40_500_000)
    assert decode == MeasuredStep((), 32, 32 * 1024, 32, 12_250_000)


@pytest.mark.parametrize("row, message", [
    ("prefill,1,0,0,10", "prompt_tokens"),
    ("decode,0,0,10,10", "batch_size"),
    ("verify,1,1,1,1", "phase"),
    ("decode,1,0,10,fast", "bad row"),
])
def test_a_bad_csv_row_is_named_by_its_line(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "m.csv"
    path.write_text(f"phase,batch_size,prompt_tokens,context_tokens,measured_ms\ndecode,1,0,10,5\n{row}\n")
    with pytest.raises(ValueError, match=f"m.csv:3: .*{message}"):
        steps_from_csv(path)


def test_calibrate_command_writes_parameters_that_simulate_reads(tmp_path: Path) -> None:
    truth = CostParams(compute_efficiency=0.5, memory_efficiency=0.6, attention_efficiency=0.4,
                       step_overhead_s=0.003)
    csv = tmp_path / "m.csv"
    cost = StepCostModel(SPEC, HW, params=truth)
    rows = ["phase,batch_size,prompt_tokens,context_tokens,measured_ms"]
    for n in (128, 512, 1024, 2048, 4096, 8192):
        rows.append(f"prefill,1,{n},0,{cost.step_seconds([(n, 0)], 0, 0, 1) * 1e3}")
    for b in (1, 8, 32, 64, 128, 256):
        rows.append(f"decode,{b},0,1024,{cost.step_seconds([], b, b * 1024, b) * 1e3}")
    csv.write_text("\n".join(rows) + "\n")
    params = tmp_path / "params.json"
    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", "--csv", str(csv), "--model", "llama-3-8b", "--hardware", "H100-SXM",
                                 "--out", str(params), "--per-phase"])
    assert result.exit_code == 0, result.output
    assert "prefill" in result.output and "decode" in result.output
    report = json.loads(params.read_text())
    assert report["median_error"] < 0.01 and set(report["per_phase"]) == {"prefill", "decode"}
    assert load_cost_params(params).step_overhead_s == pytest.approx(0.003, rel=0.05)
    trace = tmp_path / "t.jsonl"
    result = runner.invoke(app, ["simulate", "--duration", "2", "--rate", "2", "--cost-params", str(params),
                                 "--out", str(trace), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert trace.stat().st_size > 0


def test_calibrate_command_rejects_a_missing_csv(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", "--csv", str(tmp_path / "none.csv")])
    assert result.exit_code == 2


@pytest.mark.slow
def test_the_real_executors_steps_fit_the_cost_model_roughly() -> None:
    """A quick, noisy check on a shared CPU; the benchmark reports the real figure on a held-out run."""
    executor = RealExecutor(model("tiny"), 512, 16, threads=1)
    steps = measure_calibration_run(executor, "tiny", "CPU-host", seed=0, requests=10)
    assert {s.is_prefill for s in steps} == {True, False}
    result = calibrate(steps, model("tiny"), hardware("CPU-host"))
    assert result.median_error < 0.5
    assert all(v > 0 for v in vars(result.params).values() if v is not None)  # None: a term not fitted here


def _memory_bound_steps(params: CostParams, seed: int = 0) -> list[MeasuredStep]:
    """Decode batches and short chunks: at most 192 tokens a step, every one paced by its weight reads (llama-3-8b
    on an H100 turns compute-bound near 250 tokens at these efficiencies)."""
    rng = np.random.default_rng(seed)
    cost = StepCostModel(SPEC, HW, params=params)
    steps = []
    for _ in range(100):
        chunks = tuple((int(rng.integers(16, 64)), int(rng.integers(0, 2048))) for _ in range(int(rng.integers(0, 2))))
        decodes = int(rng.integers(1, 128))
        ctx = decodes * int(rng.integers(64, 4096))
        step = MeasuredStep(chunks, decodes, ctx, decodes + len(chunks), 1)
        steps.append(MeasuredStep(chunks, decodes, ctx, decodes + len(chunks),
                                  round(predict_seconds(cost, step) * 1e9)))
    return steps


def _fit_with_prior(steps: list[MeasuredStep], prior: dict[str, tuple[float, float]]) -> CostParams:
    from reference_engine.compute.calibration import PHASES, fit_design, phase_of
    from reference_engine.compute.step_fit import StepDesign

    design = StepDesign([(s, SPEC, 1) for s in steps], HW)
    phases = np.array([phase_of(s) for s in steps])
    assert set(phases) <= set(PHASES)
    params, _ = fit_design(design, np.array([s.duration_ns / 1e9 for s in steps]), phases, HW, prior=prior)
    return params


def test_a_parameter_no_measured_step_constrains_takes_the_prior_and_one_they_constrain_ignores_it() -> None:
    """A maximum a posteriori fit: steps that never run compute-bound say nothing of the compute efficiency but a
    lower bound, so it lands on the prior's value (without the prior, on whichever start the optimiser tried); a
    compute-bound step constrains it, and the prior then does not pull it off the measured value."""
    from reference_engine.compute.calibration import datasheet_prior

    truth = CostParams(compute_efficiency=0.45, memory_efficiency=0.6, attention_efficiency=0.35,
                       step_overhead_s=0.003)
    prior = {**datasheet_prior(), "compute_efficiency": (0.55, float(np.log(2)))}
    steps = _memory_bound_steps(truth)
    fitted = _fit_with_prior(steps, prior)
    assert fitted.compute_efficiency == pytest.approx(0.55, rel=0.01)
    _, median = evaluate(steps, SPEC, HW, fitted)
    assert median < 0.005  # the prior costs the fit nothing where the steps do not constrain it

    with_long_prefills = steps + synthetic_steps(truth)[:40]
    fitted = _fit_with_prior(with_long_prefills, prior)
    assert fitted.compute_efficiency == pytest.approx(0.45, rel=0.02)
    assert fitted.memory_efficiency == pytest.approx(0.6, rel=0.02)
    assert fitted.step_overhead_s == pytest.approx(0.003, rel=0.05)
