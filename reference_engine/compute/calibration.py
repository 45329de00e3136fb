"""Calibrate the simulated executor's cost model against measured step times.

The roofline model (`cost_model.py`) has six free parameters, `CostParams`: the efficiencies of dense compute
(η_c), weight reads (η_m), attention FLOPs (η_a) and KV-cache reads (η_kv) relative to the hardware spec's
peaks, a per-step overhead and a per-sequence overhead.
Given measured steps (from the real executor, or a CSV of measured prefill and decode times), the fit minimises
the relative error, log(predicted / measured), with prefill and decode steps weighted equally however many of
each there are. The error is then reported per phase through `StepCostModel` itself, the code the simulator runs.

CSV columns (one measured configuration per row):

    phase          prefill or decode
    batch_size     sequences in the step
    prompt_tokens  prefill: new tokens each sequence computes (ignored for decode)
    context_tokens prefill: tokens each sequence already had cached; decode: context length of each sequence
    measured_ms    the measured step time
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reference_engine.compute.real_executor import MeasuredStep, RealExecutor
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.cost_model import CostParams, StepCostModel
from reference_engine.engine.hardware import HardwareSpec
from reference_engine.engine.models import ModelSpec
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class PhaseError:
    phase: str  # prefill: steps with any prefill chunk; decode: decode-only steps
    steps: int
    median_error: float  # of |predicted − measured| / measured
    p90_error: float
    median_measured_ms: float


@dataclass(frozen=True)
class Calibration:
    model: str
    hardware: str
    params: CostParams
    phases: tuple[PhaseError, ...]
    median_error: float  # over all steps

    def table(self) -> str:
        p = self.params
        lines = [f"Calibrated cost model for {self.model} on {self.hardware}:",
                 f"  compute_efficiency {p.compute_efficiency:.4g}  memory_efficiency {p.memory_efficiency:.4g}  "
                 f"attention_efficiency {p.attention_efficiency:.4g}  "
                 f"kv_memory_efficiency {p.kv_memory_efficiency or p.memory_efficiency:.4g}",
                 f"  step_overhead {p.step_overhead_s * 1e3:.3f} ms  "
                 f"per_sequence_overhead {p.per_sequence_overhead_s * 1e3:.3f} ms",
                 f"  {'phase':<8} {'steps':>6} {'median ms':>10} {'median err':>11} {'p90 err':>8}"]
        for e in self.phases:
            lines.append(f"  {e.phase:<8} {e.steps:>6} {e.median_measured_ms:>10.3f} {e.median_error:>11.1%} "
                         f"{e.p90_error:>8.1%}")
        lines.append(f"  all steps: median error {self.median_error:.1%}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "hardware": self.hardware, "params": asdict(self.params),
                           "median_error": self.median_error, "phases": [asdict(e) for e in self.phases]},
                          indent=2)


def load_cost_params(path: str | Path) -> CostParams:
    """Parameters from `Calibration.to_json()` output (or a bare CostParams object)."""
    data = json.loads(Path(path).read_text())
    return CostParams(**data.get("params", data))


# ------------------------------------------------------------------------------------------ measured steps
def steps_from_csv(path: str | Path) -> list[MeasuredStep]:
    steps = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"phase", "batch_size", "prompt_tokens", "context_tokens", "measured_ms"} - set(
            reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                phase, batch = row["phase"].strip(), int(row["batch_size"])
                prompt, context = int(row["prompt_tokens"] or 0), int(row["context_tokens"] or 0)
                ns = round(float(row["measured_ms"]) * 1e6)
            except (ValueError, TypeError, AttributeError) as e:
                raise ValueError(f"{path}:{line}: bad row {row!r}: {e}") from None
            if phase not in PHASES or batch < 1 or ns <= 0 or context < 0 or (phase == "prefill" and prompt < 1):
                raise ValueError(f"{path}:{line}: need phase prefill|decode, batch_size ≥ 1, measured_ms > 0, "
                                 f"prompt_tokens ≥ 1 for prefill; got {row!r}")
            if phase == "prefill":
                steps.append(MeasuredStep(((prompt, context),) * batch, 0, 0, batch, ns))
            else:
                steps.append(MeasuredStep((), batch, batch * max(context, 1), batch, ns))
    if not steps:
        raise ValueError(f"{path}: no measured rows")
    return steps


# -------------------------------------------------------------------------------------------- the fit
def predict_seconds(cost: StepCostModel, step: MeasuredStep) -> float:
    return cost.step_seconds(list(step.chunks), step.num_decodes, step.decode_ctx, step.sampled)


def _features(steps: Sequence[MeasuredStep], spec: ModelSpec, hw: HardwareSpec, tensor_parallel: int = 1,
              microbatch: int = 0) -> np.ndarray:
    """Per step, in seconds at 100% efficiency on the tensor-parallel degree's devices, as `StepCostModel` counts
    them: a full prefill micro-batch's linear FLOPs and weight bytes (the experts its tokens touch) and how many
    full micro-batches there are; the same for the remainder (or the whole step without micro-batching) and
    whether there is one; attention FLOPs and KV bytes; the sequences in the step; and the all-reduce time (not
    fitted: the interconnect's own model)."""
    per_pair = 4 * spec.num_layers * spec.num_heads * spec.head_dim
    attention_params = spec.num_layers * spec.attention_params_per_layer
    cost = StepCostModel(spec, hw, tensor_parallel=tensor_parallel)

    def linear(tokens: int, sampled: float) -> tuple[float, float]:
        touched = cost._experts_touched(tokens) * spec.num_layers * spec.expert_params_per_layer
        return (2 * tokens * spec.active_block_params + 2 * sampled * spec.head_params,
                spec.dtype_bytes * (attention_params + touched + spec.head_params))

    rows = []
    for s in steps:
        tokens = s.num_decodes + sum(n for n, _ in s.chunks)
        pairs = s.decode_ctx + sum(n * c + n * (n + 1) // 2 for n, c in s.chunks)
        kv_tokens = s.decode_ctx + sum(c + n for n, c in s.chunks)
        if microbatch and tokens > microbatch:
            full, rest = divmod(tokens, microbatch)
            per_mb_sampled = s.sampled / -(-tokens // microbatch)
            f_full, b_full = linear(microbatch, per_mb_sampled)
            f_rest, b_rest = linear(rest, per_mb_sampled) if rest else (0.0, 0.0)
        else:
            full, rest, f_full, b_full = 0, tokens, 0.0, 0.0
            f_rest, b_rest = linear(tokens, s.sampled)
        rows.append((f_full, b_full, full, f_rest, b_rest, 1.0 if rest else 0.0, per_pair * pairs,
                     spec.kv_bytes_per_token * kv_tokens, s.num_decodes + len(s.chunks),
                     cost.allreduce_seconds(tokens)))
    f = np.asarray(rows, dtype=np.float64).reshape(-1, 10)
    flops, bw = hw.peak_flops * tensor_parallel, hw.mem_bandwidth * tensor_parallel
    return f / np.array([flops, bw, 1.0, flops, bw, 1.0, flops, bw, 1.0, 1.0])


def _vector_seconds(x: np.ndarray, f: np.ndarray) -> np.ndarray:
    eta_c, eta_m, eta_a, eta_kv, overhead, per_sequence = np.exp(x)
    return (f[:, 2] * np.maximum(f[:, 0] / eta_c, f[:, 1] / eta_m) + f[:, 5] * np.maximum(f[:, 3] / eta_c,
                                                                                           f[:, 4] / eta_m)
            + np.maximum(f[:, 6] / eta_a, f[:, 7] / eta_kv) + overhead + per_sequence * f[:, 8] + f[:, 9])


def evaluate(steps: Sequence[MeasuredStep], spec: ModelSpec, hw: HardwareSpec,
             params: CostParams, tensor_parallel: int = 1, microbatch: int = 0) -> tuple[tuple[PhaseError, ...], float]:
    """Relative error of the simulator's cost model against measured steps, per phase and overall."""
    cost = StepCostModel(spec, hw, tensor_parallel=tensor_parallel, prefill_microbatch=microbatch, params=params)
    measured = np.array([s.duration_ns / 1e9 for s in steps])
    predicted = np.array([predict_seconds(cost, s) for s in steps])
    error = np.abs(predicted - measured) / measured
    is_prefill = np.array([s.is_prefill for s in steps])
    phases = []
    for phase, mask in (("prefill", is_prefill), ("decode", ~is_prefill)):
        if mask.any():
            phases.append(PhaseError(phase, int(mask.sum()), float(np.median(error[mask])),
                                     float(np.percentile(error[mask], 90)), float(np.median(measured[mask]) * 1e3)))
    return tuple(phases), float(np.median(error))


def calibrate(steps: Sequence[MeasuredStep], spec: ModelSpec, hw: HardwareSpec,
              phase: str | None = None, tensor_parallel: int = 1, microbatch: int = 0) -> Calibration:
    """Fit `CostParams` to measured steps (efficiencies in (0, 1], overhead ≥ 1 µs) of an instance of
    `tensor_parallel` devices; to one phase's steps only when `phase` is given."""
    if phase is not None:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        steps = [s for s in steps if s.is_prefill == (phase == "prefill")]
    if len(steps) < 6:
        raise ValueError(f"need at least 6 measured steps to fit 6 parameters, got {len(steps)}")
    params, _ = fit_params(_features(steps, spec, hw, tensor_parallel, microbatch),
                           np.array([s.duration_ns / 1e9 for s in steps]), np.array([s.is_prefill for s in steps]))
    phases, median = evaluate(steps, spec, hw, params, tensor_parallel, microbatch)
    return Calibration(spec.name, hw.name, params, phases, median)


def fit_params(f: np.ndarray, measured: np.ndarray, is_prefill: np.ndarray) -> tuple[CostParams, float]:
    """The CostParams minimising the relative error over steps with features `f` (`_features`), prefill and
    decode steps weighted equally; and the fit's cost."""
    from scipy.optimize import least_squares

    weight = np.where(is_prefill, 1 / np.sqrt(max(is_prefill.sum(), 1)), 1 / np.sqrt(max((~is_prefill).sum(), 1)))
    log_measured = np.log(measured)

    def residuals(x: np.ndarray) -> np.ndarray:
        return weight * (np.log(_vector_seconds(x, f)) - log_measured)

    lower = np.log([1e-7, 1e-7, 1e-7, 1e-7, 1e-6, 1e-9])
    upper = np.log([1.0, 1.0, 1.0, 1.0, 10.0, 1.0])
    overhead0 = float(np.min(measured))
    best = None
    for eta in (1.0, 0.1, 0.01, 0.001):
        for share in (0.9, 0.3):
            x0 = np.log([eta, eta, eta, eta, max(overhead0 * share, 2e-6), 1e-6])
            result = least_squares(residuals, np.clip(x0, lower + 1e-9, upper - 1e-9), bounds=(lower, upper),
                                   x_scale=1.0, loss="soft_l1", f_scale=0.1)
            if best is None or result.cost < best.cost:
                best = result
    assert best is not None
    eta_c, eta_m, eta_a, eta_kv, overhead, per_sequence = (float(v) for v in np.exp(best.x))
    params = CostParams(compute_efficiency=eta_c, memory_efficiency=eta_m, attention_efficiency=eta_a,
                        kv_memory_efficiency=eta_kv, step_overhead_s=overhead, per_sequence_overhead_s=per_sequence)
    return params, float(best.cost)


# ------------------------------------------------------------------------------- measuring the real executor
def calibration_requests(count: int, seed: int, max_prompt_tokens: int = 1024, max_output_tokens: int = 64,
                         spread_s: float = 0.5) -> list[Request]:
    """Prompts log-uniform in [16, max_prompt_tokens], outputs uniform in [4, max_output_tokens], arrivals
    uniform over `spread_s` seconds: steps of many shapes (lone prefills, batched decodes, mixtures)."""
    rng = np.random.default_rng(seed)
    prompts = np.exp(rng.uniform(np.log(16), np.log(max_prompt_tokens), count)).astype(int)
    outputs = rng.integers(4, max_output_tokens + 1, count)
    arrivals = np.sort(rng.uniform(0, spread_s, count))
    return [Request(f"cal-{seed}-{i:04d}", int(arrivals[i] * 1e9), Prompt(((f"cal-{seed}-{i}", int(prompts[i])),)),
                    int(outputs[i]), int(outputs[i])) for i in range(count)]


def measure(config: EngineConfig, requests: list[Request], executor: RealExecutor) -> list[MeasuredStep]:
    """Serve the requests on the real executor; returns its measured steps."""
    from reference_engine.engine.llm_engine import LLMEngine

    executor.record_steps = True
    first = len(executor.measured)
    executor.restart_clock()
    LLMEngine(config, executor).run(requests)
    return executor.measured[first:]


def calibration_configs(model: str, hardware: str, num_kv_blocks: int = 2048) -> list[EngineConfig]:
    """Prefill-first without chunking (lone and batched prefills, decode-only runs) and decode-first with a
    256-token budget (chunks mixed with decodes)."""
    common = {"model": model, "hardware": hardware, "num_kv_blocks": num_kv_blocks, "max_num_seqs": 32}
    return [EngineConfig(policy="prefill_first", max_num_batched_tokens=4096, **common),  # type: ignore[arg-type]
            EngineConfig(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=256,
                         **common)]  # type: ignore[arg-type]


def measure_calibration_run(executor: RealExecutor, model: str, hardware: str, seed: int,
                            requests: int = 48) -> list[MeasuredStep]:
    """One calibration run: the same kind of workload under both policies."""
    steps: list[MeasuredStep] = []
    for k, config in enumerate(calibration_configs(model, hardware, executor.kv.num_blocks)):
        steps += measure(config, calibration_requests(requests, seed * 2 + k), executor)
    return steps


# ----------------------------------------------------------------------------------------------- the report
TP_CANDIDATES = (1, 2, 4, 8)


def fit_tensor_parallel(steps: Sequence[MeasuredStep], spec: ModelSpec,
                        hw: HardwareSpec) -> tuple[int, dict[int, float]]:
    """The tensor-parallel degree whose fit explains the measured steps best (lowest fit cost), and each
    candidate's cost. Efficiencies absorb most of a degree's scaling: what tells degrees apart is the all-reduce
    term and the efficiencies' ceiling of 1, so read the costs, not only the winner."""
    measured = np.array([s.duration_ns / 1e9 for s in steps])
    is_prefill = np.array([s.is_prefill for s in steps])
    costs = {tp: fit_params(_features(steps, spec, hw, tp), measured, is_prefill)[1] for tp in TP_CANDIDATES}
    return min(costs, key=lambda tp: (costs[tp], tp)), costs


def calibration_report(csv: Path | None, model: str, hardware: str, *, backend: str = "numpy", device: str = "cpu",
                       dtype: str = "float32", threads: int = 0, requests: int = 48, per_phase: bool = False,
                       seed: int = 0, on_status: Callable[[str], None] | None = None, tensor_parallel: int | None = 1,
                       model_config: Path | None = None) -> tuple[dict[str, Any], str]:
    """Fit to a CSV of measured steps, or measure the real executor here (one run fitted, another held out);
    with `per_phase`, also fit prefill and decode steps apart. `tensor_parallel`: the instance's degree, or None
    to fit it (CSV only); `model_config`: a Hugging Face config.json instead of a built-in model. Returns
    (JSON-ready report, text)."""
    from reference_engine.engine.hardware import hardware as hardware_spec
    from reference_engine.engine.model_config import spec_from_hf_config
    from reference_engine.engine.models import model as model_spec

    spec = spec_from_hf_config(model_config) if model_config is not None else model_spec(model)
    hw = hardware_spec(hardware)
    held_out = None
    tp_costs: dict[int, float] = {}
    if csv is not None:
        steps = steps_from_csv(csv)
        if tensor_parallel is None:
            tensor_parallel, tp_costs = fit_tensor_parallel(steps, spec, hw)
    else:
        executor = RealExecutor(spec, 2048, 16, backend=backend, device=device, dtype=dtype, seed=seed,
                                threads=threads)
        if on_status is not None:
            on_status(f"measuring {model} on the real executor ({backend}, {device}, {dtype}): 2 runs × 2 "
                      f"policies × {requests} requests")
        steps = measure_calibration_run(executor, model, hardware, seed, requests)
        held_out = measure_calibration_run(executor, model, hardware, seed + 1, requests)
    tp = tensor_parallel or 1
    result = calibrate(steps, spec, hw, tensor_parallel=tp)
    phases = [calibrate(steps, spec, hw, phase, tensor_parallel=tp) for phase in PHASES] if per_phase else []
    report = json.loads(result.to_json())
    report["tensor_parallel"] = tp
    lines = [result.table(), f"  tensor parallel: {tp}"
             + (" (fitted: " + ", ".join(f"TP{k} cost {v:.3g}" for k, v in tp_costs.items()) + ")" if tp_costs
                else " (declared)")]
    if tp_costs:
        report["tensor_parallel_fit"] = {str(k): v for k, v in tp_costs.items()}
    if held_out is not None:
        errors, median = evaluate(held_out, spec, hw, result.params, tp)
        report["held_out"] = {"median_error": median, "phases": [asdict(e) for e in errors]}
        lines.append("  held-out run: " + ", ".join(
            f"{e.phase} median error {e.median_error:.1%} ({e.steps} steps)" for e in errors)
            + f"; all {median:.1%}")
    if phases:
        report["per_phase"] = {p.phases[0].phase: json.loads(p.to_json()) for p in phases if p.phases}
    for p in phases:
        if p.phases:
            lines.append(f"fitted to {p.phases[0].phase} steps alone: {p.table().splitlines()[1].strip()}; "
                         f"median error {p.median_error:.1%}")
    return report, "\n".join(lines)
