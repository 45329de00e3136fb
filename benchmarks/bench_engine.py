"""Simulated seconds per wall second for one Llama-3-8B / H100 engine (prefill-first, 16384-token budget, prefix
caching on) replaying the Azure conversation trace (one hour): with no observers, with tracing off (summary
statistics), traced to an OTLP JSON lines file as `infertrace simulate` writes it (spans built and written by a
child process, which also keeps the summary statistics, from the facts it gets), and traced with the writer in the
simulator's own process (which keeps the statistics itself). With `--blis PATH`, BLIS runs the same
requests side by side and the ratios are printed.

    .venv/bin/python benchmarks/bench_engine.py [--workload PATH] [--duration 3600] [--repeat 5] [--blis PATH]
    .venv/bin/python benchmarks/bench_engine.py --baseline DIR   # also time another checkout, interleaved

Every run is a fresh process; the modes (and BLIS) are interleaved, each repetition in a rotated order, and the
medians are reported. "sim" is the simulation alone (workload read, sink closed: the file complete); "process" is
the whole process, Python's start-up and reading the trace included, which is what BLIS's figure is.

A control runs beside them: a fresh process that writes as many bytes as a traced run's trace to a new file
(`--control-bytes`) and nothing else. Its system time is what this machine's kernel charges for new page-cache
pages, alone: on a VM whose balloon reports free pages to the host, a page the guest has not used lately faults in
the host when first written, and the traced run's writer child pays that too. The "system" column shows each run's
system time, so that this share of tracing's cost is seen apart from building and encoding the spans.

`--baseline DIR` adds every mode of the engine code in DIR (e.g. `git archive 48c09ec | tar -x -C DIR`; a checkout
with the child-process writer, `simulate.open_sink(..., background=True)`) as contenders of the same interleaved
runs, and prints each mode's medians for both, their ratio, and whether the two wrote byte-identical traces.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import side_by_side

MODES = ("engine", "untraced", "traced", "traced-in-process", "traced-zstd")
BASELINE_MODES = MODES[:4]  # a checkout from before zstd output would write plain text under a .zst name
CONTROL = "new-file-write"  # the control: a trace's bytes written to a new file, nothing simulated
TRACE_BYTES = 136_314_441  # what the traced Azure hour writes (the table's last line says if a run wrote otherwise)


def write_control(out: Path, size: int) -> dict[str, Any]:
    """The control, in this (fresh) process: `size` bytes to a new file in 1 MiB writes, as the span writer's
    buffered text file does."""
    block = b"x" * (1 << 20)
    start, cpu, sys_s = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
    with open(out, "wb") as f:
        for _ in range(size >> 20):
            f.write(block)
        f.write(block[:size & ((1 << 20) - 1)])
    return {"mode": CONTROL, "bytes": size, "sim_wall_s": time.perf_counter() - start,
            "sim_cpu_s": time.process_time() - cpu,
            "sim_sys_s": resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys_s, "child_cpu_s": 0.0,
            "child_sys_s": 0.0}


def worker(mode: str, workload: Path, duration: float, out: Path, tree: Path | None = None) -> dict[str, Any]:
    """One run of `mode` in this (fresh) process; with `tree`, of the engine code in that checkout."""
    side_by_side.use_tree(tree)
    import reference_engine
    from reference_engine.engine.config import EngineConfig
    from reference_engine.engine.llm_engine import LLMEngine
    from reference_engine.simulate import simulate
    from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
    from reference_engine.workload import azure_requests

    requests = azure_requests(workload, duration)
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM")
    start, cpu = time.perf_counter(), time.process_time()
    sys_start = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    result: dict[str, Any] = {"mode": mode, "requests": len(requests),
                              "engine_code": str(Path(reference_engine.__file__).resolve().parent)}
    sink = None
    if mode == "engine":
        engine = LLMEngine(config)
        ended = engine.run(requests)
        result["simulated_s"] = (max(s.finish_ns or 0 for s in ended) - requests[0].arrival_ns) / 1e9
    else:
        if mode in ("traced", "traced-zstd"):
            from reference_engine.simulate import open_sink

            sink = open_sink(out, None, background=True)
        else:
            sink = OtlpJsonLinesWriter(out) if mode == "traced-in-process" else None
        summary = simulate(config, requests, sink)
        result["simulated_s"] = summary.simulated_s
        result["output_tokens"] = summary.output_tokens
    result["sim_wall_s"] = time.perf_counter() - start  # the sink is closed: the trace file is complete
    result["sim_cpu_s"] = time.process_time() - cpu
    result["sim_sys_s"] = resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys_start
    if sink is not None:  # checked after the clock stops
        result["spans"] = sink.spans_written  # type: ignore[attr-defined]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["child_cpu_s"] = children.ru_utime + children.ru_stime
    result["child_sys_s"] = children.ru_stime
    return result


def main() -> None:
    parser = side_by_side.parser(__doc__, (*MODES, CONTROL), repeat=5)
    parser.add_argument("--control-bytes", type=int, default=TRACE_BYTES,
                        help="bytes the control writes to a new file (default: what the traced hour writes)")
    args = parser.parse_args()
    if args.worker == CONTROL:
        print(json.dumps(write_control(args.out, args.control_bytes)))
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.workload, args.duration, args.out, args.tree)))
        return

    trees: dict[str, Path | None] = {"": None}
    if args.baseline is not None:
        trees["baseline "] = args.baseline.resolve()
    contenders = [f"{name}{mode}" for name in trees for mode in (BASELINE_MODES if name else MODES)] + [CONTROL] \
        + (["blis"] if args.blis else [])
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        if args.blis:
            from benchmarks import blis
            from reference_engine.workload import azure_requests

            header, data = blis.write_trace(azure_requests(args.workload, args.duration), Path(tmp) / "blis")

        def run(contender: str) -> dict[str, Any]:
            if contender == "blis":
                result = blis.run(args.blis, header, data)
                result["process_wall_s"], result["process_cpu_s"] = result["wall_s"], result["cpu_s"]
                return result
            name, mode = ("baseline ", contender.removeprefix("baseline ")) if contender.startswith("baseline ") \
                else ("", contender)
            tree = trees[name]
            out = Path(tmp) / f"{name.strip() or 'this'}-{mode}.jsonl{'.zst' if mode == 'traced-zstd' else ''}"
            try:  # every run writes a new file, as `infertrace simulate --out` usually does
                result = side_by_side.fresh_process(__file__, [
                    "--worker", mode, "--workload", str(args.workload), "--duration", str(args.duration), "--out",
                    str(out), "--control-bytes", str(args.control_bytes), *(["--tree", str(tree)] if tree else [])])
                if "spans" in result:  # hashed here, outside the timed process
                    from infertrace.otlp_files import bytes_in  # not in a worker: it may import another checkout

                    result["bytes"] = out.stat().st_size
                    result["sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
                    raw, stream = bytes_in(out)  # what it holds, to compare a .zst with the plain trace
                    with raw, stream:
                        result["content_sha256"] = hashlib.sha256(stream.read()).hexdigest()
                return result
            finally:
                out.unlink(missing_ok=True)

        runs = side_by_side.interleaved(contenders, args.repeat, run)

    def median(contender: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[contender])

    simulated = median("traced", "simulated_s")
    print(f"workload {args.workload.name}: {runs['traced'][0]['requests']} requests, {simulated:.0f} simulated s; "
          f"medians of {args.repeat} fresh processes per contender, interleaved; load average before "
          f"{load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, after {os.getloadavg()[0]:.1f} "
          f"(during the runs {min(r['load_average'] for c in runs.values() for r in c):.1f}–"
          f"{max(r['load_average'] for c in runs.values() for r in c):.1f})")
    blis_speed = median("blis", "simulated_s") / median("blis", "process_wall_s") if args.blis else None
    blis_cpu_speed = median("blis", "simulated_s") / median("blis", "process_cpu_s") if args.blis else None
    print("| run | sim wall s | simulated s / sim wall s | process wall s | simulated s / process wall s "
          "| sim CPU s (+ writer process) | of it system s (+ writer's) | process CPU s, all processes |"
          + (" vs BLIS: sim wall / process wall / process CPU |" if blis_speed else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if blis_speed else ""))
    for contender in [c for c in contenders if c not in ("blis", CONTROL)]:
        sim, proc = median(contender, "sim_wall_s"), median(contender, "process_wall_s")
        cpu, child = median(contender, "sim_cpu_s"), median(contender, "child_cpu_s")
        sys_s, child_sys = median(contender, "sim_sys_s"), median(contender, "child_sys_s")
        proc_cpu = median(contender, "process_cpu_s")
        row = (f"| {contender} | {sim:.2f} | {simulated / sim:.0f}× | {proc:.2f} | {simulated / proc:.0f}× | "
               f"{cpu:.2f}" + (f" + {child:.2f}" if child > 0.05 else "") + f" | {sys_s:.2f}"
               + (f" + {child_sys:.2f}" if child > 0.05 else "") + f" | {proc_cpu:.2f} |")
        if blis_speed and blis_cpu_speed:
            row += (f" {simulated / sim / blis_speed:.2f} / {simulated / proc / blis_speed:.2f} / "
                    f"{simulated / proc_cpu / blis_cpu_speed:.2f} |")
        print(row)
    if blis_speed:
        wall, cpu = median("blis", "process_wall_s"), median("blis", "process_cpu_s")
        print(f"| BLIS fast (no tracing) | — | — | {wall:.2f} | {blis_speed:.0f}× | — | — | {cpu:.2f} | 1 |")
    control = runs[CONTROL]
    print(f"control, {control[0]['bytes']:,} bytes written to a new file in a fresh process, nothing simulated: "
          f"wall {median(CONTROL, 'sim_wall_s'):.2f} s, system {median(CONTROL, 'sim_sys_s'):.2f} s (runs: "
          + ", ".join(f"{r['sim_sys_s']:.2f}" for r in control) + ")")
    for name in trees:
        traced, untraced = median(f"{name}traced", "sim_wall_s"), median(f"{name}untraced", "sim_wall_s")
        traced_cpu, untraced_cpu = median(f"{name}traced", "sim_cpu_s"), median(f"{name}untraced", "sim_cpu_s")
        in_process = median(f"{name}traced-in-process", "sim_wall_s")
        first = runs[f"{name}traced"][0]
        print(f"{name or 'this checkout '}tracing cost: {traced / untraced:.2f}× the untraced sim wall time with the "
              f"writer process ({traced_cpu / untraced_cpu:.2f}× the simulator's own CPU time), "
              f"{in_process / untraced:.2f}× with the writer in-process; {first['spans']} spans, "
              f"{first['bytes'] / 1e6:.1f} MB, {first['bytes'] / first['output_tokens']:.1f} bytes per generated token"
              + ("" if first["bytes"] == control[0]["bytes"] else " (the control wrote a different size: "
                 "pass --control-bytes)"))
    zstd, plain = runs["traced-zstd"][0], runs["traced"][0]
    wall_ratio = median("traced-zstd", "sim_wall_s") / median("untraced", "sim_wall_s")
    cpu_ratio = median("traced-zstd", "sim_cpu_s") / median("untraced", "sim_cpu_s")
    print(f"zstd output (`--out trace.jsonl.zst`): tracing cost {wall_ratio:.2f}× the untraced sim wall time with the "
          f"writer process ({cpu_ratio:.2f}× the simulator's own CPU time); {zstd['bytes'] / 1e6:.1f} MB, which "
          "decompress to " + ("the plain trace's bytes" if zstd["content_sha256"] == plain["content_sha256"]
                              else "DIFFERENT bytes than the plain trace's"))
    if args.baseline is not None:
        print("| mode | baseline sim CPU s (+ writer) | this sim CPU s (+ writer) | ratio, all CPU "
              "| baseline sim wall s | this sim wall s | ratio |")
        print("|---|---|---|---|---|---|---|")
        for mode in BASELINE_MODES:
            a, b = median(f"baseline {mode}", "sim_cpu_s"), median(mode, "sim_cpu_s")
            ca, cb = median(f"baseline {mode}", "child_cpu_s"), median(mode, "child_cpu_s")
            wa, wb = median(f"baseline {mode}", "sim_wall_s"), median(mode, "sim_wall_s")
            print(f"| {mode} | {a:.2f} + {ca:.2f} | {b:.2f} + {cb:.2f} | {(b + cb) / (a + ca):.3f} | {wa:.2f} | "
                  f"{wb:.2f} | {wb / wa:.3f} |")
        for mode in ("traced", "traced-in-process"):
            base, mine = runs[f"baseline {mode}"][-1], runs[mode][-1]
            if not Path(base["engine_code"]).is_relative_to(trees["baseline "]):  # type: ignore[arg-type]
                raise SystemExit(f"--baseline {args.baseline}: its runs imported the engine from "
                                 f"{base['engine_code']}, not from that checkout")
            print(f"{mode}: engine code {base['engine_code']} against {mine['engine_code']}; traces "
                  f"{'byte-identical' if base['sha256'] == mine['sha256'] else 'DIFFERENT'} "
                  f"({mine['bytes']} bytes, sha256 {mine['sha256'][:16]}…)")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
