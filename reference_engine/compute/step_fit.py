"""Fit the cost model to an engine's own steps, counted as `StepCostModel` counts them for that engine.

`calibration.py` fits rows of a benchmark (steps or whole requests, each with its tensor-parallel degree and
CUDA-graph setting, the all-reduce latencies fitted). A captured engine's steps (`infertrace replay --calibrate`)
and a published table's rows (`published.py`) need two things more: prefill micro-batches (each full micro-batch
reads the weights again) and, for a mixture of experts, the weights of only the experts a micro-batch's tokens
touch. Their all-reduce time is the interconnect's own model, not fitted. The six base parameters are fitted with
`calibration.fit_design`, the same optimiser, and the error is scored with `calibration.evaluate`, the
simulator's own `StepCostModel`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from reference_engine.compute.calibration import Calibration, Design, MeasuredRun, evaluate, fit_design, phase_of
from reference_engine.compute.real_executor import MeasuredStep
from reference_engine.engine.cost_model import CostParams, StepCostModel
from reference_engine.engine.hardware import HardwareSpec
from reference_engine.engine.models import ModelSpec

TP_CANDIDATES = (1, 2, 4, 8)

StepRow = tuple[MeasuredStep, ModelSpec, int]  # a measured step, its model, its tensor-parallel degree


class StepDesign(Design):
    """Per step, in seconds at 100% efficiency on its degree's devices: a full prefill micro-batch's linear FLOPs
    and weight bytes and how many full micro-batches there are; the same for the remainder (or the whole step
    without micro-batching) and whether there is one; attention FLOPs and KV bytes; the sequences in the step;
    the all-reduce time (the interconnect's own model); the collectives, their ring steps and their bytes' time;
    and the layers run eagerly (a prefill step's, under `eager_prefill`).

    Rows of two or more tensor-parallel degrees also fit the all-reduce latencies α and α_hop and the interconnect's
    efficiency (one degree alone cannot tell them from the step overhead and the linear layers, so there the
    interconnect's own model stays); `eager_prefill` fits
    the per-layer launch cost of steps with a prefill (an engine with CUDA graphs for decode-only steps)."""

    def __init__(self, rows: Sequence[StepRow], hw: HardwareSpec, microbatch: int = 0,
                 eager_prefill: bool = False) -> None:
        costs: dict[tuple[str, int], StepCostModel] = {}
        features = []
        for s, spec, tp in rows:
            key = (spec.name, tp)
            if key not in costs:
                costs[key] = StepCostModel(spec, hw, tensor_parallel=tp, prefill_microbatch=microbatch)
            cost = costs[key]
            flops, bw = hw.peak_flops * tp, hw.mem_bandwidth * tp
            device_params = spec.num_layers * spec.attention_params_per_layer + spec.head_params
            tokens = s.num_decodes + sum(n for n, _ in s.chunks)
            linear: list[float] = []
            batches = cost._microbatches(tokens, s.sampled)
            for count, n, sampled in batches if len(batches) == 2 else [(0, 0, 0.0), *batches]:
                touched = cost._experts_touched(n) * spec.num_layers * spec.expert_params_per_layer if count else 0.0
                linear += [(2 * n * spec.active_block_params + 2 * sampled * spec.head_params) / flops,
                           spec.bytes_per_weight * (device_params + touched) / bw if count else 0.0, count]
            pairs = s.decode_ctx + sum(n * c + n * (n + 1) // 2 for n, c in s.chunks)
            kv_tokens = s.decode_ctx + sum(c + n for n, c in s.chunks)
            passes = sum(count for count, _, _ in batches)
            collectives = 2 * spec.num_layers * passes if tp > 1 else 0
            ring_bytes = spec.hidden_size * spec.dtype_bytes * 2 * (tp - 1) / tp
            features.append((*linear, 4 * spec.num_layers * spec.num_heads * spec.head_dim * pairs / flops,
                             spec.kv_bytes_per_token * kv_tokens / bw, s.num_decodes + len(s.chunks),
                             cost.allreduce_seconds(tokens), collectives, 2 * (tp - 1),
                             2 * spec.num_layers * passes * tokens * ring_bytes / hw.interconnect_bandwidth,
                             spec.num_layers * passes if s.chunks else 0))
        self.f = np.asarray(features, dtype=np.float64).reshape(-1, 14)
        self.group = np.arange(len(rows))
        self.rows = len(rows)
        self.fit_launch = eager_prefill
        self.fit_allreduce = len({tp for _, _, tp in rows if tp > 1}) >= 2
        self.names = (*self.BASE, *(("layer_launch_s",) if self.fit_launch else ()),
                      *(("allreduce_latency_s", "allreduce_hop_latency_s", "interconnect_efficiency")
                        if self.fit_allreduce else ()))

    def seconds(self, x: np.ndarray) -> np.ndarray:
        v = dict(zip(self.names, np.exp(x), strict=True))
        f = self.f
        allreduce = (f[:, 10] * (v["allreduce_latency_s"] + v["allreduce_hop_latency_s"] * f[:, 11])
                     + f[:, 12] / v["interconnect_efficiency"] if self.fit_allreduce else f[:, 9])
        return (f[:, 2] * np.maximum(f[:, 0] / v["compute_efficiency"], f[:, 1] / v["memory_efficiency"])
                + f[:, 5] * np.maximum(f[:, 3] / v["compute_efficiency"], f[:, 4] / v["memory_efficiency"])
                + np.maximum(f[:, 6] / v["attention_efficiency"], f[:, 7] / v["kv_memory_efficiency"])
                + v["step_overhead_s"] + v["per_sequence_overhead_s"] * f[:, 8] + allreduce
                + (v["layer_launch_s"] * f[:, 13] if self.fit_launch else 0.0))


class RunDesign(StepDesign):
    """Measured sums of steps (a request's prefill steps, its decode steps): `runs`, a 0/1 matrix of runs × steps,
    says which steps each measured time covers."""

    def __init__(self, rows: Sequence[StepRow], runs: Any, hw: HardwareSpec, microbatch: int = 0) -> None:
        super().__init__(rows, hw, microbatch)
        self.runs = runs
        self.rows = runs.shape[0]

    def seconds(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.runs @ super().seconds(x))


def fit_rows(rows: Sequence[StepRow], hw: HardwareSpec, microbatch: int = 0,
             eager_prefill: bool = False,
             prior: dict[str, tuple[float, float]] | None = None) -> tuple[CostParams, float]:
    """The CostParams minimising the relative error over measured steps (of any models and degrees), prefill and
    decode steps weighted equally; and the fit's cost. `eager_prefill`: the engine ran steps with a prefill without
    CUDA graphs (their launch cost is fitted). `prior`: a maximum a posteriori fit (`calibration.fit_design`)."""
    design = StepDesign(rows, hw, microbatch, eager_prefill)
    if len(rows) < len(design.names):
        raise ValueError(f"need at least {len(design.names)} measured steps to fit {len(design.names)} parameters, "
                         f"got {len(rows)}")
    measured = np.array([s.duration_ns / 1e9 for s, _, _ in rows])
    return fit_design(design, measured, np.array([phase_of(s) for s, _, _ in rows]), hw, prior=prior)


def fit_steps(steps: Sequence[MeasuredStep], spec: ModelSpec, hw: HardwareSpec, tensor_parallel: int = 1,
              microbatch: int = 0, prior: dict[str, tuple[float, float]] | None = None) -> Calibration:
    """Fit `CostParams` to one engine's measured steps (`tensor_parallel` devices, prefills split into
    `microbatch`-token micro-batches, 0: none); the error through the simulator's cost model. `prior`: a maximum a
    posteriori fit, for steps whose shapes are estimates or that leave parameters unconstrained."""
    params, _ = fit_rows([(s, spec, tensor_parallel) for s in steps], hw, microbatch, prior=prior)
    runs = [MeasuredRun((s,), s.duration_ns, tensor_parallel, True, phase_of(s)) for s in steps]
    phases, median = evaluate(runs, spec, hw, params, microbatch)
    return Calibration(spec.name, hw.name, params, phases, median)


def fit_tensor_parallel(steps: Sequence[MeasuredStep], spec: ModelSpec,
                        hw: HardwareSpec) -> tuple[int, dict[int, float]]:
    """The tensor-parallel degree whose fit explains the measured steps best (lowest fit cost), and each
    candidate's cost. Efficiencies absorb most of a degree's scaling: what tells degrees apart is the all-reduce
    term and the efficiencies' ceiling of 1, so read the costs, not only the winner."""
    costs = {tp: fit_rows([(s, spec, tp) for s in steps], hw)[1] for tp in TP_CANDIDATES}
    return min(costs, key=lambda tp: (costs[tp], tp)), costs
