"""Real executor benchmark: tracing overhead, and how well the calibrated simulated cost model predicts steps.

1. Tracing overhead: the same workload served with the tracer on (OTLP JSON lines to a file) and off,
   repetitions interleaved (on/off, then off/on, ...) so that a noisy, shared machine affects both alike.
   Step time is the executor's measured wall-clock step time, which includes the host work between steps
   (the tracer's included). All requests arrive at once and at most 8 run together, so both runs of a pair
   take the same steps. Reported: mean step time on and off, the ratio of their medians over repetitions,
   and the median of the per-pair ratios.
2. Calibration: the cost model is fitted to one run's measured steps and predicts another run's (held out,
   other prompts); reported: median relative error per phase, in-sample and held out, plus per-phase fits.

    .venv/bin/python benchmarks/bench_real_executor.py [--backend torch --device cuda --dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from reference_engine.compute.calibration import calibrate, calibration_requests, evaluate, measure_calibration_run
from reference_engine.compute.ops import limit_cpu_threads
from reference_engine.compute.real_executor import RealExecutor
from reference_engine.compute.transformer import Transformer
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.hardware import hardware
from reference_engine.engine.llm_engine import LLMEngine, StepReport
from reference_engine.engine.models import model
from reference_engine.engine.sequence import Sequence
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.tracer import EngineTracer, engine_resource


class TimedTracer:
    """The engine tracer, with the time spent in it (span building, encoding, writing) counted."""

    def __init__(self, tracer: EngineTracer) -> None:
        self.tracer, self.ns = tracer, 0

    def on_step(self, report: StepReport) -> None:
        t = time.perf_counter_ns()
        self.tracer.on_step(report)
        self.ns += time.perf_counter_ns() - t

    def on_finish(self, seq: Sequence) -> None:
        t = time.perf_counter_ns()
        self.tracer.on_finish(seq)
        self.ns += time.perf_counter_ns() - t

    def close(self) -> None:
        t = time.perf_counter_ns()
        self.tracer.close()
        self.ns += time.perf_counter_ns() - t


def serve_once(config: EngineConfig, transformer: Transformer, traced: bool, seed: int,
               requests: int, out_dir: Path) -> tuple[float, int, float, int, int]:
    """(Σ measured step ns, steps, wall s of engine.run, spans written, ns spent in the tracer)."""
    executor = RealExecutor(transformer.spec, config.num_kv_blocks, config.block_size, model=transformer)
    observers: list[TimedTracer] = []
    sink = None
    if traced:
        sink = OtlpJsonLinesWriter(out_dir / f"trace-{seed}.jsonl")
        observers.append(TimedTracer(EngineTracer(sink, engine_resource(config, executor="real"), seed=seed)))
    engine = LLMEngine(config, executor, observers=observers)
    durations: list[int] = []
    executor_execute = executor.execute

    def execute(batch, now_ns, deadline_ns):  # type: ignore[no-untyped-def]
        d = executor_execute(batch, now_ns, deadline_ns)
        durations.extend(d.tolist())
        return d

    executor.execute = execute  # type: ignore[method-assign]
    start = time.perf_counter()
    # Everything arrives at once, so the steps (membership, shapes) are the same whether traced or not.
    engine.run(calibration_requests(requests, seed, max_prompt_tokens=512, max_output_tokens=48, spread_s=0.0))
    wall = time.perf_counter() - start
    spans = tracer_ns = 0
    if sink is not None:
        for observer in observers:
            observer.close()
            tracer_ns += observer.ns
        t = time.perf_counter_ns()
        sink.close()
        tracer_ns += time.perf_counter_ns() - t
        spans = sink.spans_written
    return float(sum(durations)), len(durations), wall, spans, tracer_ns


def tracing_overhead(config: EngineConfig, transformer: Transformer, repetitions: int, requests: int) -> dict:
    on_means, off_means, pair_ratios, wall_ratios, accounted = [], [], [], [], []
    spans = tracer_ns = 0
    serve_once(config, transformer, False, 99, requests, Path(tempfile.gettempdir()))  # warm up
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repetitions):
            result = {}
            for traced in ((True, False) if rep % 2 == 0 else (False, True)):
                result[traced] = serve_once(config, transformer, traced, rep, requests, Path(tmp))
            assert result[True][1] == result[False][1], "a traced and an untraced run took different steps"
            on, off = result[True], result[False]
            on_means.append(on[0] / on[1])
            off_means.append(off[0] / off[1])
            pair_ratios.append(on_means[-1] / off_means[-1])
            wall_ratios.append((on[2] / on[1]) / (off[2] / off[1]))
            accounted.append(1 + on[4] / off[0])
            spans += on[3]
            tracer_ns += on[4]
            print(f"  rep {rep}: step on {on_means[-1] / 1e6:.3f} ms, off {off_means[-1] / 1e6:.3f} ms ({on[1]} steps),"
                  f" ratio {pair_ratios[-1]:.4f}; tracer {on[4] / on[1] / 1e3:.1f} µs/step", flush=True)
    return {
        "repetitions": repetitions,
        "step_ms_on": float(np.median(on_means) / 1e6),
        "step_ms_off": float(np.median(off_means) / 1e6),
        "ratio_of_medians": float(np.median(on_means) / np.median(off_means)),
        "median_pair_ratio": float(np.median(pair_ratios)),
        "pair_ratio_iqr": [float(np.percentile(pair_ratios, 25)), float(np.percentile(pair_ratios, 75))],
        "median_wall_ratio": float(np.median(wall_ratios)),
        "spans_per_traced_run": spans / repetitions,
        # 1 + (time inside the tracer) / (untraced step time): the same ratio by direct accounting, free of
        # the machine's run-to-run noise.
        "accounted_ratio": float(np.median(accounted)),
        "tracer_us_per_span": tracer_ns / max(spans, 1) / 1e3,
    }


def calibration(args: argparse.Namespace, transformer: Transformer, hw_name: str) -> dict:
    executor = RealExecutor(transformer.spec, 2048, 16, model=transformer)
    spec, hw = transformer.spec, hardware(hw_name)
    fit_steps = measure_calibration_run(executor, spec.name, hw_name, seed=0, requests=args.requests)
    held_out = measure_calibration_run(executor, spec.name, hw_name, seed=1, requests=args.requests)
    result = calibrate(fit_steps, spec, hw)
    phases, median = evaluate(held_out, spec, hw, result.params)
    per_phase = {}
    for phase in ("prefill", "decode"):
        own = calibrate(fit_steps, spec, hw, phase)
        errors, _ = evaluate([s for s in held_out if s.is_prefill == (phase == "prefill")], spec, hw, own.params)
        per_phase[phase] = {"params": vars(own.params), "in_sample": own.median_error,
                            "held_out": errors[0].median_error if errors else None}
    print(result.table())
    return {
        "hardware_spec": hw_name,
        "params": vars(result.params),
        "in_sample": {e.phase: e.median_error for e in result.phases} | {"all": result.median_error},
        "held_out": {e.phase: e.median_error for e in phases} | {"all": median},
        "held_out_steps": {e.phase: e.steps for e in phases},
        "held_out_median_ms": {e.phase: e.median_measured_ms for e in phases},
        "per_phase_fit": per_phase,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--hardware", default="CPU-host", help="spec the calibrated efficiencies refer to")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for BLAS/torch (0: as they are)")
    parser.add_argument("--repetitions", type=int, default=10, help="tracing on/off pairs")
    parser.add_argument("--overhead-requests", type=int, default=32)
    parser.add_argument("--requests", type=int, default=48, help="calibration requests per policy and run")
    parser.add_argument("--skip-calibration", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        limit_cpu_threads(args.threads)
    transformer = Transformer(model(args.model), seed=0, backend=args.backend, dtype=args.dtype, device=args.device)
    if args.threads:
        limit_cpu_threads(args.threads)  # torch is loaded now
    config = EngineConfig(model=args.model, hardware=args.hardware, num_kv_blocks=2048, max_num_seqs=8,
                          max_num_batched_tokens=1024)
    results: dict = {"model": args.model, "backend": args.backend, "device": args.device, "dtype": args.dtype,
                     "threads": args.threads}
    started = time.perf_counter()
    print(f"tracing overhead: {args.repetitions} interleaved pairs, {args.overhead_requests} requests each", flush=True)
    results["tracing_overhead"] = tracing_overhead(config, transformer, args.repetitions, args.overhead_requests)
    print(json.dumps(results["tracing_overhead"], indent=2), flush=True)
    if not args.skip_calibration:
        print("calibration: fit on one run, check on a held-out run", flush=True)
        results["calibration"] = calibration(args, transformer, args.hardware)
        print(json.dumps(results["calibration"], indent=2))
    results["wall_s"] = time.perf_counter() - started
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
