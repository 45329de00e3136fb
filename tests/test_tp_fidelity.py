"""Multi-GPU communication and kernel launches against a published table (NVIDIA NeMo, Llama-2-7B on 1–8 A100 or
H100 GPUs: tests/fixtures/nemo_llama2_7b_tp_latency.csv), read from the engine's exported request spans."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infertrace import semconv as sc
from reference_engine.compute.calibration import (
    MeasuredRun,
    calibrate,
    cost_model_for,
    predict_seconds,
    steps_from_csv,
)
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.cost_model import CostParams
from reference_engine.engine.hardware import hardware
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.engine.models import model
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.tracer import EngineTracer, engine_resource
from tests.engine_runs import T0
from tests.fleet_traces import Traces

TABLE = Path(__file__).resolve().parent / "fixtures" / "nemo_llama2_7b_tp_latency.csv"
SPEC = model("llama-2-7b")
# What the hardware specs said before: one latency per collective, nothing per ring step, NVLink at line rate.
PREVIOUS = {"H100-SXM": CostParams(allreduce_latency_s=8e-6, allreduce_hop_latency_s=0.0, allreduce_floor_s=0.0,
                                   interconnect_efficiency=1.0),
            "A100-80GB": CostParams(allreduce_latency_s=10e-6, allreduce_hop_latency_s=0.0, allreduce_floor_s=0.0,
                                    interconnect_efficiency=1.0)}


def _rows(hw: str) -> list[MeasuredRun]:
    rows = steps_from_csv(TABLE, "llama-2-7b", hw)
    assert len(rows) == 16 and all(isinstance(r, MeasuredRun) for r in rows)
    return rows  # type: ignore[return-value]


def _latency_from_spans(tmp: Path, hw: str, row: MeasuredRun, params: CostParams, cuda_graphs: bool) -> float:
    """Serve the row's requests (all arriving at once) and read their end-to-end latency from the exported
    `llm_request` spans."""
    batch = len(row.steps[0].chunks)
    prompt, _ = row.steps[0].chunks[0]
    config = EngineConfig(model="llama-2-7b", hardware=hw, tensor_parallel=row.tensor_parallel,
                          cuda_graphs=cuda_graphs, cost=params, instance_id=f"tp{row.tensor_parallel}-b{batch}")
    path = tmp / f"{hw}-{config.instance_id}-{cuda_graphs}-{id(params)}.jsonl"
    writer = OtlpJsonLinesWriter(path)
    tracer = EngineTracer(writer, engine_resource(config), seed=1)
    output = len(row.steps)  # one token from the prefill step, one per decode step
    LLMEngine(config, observers=[tracer]).run(
        [Request(f"r{i}", T0, Prompt(((f"p{i}", prompt),)), output, output) for i in range(batch)])
    tracer.close()
    writer.close()
    latencies = {s.attrs[sc.LATENCY_E2E] for s in Traces.read(path).named(sc.SPAN_REQUEST)}
    assert len(latencies) == 1  # served together, the requests finish together
    return latencies.pop()


def _errors(tmp: Path, hw: str, rows: list[MeasuredRun], params: CostParams, cuda_graphs: bool | None) -> np.ndarray:
    out = []
    for r in rows:
        graphs = r.cuda_graphs if cuda_graphs is None else cuda_graphs
        latency = _latency_from_spans(tmp, hw, r, params, graphs)
        assert latency == pytest.approx(predict_seconds(cost_model_for(SPEC, hardware(hw), params, r.tensor_parallel,
                                                                       graphs), r), abs=2e-6)
        out.append((latency - r.duration_ns / 1e9) / (r.duration_ns / 1e9))
    return np.array(out)


@pytest.mark.parametrize("hw", ["A100-80GB", "H100-SXM"])
def test_the_default_communication_and_launch_costs_cut_the_previous_models_error_at_every_tp_degree(
        tmp_path: Path, hw: str) -> None:
    rows = _rows(hw)
    for tp in (1, 2, 4, 8):
        mine = [r for r in rows if r.tensor_parallel == tp]
        before = np.median(_errors(tmp_path, hw, mine, PREVIOUS[hw], cuda_graphs=True))
        after = np.median(_errors(tmp_path, hw, mine, CostParams(), cuda_graphs=None))
        assert before < after < 0, (tp, before, after)  # both optimistic, the defaults less so
        if tp == 8:
            assert before < -0.55  # the previous model: 55–65% optimistic at TP 8
        if tp > 1:
            assert abs(after) < 0.65 * abs(before), (tp, before, after)


def test_calibrate_fits_the_communication_costs_and_predicts_an_unseen_tp_degree_within_5_percent(
        tmp_path: Path) -> None:
    rows = _rows("H100-SXM")
    fit = calibrate([r for r in rows if r.tensor_parallel != 8], SPEC, hardware("H100-SXM"))
    p = fit.params
    assert p.allreduce_latency_s is not None and p.allreduce_hop_latency_s is not None
    assert fit.median_error < 0.03
    held_out = np.abs(_errors(tmp_path, "H100-SXM", [r for r in rows if r.tensor_parallel == 8], p, None))
    assert np.median(held_out) < 0.05


def test_the_per_collective_cost_follows_nccls_ring_model_with_a_floor() -> None:
    from reference_engine.engine.cost_model import StepCostModel

    h100 = hardware("H100-SXM")
    floor_only = StepCostModel(SPEC, h100, tensor_parallel=2).allreduce_seconds(1) / (2 * SPEC.num_layers)
    assert floor_only == pytest.approx(10e-6)  # 6.6 + 2·0.6 µs < the 10 µs floor
    tp8 = StepCostModel(SPEC, h100, tensor_parallel=8).allreduce_seconds(1) / (2 * SPEC.num_layers)
    assert tp8 == pytest.approx(6.6e-6 + 14 * 0.6e-6 + 4096 * 2 * 2 * 7 / 8 / (450e9 * 0.82))
    big = StepCostModel(SPEC, h100, tensor_parallel=8).allreduce_seconds(8192) / (2 * SPEC.num_layers)
    assert big == pytest.approx(6.6e-6 + 14 * 0.6e-6 + 8192 * 4096 * 2 * 2 * 7 / 8 / (450e9 * 0.82))
    eager = StepCostModel(SPEC, h100, cuda_graphs=False).step_seconds([], 1, 129, 1)
    graphs = StepCostModel(SPEC, h100).step_seconds([], 1, 129, 1)
    assert eager - graphs == pytest.approx(SPEC.num_layers * 47e-6)
