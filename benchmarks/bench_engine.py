"""Simulated seconds per wall second for one Llama-3-8B / H100 engine replaying the Azure conversation
trace (one hour), with tracing to an OTLP JSON lines file and with tracing off, measured in one run; and
the trace volume in bytes per generated token.

    .venv/bin/python benchmarks/bench_engine.py [--workload PATH] [--duration 3600] [--repeat 3]
    .venv/bin/python benchmarks/bench_engine.py --baseline DIR   # also time another checkout, interleaved

`--baseline DIR` runs the same modes on the code in DIR (e.g. `git archive main | tar -x -C DIR`) and on this
checkout, alternating processes, and prints each mode's best time for both and their ratio.

Peers measured on this kind of machine (DESIGN.md): BLIS (Go, roofline, no tracing) ≈ 390× real time;
Vidur (Python) 24–38×. Targets: ≥ 400× with tracing; 100× at the very least.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_WORKLOAD = HERE.parents[1] / "shared" / "workloads" / "azure_conv_2023.csv"
MODES = ("engine only (no observers)", "tracing off (summary statistics on)", "tracing to an OTLP JSON lines file")


def measure(workload: Path, duration: float, repeat: int) -> dict:
    """Best wall and CPU time per mode, interleaved `repeat` times, in this process."""
    from reference_engine.engine.config import EngineConfig
    from reference_engine.engine.llm_engine import LLMEngine
    from reference_engine.simulate import simulate
    from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
    from reference_engine.workload import azure_requests

    t0 = time.perf_counter()
    requests = azure_requests(workload, duration)
    parse_s = time.perf_counter() - t0
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM")
    wall = dict.fromkeys(MODES, float("inf"))
    cpu = dict.fromkeys(MODES, float("inf"))
    out: dict = {"requests": len(requests), "parse_s": parse_s}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        for _ in range(repeat):
            for mode in MODES:
                gc.collect()
                start, cpu_start = time.perf_counter(), time.process_time()
                if mode == MODES[0]:
                    LLMEngine(config).run(requests)
                elif mode == MODES[1]:
                    summary = simulate(config, requests, None)
                else:
                    writer = OtlpJsonLinesWriter(path)
                    summary = simulate(config, requests, writer)
                    out["spans"] = writer.spans_written
                wall[mode] = min(wall[mode], time.perf_counter() - start)
                cpu[mode] = min(cpu[mode], time.process_time() - cpu_start)
                if mode != MODES[0]:
                    out["output_tokens"], out["simulated_s"] = summary.output_tokens, summary.simulated_s
        out["trace_bytes"] = os.path.getsize(path)
        out["trace_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        out["engine_code"] = str(Path(sys.modules["reference_engine"].__file__).parent)
    out["wall"], out["cpu"] = wall, cpu
    return out


def _child(tree: Path, args: argparse.Namespace) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(HERE)!r}); "
            f"import bench_engine; print(json.dumps(bench_engine.measure(__import__('pathlib').Path("
            f"{str(args.workload)!r}), {args.duration}, 1)))")
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                            cwd=tempfile.gettempdir())
    return json.loads(result.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> None:
    trees = {"baseline": args.baseline.resolve(), "this checkout": HERE.parent}
    best: dict[str, dict[str, float]] = {name: dict.fromkeys(MODES, float("inf")) for name in trees}
    runs: dict[str, dict] = {}
    loads = [os.getloadavg()[0]]
    for k in range(args.repeat):
        order = list(trees) if k % 2 == 0 else list(trees)[::-1]
        for name in order:
            runs[name] = _child(trees[name], args)
            for mode in MODES:
                best[name][mode] = min(best[name][mode], runs[name]["cpu"][mode])
            loads.append(os.getloadavg()[0])
    print(f"CPU seconds, best of {args.repeat} interleaved runs per tree (each run in its own process); load average "
          f"{min(loads):.1f}–{max(loads):.1f} during the runs")
    print("| mode | baseline CPU s | this checkout CPU s | ratio |")
    print("|---|---|---|---|")
    for mode in MODES:
        a, b = best["baseline"][mode], best["this checkout"][mode]
        print(f"| {mode} | {a:.2f} | {b:.2f} | {b / a:.3f} |")
    base, mine = runs["baseline"], runs["this checkout"]
    print(f"engine code: {base['engine_code']} against {mine['engine_code']}; traces "
          f"{'byte-identical' if base['trace_sha256'] == mine['trace_sha256'] else 'DIFFERENT'} "
          f"({mine['trace_bytes']} bytes, sha256 {mine['trace_sha256'][:16]}…)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions; the best is reported")
    parser.add_argument("--baseline", type=Path, help="another checkout to time against this one, interleaved")
    args = parser.parse_args()
    if args.baseline is not None:
        compare(args)
        return
    r = measure(args.workload, args.duration, args.repeat)
    simulated_s = r["simulated_s"]
    print(f"workload: {args.workload.name}, {r['requests']} requests, {simulated_s:.0f} simulated s "
          f"(parsed in {r['parse_s']:.2f} s); {r['output_tokens']} generated tokens; best of {args.repeat}; "
          f"load average {os.getloadavg()[0]:.1f} (CPU time is what an idle machine's wall time would be, roughly)")
    print("| mode | wall s | simulated s per wall s | CPU s | simulated s per CPU s |")
    print("|---|---|---|---|---|")
    for mode in MODES:
        wall, cpu = r["wall"][mode], r["cpu"][mode]
        print(f"| {mode} | {wall:.2f} | {simulated_s / wall:.0f}× | {cpu:.2f} | {simulated_s / cpu:.0f}× |")
    traced, untraced = r["wall"][MODES[2]], r["wall"][MODES[1]]
    print(f"tracing cost: {traced / untraced:.2f}× the untraced wall time; {r['spans']} spans, "
          f"{r['trace_bytes'] / 1e6:.1f} MB, {r['trace_bytes'] / r['output_tokens']:.1f} bytes per generated token")


if __name__ == "__main__":
    main()
