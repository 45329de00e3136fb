"""Uncalibrated and calibrated error of the simulated cost model against a published multi-GPU table.

The table: NVIDIA's NeMo Framework inference results for Llama-2-7B (tests/fixtures/nemo_llama2_7b_tp_latency.csv,
citation in its header): request latency of 1–8 requests of 128 prompt tokens and 20 output tokens on 1, 2, 4
and 8 A100 80GB SXM4 or H100 80GB HBM3 GPUs with tensor parallelism. Per hardware and TP degree it prints the
median signed error (predicted − measured) / measured of

- before: the previous communication model (one fixed latency per collective, 8 µs on H100 and 10 µs on A100,
  no ring-step latency, no floor, NVLink at line rate; no kernel-launch cost);
- after: the defaults (NCCL's ring latency model with a 10 µs floor, per-layer launch cost without CUDA graphs);
- calibrated: `calibrate` fitted to the other TP degrees' rows of the same hardware, predicting this one.

    .venv/bin/python benchmarks/bench_tp_fidelity.py
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from reference_engine.compute.calibration import MeasuredRun, calibrate, cost_model_for, predict_seconds, steps_from_csv
from reference_engine.engine.cost_model import CostParams
from reference_engine.engine.hardware import hardware
from reference_engine.engine.models import model

TABLE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nemo_llama2_7b_tp_latency.csv"
PREVIOUS_LATENCY_S = {"H100-SXM": 8e-6, "A100-80GB": 10e-6}  # the per-collective latency the specs had


def previous_params(hw: str) -> CostParams:
    """CostParams that reproduce the previous all-reduce model: latency + bytes at line rate, nothing else."""
    return CostParams(allreduce_latency_s=PREVIOUS_LATENCY_S[hw], allreduce_hop_latency_s=0.0, allreduce_floor_s=0.0,
                      interconnect_efficiency=1.0)


def signed_errors(rows: list[MeasuredRun], hw_name: str, params: CostParams, graphs: bool | None) -> np.ndarray:
    """(predicted − measured) / measured per row; `graphs`: force CUDA graphs on or off (None: as measured)."""
    spec, hw = model("llama-2-7b"), hardware(hw_name)
    out = []
    for r in rows:
        cost = cost_model_for(spec, hw, params, r.tensor_parallel, r.cuda_graphs if graphs is None else graphs)
        measured = r.duration_ns / 1e9
        out.append((predict_seconds(cost, r) - measured) / measured)
    return np.array(out)


def main() -> None:
    start = time.perf_counter()
    spec = model("llama-2-7b")
    print(f"table: {TABLE.name} (NVIDIA NeMo Framework, Llama-2 inference performance, Llama-2-7B rows)")
    print("| hardware | TP | rows | before: median error | after (defaults): median error | calibrated on the "
          "other TP degrees: median error |")
    print("|---|---|---|---|---|---|")
    for hw_name in ("A100-80GB", "H100-SXM"):
        rows = steps_from_csv(TABLE, "llama-2-7b", hw_name)
        assert all(isinstance(r, MeasuredRun) for r in rows)
        for tp in (1, 2, 4, 8):
            mine = [r for r in rows if r.tensor_parallel == tp]
            before = signed_errors(mine, hw_name, previous_params(hw_name), graphs=True)
            after = signed_errors(mine, hw_name, CostParams(), graphs=None)
            fitted = calibrate([r for r in rows if r.tensor_parallel != tp], spec, hardware(hw_name)).params
            calibrated = signed_errors(mine, hw_name, fitted, graphs=None)
            print(f"| {hw_name} | {tp} | {len(mine)} | {np.median(before):+.1%} | {np.median(after):+.1%} | "
                  f"{np.median(calibrated):+.1%} |")
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
