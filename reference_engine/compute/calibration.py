"""Calibrate the simulated executor's cost model against measured step (or request) times.

The roofline model (`cost_model.py`) has six free parameters for one device, `CostParams`: the efficiencies of
dense compute (η_c), weight reads (η_m), attention FLOPs (η_a) and KV-cache reads (η_kv) relative to the
hardware spec's peaks, a per-step overhead and a per-sequence overhead. Measurements taken without CUDA graphs
add the per-layer launch cost; tensor-parallel measurements add the all-reduce latency α, its per-ring-step part
α_hop and its floor (docs/cost_model.md). Given measured times (from the real executor, or a CSV), the fit
minimises the relative error, log(predicted / measured), with each phase weighted equally however many rows it
has. The error is then reported per phase through `StepCostModel` itself, the code the simulator runs.

CSV columns (one measured configuration per row):

    phase           prefill, decode, or request (a whole request: its prefill step, then its decode steps)
    batch_size      sequences in the step (request: requests served together)
    prompt_tokens   prefill and request: new tokens each sequence computes (ignored for decode)
    context_tokens  prefill: tokens each sequence already had cached; decode: context length of each sequence
    measured_ms     the measured step time (request: the time from the start of its prefill to its last token)

and optionally:

    output_tokens    request: tokens generated per request (the first by the prefill step)
    tensor_parallel  tensor-parallel degree (default 1)
    cuda_graphs      true or false (default true)
    model, hardware  rows naming another model or hardware than the one calibrated are skipped
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

PHASES = ("prefill", "decode", "request")


@dataclass(frozen=True)
class MeasuredRun:
    """A measured time over the steps of one engine configuration: a whole request (its prefill step, then its
    decode steps, as a latency benchmark reports it), or a single step of a tensor-parallel engine or of one
    that runs without CUDA graphs."""

    steps: tuple[MeasuredStep, ...]  # the steps' shapes; their own duration_ns is not used
    duration_ns: int
    tensor_parallel: int = 1
    cuda_graphs: bool = True
    phase: str = "request"

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"


Measured = MeasuredStep | MeasuredRun


def phase_of(m: Measured) -> str:
    if isinstance(m, MeasuredRun):
        return m.phase
    return "prefill" if m.is_prefill else "decode"


def _run(m: Measured) -> MeasuredRun:
    return m if isinstance(m, MeasuredRun) else MeasuredRun((m,), m.duration_ns, phase=phase_of(m))


@dataclass(frozen=True)
class PhaseError:
    phase: str  # prefill: steps with any prefill chunk; decode: decode-only steps; request: whole requests
    steps: int  # measured rows
    median_error: float  # of |predicted − measured| / measured
    p90_error: float
    median_measured_ms: float


@dataclass(frozen=True)
class Calibration:
    model: str
    hardware: str
    params: CostParams
    phases: tuple[PhaseError, ...]
    median_error: float  # over all rows

    def table(self) -> str:
        p = self.params
        lines = [f"Calibrated cost model for {self.model} on {self.hardware}:",
                 f"  compute_efficiency {p.compute_efficiency:.4g}  memory_efficiency {p.memory_efficiency:.4g}  "
                 f"attention_efficiency {p.attention_efficiency:.4g}  "
                 f"kv_memory_efficiency {p.kv_memory_efficiency or p.memory_efficiency:.4g}",
                 f"  step_overhead {p.step_overhead_s * 1e3:.3f} ms  "
                 f"per_sequence_overhead {p.per_sequence_overhead_s * 1e3:.3f} ms  "
                 f"layer_launch {p.layer_launch_s * 1e6:.1f} µs"]
        if p.allreduce_latency_s is not None:
            lines.append(f"  all-reduce: latency {p.allreduce_latency_s * 1e6:.2f} µs + "
                         f"{(p.allreduce_hop_latency_s or 0) * 1e6:.2f} µs per ring step, "
                         f"floor {p.allreduce_floor_s * 1e6:.2f} µs")
        lines.append(f"  {'phase':<8} {'rows':>6} {'median ms':>10} {'median err':>11} {'p90 err':>8}")
        for e in self.phases:
            lines.append(f"  {e.phase:<8} {e.steps:>6} {e.median_measured_ms:>10.3f} {e.median_error:>11.1%} "
                         f"{e.p90_error:>8.1%}")
        lines.append(f"  all rows: median error {self.median_error:.1%}")
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
def request_steps(batch: int, prompt: int, output: int) -> tuple[MeasuredStep, ...]:
    """The steps of `batch` requests served together: one prefill step, then `output − 1` decode steps."""
    steps = [MeasuredStep(((prompt, 0),) * batch, 0, 0, batch, 0)]
    steps += [MeasuredStep((), batch, batch * (prompt + i), batch, 0) for i in range(1, output)]
    return tuple(steps)


_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def steps_from_csv(path: str | Path, model: str | None = None, hardware: str | None = None,
                   tensor_parallel: int = 1) -> list[Measured]:
    """Measured rows of a CSV (module docstring); with `model`/`hardware`, rows naming others are skipped;
    `tensor_parallel`: the degree of rows that do not give one."""
    steps: list[Measured] = []
    with open(path, newline="") as f:
        lines = [(number, text) for number, text in enumerate(f, start=1) if not text.startswith("#")]
        reader = csv.DictReader(text for _, text in lines)  # lines starting with # are comments (a citation)
        missing = {"phase", "batch_size", "prompt_tokens", "context_tokens", "measured_ms"} - set(
            reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        for row in reader:
            line = lines[reader.line_num - 1][0]
            if (model and row.get("model") not in (None, "", model)) or (
                    hardware and row.get("hardware") not in (None, "", hardware)):
                continue
            try:
                phase, batch = row["phase"].strip(), int(row["batch_size"])
                prompt, context = int(row["prompt_tokens"] or 0), int(row["context_tokens"] or 0)
                ns = round(float(row["measured_ms"]) * 1e6)
                output = int(row.get("output_tokens") or 0)
                tp = int(row.get("tensor_parallel") or tensor_parallel)
                graphs = _BOOLEANS[(row.get("cuda_graphs") or "true").strip().lower()]
            except (ValueError, TypeError, AttributeError, KeyError) as e:
                raise ValueError(f"{path}:{line}: bad row {row!r}: {e}") from None
            if (phase not in PHASES or batch < 1 or ns <= 0 or context < 0 or tp < 1
                    or (phase != "decode" and prompt < 1) or (phase == "request" and output < 1)):
                raise ValueError(f"{path}:{line}: need phase prefill|decode|request, batch_size ≥ 1, measured_ms > 0, "
                                 f"prompt_tokens ≥ 1 for prefill and request, output_tokens ≥ 1 for request, "
                                 f"tensor_parallel ≥ 1; got {row!r}")
            if phase == "request":
                steps.append(MeasuredRun(request_steps(batch, prompt, output), ns, tp, graphs))
                continue
            if phase == "prefill":
                step = MeasuredStep(((prompt, context),) * batch, 0, 0, batch, ns)
            else:
                step = MeasuredStep((), batch, batch * max(context, 1), batch, ns)
            steps.append(step if tp == 1 and graphs else MeasuredRun((step,), ns, tp, graphs, phase))
    if not steps:
        raise ValueError(f"{path}: no measured rows" + (f" for {model} on {hardware}" if model or hardware else ""))
    return steps


# -------------------------------------------------------------------------------------------- the fit
def predict_seconds(cost: StepCostModel, step: Measured) -> float:
    """The simulator's time for a measured row: a step, or the sum of a run's steps."""
    if isinstance(step, MeasuredStep):
        return cost.step_seconds(list(step.chunks), step.num_decodes, step.decode_ctx, step.sampled)
    return sum(cost.step_seconds(list(s.chunks), s.num_decodes, s.decode_ctx, s.sampled) for s in step.steps)


def cost_model_for(spec: ModelSpec, hw: HardwareSpec, params: CostParams, tensor_parallel: int = 1,
                   cuda_graphs: bool = True, prefill_microbatch: int = 0) -> StepCostModel:
    return StepCostModel(spec, hw, tensor_parallel=tensor_parallel, cuda_graphs=cuda_graphs,
                         prefill_microbatch=prefill_microbatch, params=params)


class Design:
    """Per step of every measured row, the cost model's terms at 100% efficiency and unit overheads, so that a
    parameter vector gives every row's predicted time in a few array operations:

        max(F_lin/Π, B_w/β)/η… + max(F_attn/Π, B_kv/β)/η… + t_step + t_seq·sequences + t_launch·layers
        + collectives · max(t_floor, α + ring_steps·α_hop + bytes/(B·η_net))
    """

    BASE = ("compute_efficiency", "memory_efficiency", "attention_efficiency", "kv_memory_efficiency",
            "step_overhead_s", "per_sequence_overhead_s")

    def __init__(self, measured: Sequence[Measured], spec: ModelSpec, hw: HardwareSpec, net_efficiency: float) -> None:
        per_pair = 4 * spec.num_layers * spec.num_heads * spec.head_dim
        weights = spec.bytes_per_weight * (spec.active_block_params + spec.head_params)
        rows, group = [], []
        for g, m in enumerate(measured):
            run = _run(m)
            tp = run.tensor_parallel
            ring_bytes = spec.hidden_size * spec.dtype_bytes * 2 * (tp - 1) / tp
            for s in run.steps:
                tokens = s.num_decodes + sum(n for n, _ in s.chunks)
                pairs = s.decode_ctx + sum(n * c + n * (n + 1) // 2 for n, c in s.chunks)
                kv_tokens = s.decode_ctx + sum(c + n for n, c in s.chunks)
                rows.append((
                    (2 * tokens * spec.active_block_params + 2 * s.sampled * spec.head_params) / (hw.peak_flops * tp),
                    weights / (hw.mem_bandwidth * tp), per_pair * pairs / (hw.peak_flops * tp),
                    spec.kv_bytes_per_token * kv_tokens / (hw.mem_bandwidth * tp), s.num_decodes + len(s.chunks),
                    0 if run.cuda_graphs else spec.num_layers, 2 * spec.num_layers if tp > 1 else 0, 2 * (tp - 1),
                    tokens * ring_bytes / (hw.interconnect_bandwidth * net_efficiency)))
                group.append(g)
        self.f = np.asarray(rows, dtype=np.float64)
        self.group = np.asarray(group)
        self.rows = len(measured)
        self.fit_launch = bool(self.f[:, 5].any())
        self.fit_allreduce = bool(self.f[:, 6].any())
        self.names = (*self.BASE, *(("layer_launch_s",) if self.fit_launch else ()),
                      *(("allreduce_latency_s", "allreduce_hop_latency_s", "allreduce_floor_s")
                        if self.fit_allreduce else ()))

    def seconds(self, x: np.ndarray) -> np.ndarray:
        v = dict(zip(self.names, np.exp(x), strict=True))
        f = self.f
        step = (np.maximum(f[:, 0] / v["compute_efficiency"], f[:, 1] / v["memory_efficiency"])
                + np.maximum(f[:, 2] / v["attention_efficiency"], f[:, 3] / v["kv_memory_efficiency"])
                + v["step_overhead_s"] + v["per_sequence_overhead_s"] * f[:, 4])
        if self.fit_launch:
            step = step + v["layer_launch_s"] * f[:, 5]
        if self.fit_allreduce:
            per = np.maximum(v["allreduce_floor_s"],
                             v["allreduce_latency_s"] + v["allreduce_hop_latency_s"] * f[:, 7] + f[:, 8])
            step = step + f[:, 6] * per
        return np.bincount(self.group, weights=step, minlength=self.rows)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lower = {"step_overhead_s": 1e-6, "per_sequence_overhead_s": 1e-9, "layer_launch_s": 1e-8,
                 "allreduce_latency_s": 1e-8, "allreduce_hop_latency_s": 1e-9, "allreduce_floor_s": 1e-8}
        upper = {"step_overhead_s": 10.0, "layer_launch_s": 1e-2, "allreduce_latency_s": 1e-2,
                 "allreduce_hop_latency_s": 1e-3, "allreduce_floor_s": 1e-2}
        return (np.log([lower.get(n, 1e-7) for n in self.names]), np.log([upper.get(n, 1.0) for n in self.names]))

    def params(self, x: np.ndarray, defaults: CostParams) -> CostParams:
        values = {n: float(v) for n, v in zip(self.names, np.exp(x), strict=True)}
        return CostParams(**{**asdict(defaults), **values})


def evaluate(steps: Sequence[Measured], spec: ModelSpec, hw: HardwareSpec, params: CostParams,
             prefill_microbatch: int = 0) -> tuple[tuple[PhaseError, ...], float]:
    """Relative error of the simulator's cost model against measured rows (of an engine splitting prefills into
    `prefill_microbatch`-token micro-batches, 0: none), per phase and overall."""
    models: dict[tuple[int, bool], StepCostModel] = {}
    measured = np.array([s.duration_ns / 1e9 for s in steps])
    predicted = []
    for s in steps:
        run = _run(s)
        key = (run.tensor_parallel, run.cuda_graphs)
        if key not in models:
            models[key] = cost_model_for(spec, hw, params, *key, prefill_microbatch)
        predicted.append(predict_seconds(models[key], s))
    error = np.abs(np.array(predicted) - measured) / measured
    phases_of = np.array([phase_of(s) for s in steps])
    phases = []
    for phase in PHASES:
        mask = phases_of == phase
        if mask.any():
            phases.append(PhaseError(phase, int(mask.sum()), float(np.median(error[mask])),
                                     float(np.percentile(error[mask], 90)), float(np.median(measured[mask]) * 1e3)))
    return tuple(phases), float(np.median(error))


def calibrate(steps: Sequence[Measured], spec: ModelSpec, hw: HardwareSpec,
              phase: str | None = None) -> Calibration:
    """Fit `CostParams` to measured rows (efficiencies in (0, 1], overhead ≥ 1 µs; the launch cost when some rows
    ran without CUDA graphs, the all-reduce latencies when some ran tensor-parallel); to one phase's rows only
    when `phase` is given."""
    if phase is not None:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        steps = [s for s in steps if phase_of(s) == phase]
    defaults = CostParams()
    design = Design(steps, spec, hw, defaults.interconnect_efficiency)
    if len(steps) < len(design.names):
        raise ValueError(f"need at least {len(design.names)} measured rows to fit {len(design.names)} parameters, "
                         f"got {len(steps)}")
    measured = np.array([s.duration_ns / 1e9 for s in steps])
    params, _ = fit_design(design, measured, np.array([phase_of(s) for s in steps]), hw)
    phases, median = evaluate(steps, spec, hw, params)
    return Calibration(spec.name, hw.name, params, phases, median)


ONE_SIDED_WEIGHT = 0.1  # of an over-prediction of a row that may be faster than the model for reasons of its own

# The roofline's datasheet prior (`CostParams`' defaults) and how far from it a parameter plausibly lies, as a
# standard deviation of its logarithm: efficiencies within a factor of 2 (published ones run 0.4–0.85), overheads
# within a factor of 10 (0.1–10 ms a step). Used by fits whose measurements may leave a parameter unconstrained.
PRIOR_LOG_SD = {"compute_efficiency": float(np.log(2)), "memory_efficiency": float(np.log(2)),
                "attention_efficiency": float(np.log(2)), "kv_memory_efficiency": float(np.log(2)),
                "step_overhead_s": float(np.log(10))}
# The relative error of one measured row that the prior's weight assumes (request sums fit to 0–10%)
PRIOR_ROW_NOISE = 0.05


def datasheet_prior() -> dict[str, tuple[float, float]]:
    """Parameter -> (prior value, standard deviation of its log): CostParams' defaults (η_kv: η_m's)."""
    d = CostParams()
    values = {"compute_efficiency": d.compute_efficiency, "memory_efficiency": d.memory_efficiency,
              "attention_efficiency": d.attention_efficiency, "kv_memory_efficiency": d.memory_efficiency,
              "step_overhead_s": d.step_overhead_s}
    return {n: (values[n], PRIOR_LOG_SD[n]) for n in values}


def fit_design(design: Design, measured: np.ndarray, phases_of: np.ndarray,
               hw: HardwareSpec, may_be_faster: np.ndarray | None = None,
               robust: bool = True, outlier_error: float | None = None,
               prior: dict[str, tuple[float, float]] | None = None) -> tuple[CostParams, float]:
    """The parameters of `design` minimising the relative error against the measured seconds (each phase weighted
    equally however many rows it has), the rest at their defaults; and the fit's cost. `may_be_faster`: rows whose
    measured time may be shorter than the model's for a reason it does not see (a prefill that hit a prefix cache
    no telemetry reported): their over-predictions weigh `ONE_SIDED_WEIGHT`, so the fit follows the others.
    `robust`: large relative errors weigh linearly (soft L1), not squared; from `outlier_error` (a relative error;
    None: the residual 0.1, weights included).

    `prior` (parameter -> (value, standard deviation of its log), e.g. `datasheet_prior()`): a maximum a posteriori
    fit. Each named parameter's log adds the residual w·(log x − log value)/sd, w = PRIOR_ROW_NOISE/√rows: with
    each phase's rows weighted 1/√(its rows), that is a Gaussian prior against rows of PRIOR_ROW_NOISE relative
    error, so the prior's pull shrinks as more rows constrain a parameter and decides it where none does (compute
    efficiency when no measured step was compute-bound)."""
    from scipy.optimize import least_squares

    defaults = CostParams()
    counts = {p: int((phases_of == p).sum()) for p in PHASES}
    weight = np.array([1 / np.sqrt(counts[p]) for p in phases_of])
    log_measured = np.log(measured)
    priors = [(i, np.log(prior[n][0]), prior[n][1]) for i, n in enumerate(design.names) if prior and n in prior]
    prior_index = np.array([i for i, _, _ in priors], dtype=int)
    prior_mean = np.array([m for _, m, _ in priors])
    prior_weight = PRIOR_ROW_NOISE / np.sqrt(max(len(measured), 1)) / np.array([sd for _, _, sd in priors])

    def residuals(x: np.ndarray) -> np.ndarray:
        r = weight * (np.log(design.seconds(x)) - log_measured)
        r = r if may_be_faster is None else np.where(may_be_faster & (r > 0), ONE_SIDED_WEIGHT * r, r)
        return np.concatenate([r, prior_weight * (x[prior_index] - prior_mean)]) if priors else r

    lower, upper = design.bounds()
    f_scale = 0.1 if outlier_error is None else outlier_error * float(np.median(weight))
    overhead0 = float(np.min(measured))
    extra0 = {"layer_launch_s": defaults.layer_launch_s, "allreduce_latency_s": hw.interconnect_latency_s,
              "allreduce_hop_latency_s": hw.interconnect_hop_latency_s, "allreduce_floor_s": defaults.allreduce_floor_s,
              "interconnect_efficiency": defaults.interconnect_efficiency}
    starts = [{n: eta for n in design.BASE[:4]} | {
        "step_overhead_s": max(overhead0 * share, 2e-6), "per_sequence_overhead_s": 1e-6} | extra0
        for eta in (1.0, 0.1, 0.01, 0.001) for share in (0.9, 0.3)]
    # and the roofline's defaults: where measured times are sums of many steps (a request's), the smallest is no
    # guide to one step's overhead
    starts.append({"compute_efficiency": defaults.compute_efficiency, "memory_efficiency": defaults.memory_efficiency,
                   "attention_efficiency": defaults.attention_efficiency,
                   "kv_memory_efficiency": defaults.memory_efficiency, "step_overhead_s": defaults.step_overhead_s,
                   "per_sequence_overhead_s": 1e-6} | extra0)
    best = None
    for start in starts:
        x0 = np.log([start[n] for n in design.names])
        result = least_squares(residuals, np.clip(x0, lower + 1e-9, upper - 1e-9), bounds=(lower, upper),
                               x_scale=1.0, loss="soft_l1" if robust else "linear", f_scale=f_scale)
        if best is None or result.cost < best.cost:
            best = result
    assert best is not None
    return design.params(best.x, defaults), float(best.cost)


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
def calibration_report(csv: Path | None, model: str, hardware: str, *, backend: str = "numpy", device: str = "cpu",
                       dtype: str = "float32", threads: int = 0, requests: int = 48, per_phase: bool = False,
                       seed: int = 0, on_status: Callable[[str], None] | None = None, tensor_parallel: int | None = 1,
                       model_config: Path | None = None) -> tuple[dict[str, Any], str]:
    """Fit to a CSV of measured steps, or measure the real executor here (one run fitted, another held out);
    with `per_phase`, also fit prefill and decode steps apart. `tensor_parallel`: the degree of CSV rows that do
    not give one, or None to fit it (`step_fit.fit_tensor_parallel`; CSV step rows without the column only);
    `model_config`: a Hugging Face config.json instead of a built-in model. Returns (JSON-ready report, text)."""
    from reference_engine.engine.hardware import hardware as hardware_spec
    from reference_engine.engine.model_config import spec_from_hf_config
    from reference_engine.engine.models import model as model_spec

    spec = spec_from_hf_config(model_config) if model_config is not None else model_spec(model)
    hw = hardware_spec(hardware)
    held_out = None
    tp_costs: dict[int, float] = {}
    if csv is not None:
        steps: list[Measured] = steps_from_csv(csv, model, hardware, tensor_parallel or 1)
        if tensor_parallel is None:
            from reference_engine.compute.step_fit import fit_tensor_parallel

            plain = [s for s in steps if isinstance(s, MeasuredStep)]
            if len(plain) != len(steps):
                raise ValueError(f"{csv}: fitting the tensor-parallel degree needs step rows of one instance with no "
                                 f"tensor_parallel or cuda_graphs column and no request rows")
            tensor_parallel, tp_costs = fit_tensor_parallel(plain, spec, hw)
            steps = [MeasuredRun((s,), s.duration_ns, tensor_parallel, True, phase_of(s)) if tensor_parallel > 1
                     else s for s in plain]
    elif tensor_parallel not in (None, 1):
        raise ValueError(f"the real executor measured here runs on one device; tensor_parallel {tensor_parallel} "
                         f"applies to a --csv only")
    else:
        executor = RealExecutor(spec, 2048, 16, backend=backend, device=device, dtype=dtype, seed=seed,
                                threads=threads)
        if on_status is not None:
            on_status(f"measuring {model} on the real executor ({backend}, {device}, {dtype}): 2 runs × 2 "
                      f"policies × {requests} requests")
        steps = list(measure_calibration_run(executor, model, hardware, seed, requests))
        held_out = measure_calibration_run(executor, model, hardware, seed + 1, requests)
    result = calibrate(steps, spec, hw)
    present = {phase_of(s) for s in steps}
    phases = [calibrate(steps, spec, hw, phase) for phase in PHASES if phase in present] if per_phase else []
    report = json.loads(result.to_json())
    tp = tensor_parallel or 1
    report["tensor_parallel"] = tp
    lines = [result.table(), f"  tensor parallel: {tp}"
             + (" (fitted: " + ", ".join(f"TP{k} cost {v:.3g}" for k, v in tp_costs.items()) + ")" if tp_costs
                else " (declared; rows giving their own degree keep it)")]
    if tp_costs:
        report["tensor_parallel_fit"] = {str(k): v for k, v in tp_costs.items()}
    if held_out is not None:
        errors, median = evaluate(held_out, spec, hw, result.params)
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
