"""Simulated seconds per wall second for one Llama-3-8B / H100 engine replaying the Azure conversation
trace (one hour), with tracing to an OTLP JSON lines file and with tracing off, measured in one run; and
the trace volume in bytes per generated token.

    .venv/bin/python benchmarks/bench_engine.py [--workload PATH] [--duration 3600] [--repeat 3]

Peers measured on this kind of machine (DESIGN.md): BLIS (Go, roofline, no tracing) ≈ 390× real time;
Vidur (Python) 24–38×. Targets: ≥ 400× with tracing; 100× at the very least.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from pathlib import Path

from reference_engine.engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.workload import azure_requests

DEFAULT_WORKLOAD = Path(__file__).resolve().parents[2] / "shared" / "workloads" / "azure_conv_2023.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions; the best is reported")
    args = parser.parse_args()

    t0 = time.perf_counter()
    requests = azure_requests(args.workload, args.duration)
    parse_s = time.perf_counter() - t0
    simulated_s = (max(r.arrival_ns for r in requests) - requests[0].arrival_ns) / 1e9
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM")
    best = {"traced": float("inf"), "untraced": float("inf")}
    best_cpu = {"traced": float("inf"), "untraced": float("inf")}
    trace_bytes = output_tokens = spans = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        for _ in range(args.repeat):
            for mode in ("untraced", "traced"):
                gc.collect()
                start, cpu_start = time.perf_counter(), time.process_time()
                if mode == "traced":
                    writer = OtlpJsonLinesWriter(path)
                    summary = simulate(config, requests, writer)
                    spans = writer.spans_written
                else:
                    summary = simulate(config, requests, None)
                best[mode] = min(best[mode], time.perf_counter() - start)
                best_cpu[mode] = min(best_cpu[mode], time.process_time() - cpu_start)
                output_tokens = summary.output_tokens
                simulated_s = summary.simulated_s
        trace_bytes = os.path.getsize(path)
        bare_start, bare_cpu_start = time.perf_counter(), time.process_time()
        LLMEngine(config).run(requests)
        bare, bare_cpu = time.perf_counter() - bare_start, time.process_time() - bare_cpu_start

    print(f"workload: {args.workload.name}, {len(requests)} requests, {simulated_s:.0f} simulated s "
          f"(parsed in {parse_s:.2f} s); {output_tokens} generated tokens; best of {args.repeat}; "
          f"load average {os.getloadavg()[0]:.1f} (CPU time is what an idle machine's wall time would be, roughly)")
    print("| mode | wall s | simulated s per wall s | CPU s | simulated s per CPU s |")
    print("|---|---|---|---|---|")
    rows = [("engine only (no observers)", bare, bare_cpu),
            ("tracing off (summary statistics on)", best["untraced"], best_cpu["untraced"]),
            ("tracing to an OTLP JSON lines file", best["traced"], best_cpu["traced"])]
    for name, wall, cpu in rows:
        print(f"| {name} | {wall:.2f} | {simulated_s / wall:.0f}× | {cpu:.2f} | {simulated_s / cpu:.0f}× |")
    print(f"tracing cost: {best['traced'] / best['untraced']:.2f}× the untraced wall time; "
          f"{spans} spans, {trace_bytes / 1e6:.1f} MB, {trace_bytes / output_tokens:.1f} bytes per generated token")


if __name__ == "__main__":
    main()
