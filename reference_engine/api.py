"""The one door from the toolkit into the engine.

`infertrace`'s commands that run the engine (`simulate`, `calibrate`, `scenarios generate`, `demo`) import this
module and nothing else of `reference_engine`, lazily; the analyzers never do (tests/test_layout.py checks both).
Everything here is a thin assembly of the engine's parts: build a config and a workload, open a sink, run.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference_engine.engine.config import EngineConfig
from reference_engine.engine.cost_model import CostParams
from reference_engine.engine.hardware import HARDWARE
from reference_engine.fleet.config import load_fleet, parse_fleet
from reference_engine.fleet.fleet import Fleet, FleetSummary
from reference_engine.fleet.workload import fleet_requests
from reference_engine.scenarios.bank import (
    CLIENT_TOKENS_FILE,
    ITERATION_LOGS_DIR,
    TRACES_FILE,
    TRUTH_FILE,
    SideFiles,
    bank,
    generate,
    run_scenario,
)
from reference_engine.scenarios.families import ALL_FAMILIES, FAMILIES, ITL_FAMILIES, Scenario, make_scenario
from reference_engine.scenarios.whatif import KNOBS as WHATIF_KNOBS
from reference_engine.scenarios.whatif import WHATIF_FILE, generate_whatif
from reference_engine.simulate import WORKLOAD_KINDS, WorkloadSpec, open_sink, simulate
from reference_engine.stats import Summary
from reference_engine.telemetry.otlp import SpanSink
from reference_engine.telemetry.profiles import ENGINE_PROFILES, GATEWAY_PROFILES, TelemetrySpec
from reference_engine.workload import SyntheticWorkload

__all__ = [
    "ALL_FAMILIES",
    "CLIENT_TOKENS_FILE",
    "ENGINE_PROFILES",
    "FAMILIES",
    "GATEWAY_PROFILES",
    "ITERATION_LOGS_DIR",
    "ITL_FAMILIES",
    "TRACES_FILE",
    "TRUTH_FILE",
    "WHATIF_FILE",
    "WHATIF_KNOBS",
    "WORKLOAD_KINDS",
    "EngineRun",
    "EngineSimulation",
    "FleetSimulation",
    "Scenario",
    "SideFiles",
    "SyntheticWorkload",
    "TelemetrySpec",
    "bank",
    "calibration_report",
    "cuda_hardware_name",
    "fit_cost_params",
    "fit_cost_params_from_requests",
    "generate",
    "generate_whatif",
    "make_scenario",
    "replay",
    "run_scenario",
    "scenario_on_fleet",
    "table_calibration_report",
]


@dataclass(frozen=True)
class EngineRun:
    """One engine and its workload, as `infertrace simulate` describes them."""

    model: str | None = None  # default: llama-3-8b; tiny with the real executor
    hardware: str | None = None  # default: H100-SXM; CPU-host (or the CUDA device) with the real executor
    tensor_parallel: int = 1
    policy: str = "prefill_first"
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 256
    chunked_prefill: bool = False
    prefix_caching: bool = True
    prefill_microbatch: int = 0
    offload_experts: bool = False
    cpu_moe_layers: int | tuple[int, ...] = 0
    cuda_graphs: bool = True
    kv_host_tier_gb: float = 0.0
    kv_remote_tier_gb: float = 0.0
    kv_reuse_accounting: bool = False
    num_kv_blocks: int = 0
    cost_params: Path | None = None
    executor: str = "sim"  # sim or real
    backend: str = "numpy"
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 0
    temperature: float = 0.0
    workload: str = "synthetic"
    workload_file: Path | None = None
    speedup: float = 1.0
    synthetic: SyntheticWorkload = field(default_factory=SyntheticWorkload)


class EngineSimulation:
    """A prepared single-engine run: the config, the requests and the sink are built (and checked) up front,
    so that a bad option fails before anything runs."""

    def __init__(self, run: EngineRun, duration_s: float, seed: int, out: Path | None,
                 otlp_endpoint: str | None, telemetry: TelemetrySpec | None = None) -> None:
        if run.executor not in ("sim", "real"):
            raise ValueError(f"--executor must be sim or real, got {run.executor!r}")
        real = run.executor == "real"
        model = run.model or ("tiny" if real else "llama-3-8b")
        hardware = run.hardware or ("H100-SXM" if not real else "CPU-host" if run.device == "cpu"
                                    else cuda_hardware_name())
        cost = CostParams()
        if run.cost_params is not None:
            from reference_engine.compute.calibration import load_cost_params

            cost = load_cost_params(run.cost_params)
        self.config = EngineConfig(
            model=model, hardware=hardware, tensor_parallel=run.tensor_parallel, policy=run.policy,
            max_num_batched_tokens=run.max_num_batched_tokens, max_num_seqs=run.max_num_seqs,
            chunked_prefill=run.chunked_prefill or run.policy == "decode_first",
            enable_prefix_caching=run.prefix_caching, prefill_microbatch=run.prefill_microbatch,
            offload_experts=run.offload_experts, cpu_moe_layers=run.cpu_moe_layers, cuda_graphs=run.cuda_graphs,
            kv_host_tier_gb=run.kv_host_tier_gb, kv_remote_tier_gb=run.kv_remote_tier_gb,
            kv_reuse_accounting=run.kv_reuse_accounting,
            num_kv_blocks=run.num_kv_blocks or (2048 if real else 0), cost=cost)
        self.executor = None
        if real:
            from reference_engine.compute.real_executor import real_executor_for

            self.executor = real_executor_for(self.config, backend=run.backend, device=run.device, dtype=run.dtype,
                                              seed=seed, temperature=run.temperature, threads=run.threads)
        spec = WorkloadSpec(run.workload, run.workload_file, run.synthetic, run.speedup)
        self.requests = spec.requests(duration_s, seed, model)
        if not self.requests:
            raise ValueError("the workload produced no requests in that duration")
        self.seed = seed
        self.telemetry = telemetry
        # The real executor times steps by the wall clock: its spans are built in this process, not beside it.
        self.sink: SpanSink | None = open_sink(out, otlp_endpoint, background=not real)
        self.start_ns = self.requests[0].arrival_ns
        self.arrivals_s = (max(r.arrival_ns for r in self.requests) - self.start_ns) / 1e9

    def run(self, on_progress: Callable[[float], None] | None = None) -> Summary:
        """Serve every request; `on_progress(simulated seconds since the first arrival)` after each step."""
        report = None if on_progress is None else (lambda _ended, now: on_progress((now - self.start_ns) / 1e9))
        return simulate(self.config, self.requests, self.sink, self.seed, report, executor=self.executor,
                        telemetry=self.telemetry)


class FleetSimulation:
    """A prepared fleet run from a fleet file (docs/fleet.md)."""

    def __init__(self, path: Path, duration_s: float, seed: int, out: Path | None,
                 otlp_endpoint: str | None, telemetry: TelemetrySpec | None = None) -> None:
        if duration_s <= 0:
            raise ValueError(f"--duration must be > 0 seconds, got {duration_s}")
        self.spec = load_fleet(path)
        self.requests = fleet_requests(self.spec, duration_s, seed)
        if not self.requests:
            raise ValueError(f"{path}: the tenants sent no requests in {duration_s} s")
        self.seed = seed
        self.telemetry = telemetry
        self.sink = open_sink(out, otlp_endpoint)
        self.start_ns = self.requests[0].arrival_ns

    def run(self, on_progress: Callable[[float], None] | None = None) -> FleetSummary:
        report = None if on_progress is None else (lambda now: on_progress((now - self.start_ns) / 1e9))
        try:
            return Fleet(self.spec, self.sink, self.seed, telemetry=self.telemetry).run(self.requests, report)
        finally:
            if self.sink is not None:
                self.sink.close()


def scenario_on_fleet(fleet_toml: str, family: str, seed: int, name: str, duration_s: float) -> Scenario:
    """A scenario of `family` drawn on a given fleet (a fleet file's text) instead of a random one."""
    return make_scenario(family, seed, name=name, duration_s=duration_s, fleet=parse_fleet(tomllib.loads(fleet_toml)))


def calibration_report(csv: Path | None, model: str, hardware: str, *, backend: str = "numpy", device: str = "cpu",
                       dtype: str = "float32", threads: int = 0, requests: int = 48, per_phase: bool = False,
                       seed: int = 0, on_status: Callable[[str], None] | None = None, tensor_parallel: int | None = 1,
                       model_config: Path | None = None) -> tuple[dict[str, Any], str]:
    """Fit the cost model to measured steps (a CSV, or the real executor measured here, one run fitted and
    another held out) of an instance of `tensor_parallel` devices (None: fitted); `model_config`: a Hugging Face
    config.json; returns the report as JSON-ready data and as text."""
    from reference_engine.compute.calibration import calibration_report as report

    return report(csv, model, hardware, backend=backend, device=device, dtype=dtype, threads=threads,
                  requests=requests, per_phase=per_phase, seed=seed, on_status=on_status,
                  tensor_parallel=tensor_parallel, model_config=model_config)


def fit_cost_params(steps: list[tuple[Any, int, int, int, int]], model: str, hardware: str,
                    tensor_parallel: int = 1, prefill_microbatch: int = 0,
                    estimated: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Fit the cost model to an engine's measured steps ((chunks, decodes, decode context, sampled, ns) each, as
    `infertrace.replay.capture.measured_steps` reads them from the store); returns (CostParams fields, median
    relative error per phase and overall). `estimated`: the steps' shapes are partly estimated (vLLM's iteration
    log counts a step's tokens, not its decodes' context): a maximum a posteriori fit toward the roofline's
    datasheet values, as a fit to request timings is."""
    from dataclasses import asdict

    from reference_engine.compute.calibration import datasheet_prior
    from reference_engine.compute.real_executor import MeasuredStep
    from reference_engine.compute.step_fit import fit_steps
    from reference_engine.engine.hardware import hardware as hardware_spec
    from reference_engine.engine.models import model as model_spec

    measured = [MeasuredStep(tuple(tuple(c) for c in chunks), decodes, ctx, sampled, ns)
                for chunks, decodes, ctx, sampled, ns in steps]
    result = fit_steps(measured, model_spec(model), hardware_spec(hardware), tensor_parallel, prefill_microbatch,
                       prior=datasheet_prior() if estimated else None)
    errors = {e.phase: e.median_error for e in result.phases}
    errors["all"] = result.median_error
    return asdict(result.params), errors


def fit_cost_params_from_requests(requests: list[Any], deployment: Any,
                                  measured: dict[str, tuple[int | None, int | None]], seed: int = 0,
                                  infer_prefixes: bool = True, fitted: dict[str, float] | None = None,
                                  known: dict[str, tuple[str, int]] | None = None, resolved: Any = ()
                                  ) -> tuple[dict[str, float], dict[str, float], int, dict[str, tuple[str, int]],
                                             tuple[int, int, float]]:
    """Fit the cost model to per-request timings alone (`measured`: request id -> (prefill ns, decode ns), e.g. vLLM's
    `llm_request` spans), the steps rebuilt by replaying the captured requests on the deployment
    (`reference_engine.compute.request_fit`); returns (CostParams fields, median relative error per phase and
    overall, measured phases fitted, request id -> (shared prefix id, tokens) inferred from prefills faster than
    their whole prompt, (linear-layer passes of the capture compute-bound under the fit, the most tokens of one
    pass, the compute efficiency under which its most demanding pass would have been compute-bound)). Parameters
    the timings leave unconstrained take the roofline's datasheet values (a MAP prior). `infer_prefixes=False` where
    the spans report cached tokens: no hit is inferred from a prefill's time. `fitted`: CostParams already fitted
    to the engine's own steps (`fit_cost_params` on vLLM's iteration log): kept, the prefixes inferred with them.
    `known`: prefixes measured otherwise (`measured_prefixes`), kept and returned with the inferred ones;
    `resolved`: the requests whose hit, or its absence, was measured so (none is inferred for them)."""
    from reference_engine.compute.request_fit import fit_request_times

    fit = fit_request_times(requests, deployment, measured, seed=seed, infer_prefixes=infer_prefixes, fitted=fitted,
                            known=known, resolved=frozenset(resolved))
    return fit.cost, fit.median_error, fit.phases, fit.prefixes, (fit.compute_bound_passes, fit.largest_pass_tokens,
                                                                   fit.compute_floor)


def measured_prefixes(requests: list[Any], computed: dict[str, int]) -> dict[str, tuple[str, int]]:
    """Request id -> (shared prefix id, tokens): the prefix-cache hits that the prompt tokens each request's engine
    computed show (`reference_engine.compute.request_fit.measured_prefixes`)."""
    from reference_engine.compute.request_fit import measured_prefixes as from_computed

    return from_computed(requests, computed)


BUNDLED_TABLES = {"lmdeploy-a100": "lmdeploy_a100_fp16.json", "splitwise-a100": "splitwise_a100_llama2_70b.json",
                  "splitwise-h100": "splitwise_h100_llama2_70b.json"}


def table_calibration_report(table: Path) -> tuple[dict[str, Any], str]:
    """Fit the cost model on half of a published measurement table (or a bundled one by name, BUNDLED_TABLES) and
    report the error on the other half per phase and TP degree, beside the uncalibrated roofline's."""
    from reference_engine.compute.published import TABLES, table_report

    path = TABLES / BUNDLED_TABLES[str(table)] if str(table) in BUNDLED_TABLES else table
    return table_report(path)


def replay(requests: list[Any], deployment: Any, seed: int = 0) -> Any:
    """Serve captured requests (`reference_engine.replay.CapturedRequest`s) on a deployment (a one-model fleet,
    `reference_engine.replay.Deployment`) on the simulated clock; returns a `ReplayRun` (what each request saw)."""
    from reference_engine.replay import replay as run

    return run(requests, deployment, seed)


def cuda_hardware_name() -> str:
    """The hardware spec matching the CUDA device (e.g. H200 for "NVIDIA H200"), else the device's own name."""
    try:
        import torch

        name = torch.cuda.get_device_name()
    except (ImportError, RuntimeError, AssertionError):
        return "cuda"
    return next((key for key in HARDWARE if key.split("-")[0] in name), name)
