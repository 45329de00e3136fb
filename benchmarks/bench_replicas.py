"""Simulated seconds per wall second for N Llama-3-8B / H100 replicas behind one round-robin router at N times the
Azure conversation load (N tenants, each replaying the trace from its own point), traced to an OTLP JSON lines
file as `infertrace simulate --fleet` writes it (spans built and written by a child process) and untraced; and how
wall time grows with N. With `--blis PATH`, BLIS runs the same requests on N instances (round-robin) side by side.

    .venv/bin/python benchmarks/bench_replicas.py [--replicas 1,2,4,8,16] [--duration 3600] [--repeat 3] [--blis PATH]
        [--baseline DIR]

Every run is a fresh process; for each N the contenders are interleaved, each repetition in a rotated order, and
the medians are reported. "sim" is the simulation alone (after the requests are read; sink closed: the file
complete); "process" is the whole process, Python's start-up and reading the trace included, which is what BLIS's
figure is.
The scaling exponent is the least-squares slope of log(sim wall time) against log(N).

`--baseline DIR` adds both modes of the engine code in DIR (e.g. `git archive 48c09ec | tar -x -C DIR`) as contenders
of the same interleaved runs, and prints their CPU time against this checkout's and whether the traces are
byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import side_by_side

MODES = ("traced", "untraced")


def fleet_toml(replicas: int, workload: Path) -> str:
    """N replicas of one model behind a round-robin router; N tenants replaying the trace from evenly spaced points."""
    tenants = "".join(f'\n[[tenant]]\nname = "azure-{k}"\nworkload = "azure"\npath = "{workload}"\n'
                      f"offset_s = {k * 3600 / replicas}\n" for k in range(replicas))
    return (f'name = "replicas-{replicas}"\n[[router]]\nid = "router-0"\npolicy = "round_robin"\n'
            f'[[model]]\nname = "llama-3-8b"\nreplicas = {replicas}\nhardware = "H100-SXM"\n{tenants}')


def _requests(replicas: int, workload: Path, duration: float) -> tuple[Any, list[Any]]:
    from reference_engine.fleet.config import parse_fleet
    from reference_engine.fleet.workload import fleet_requests

    spec = parse_fleet(tomllib.loads(fleet_toml(replicas, workload)))
    return spec, fleet_requests(spec, duration, seed=0)


def worker(mode: str, replicas: int, workload: Path, duration: float, out: Path,
           tree: Path | None = None) -> dict[str, Any]:
    """One run of `mode` with N replicas in this (fresh) process; with `tree`, of the engine code in that checkout."""
    side_by_side.use_tree(tree)
    import reference_engine
    from reference_engine.fleet.fleet import Fleet
    from reference_engine.simulate import open_sink

    spec, requests = _requests(replicas, workload, duration)
    start, cpu = time.perf_counter(), time.process_time()
    sink = open_sink(out, None) if mode == "traced" else None
    summary = Fleet(spec, sink, seed=0).run(requests)
    if sink is not None:
        sink.close()
    result: dict[str, Any] = {"mode": mode, "replicas": replicas, "requests": summary.requests,
                              "simulated_s": summary.simulated_s, "sim_wall_s": time.perf_counter() - start,
                              "sim_cpu_s": time.process_time() - cpu, "child_cpu_s": sum(
                                  getattr(resource.getrusage(resource.RUSAGE_CHILDREN), f) for f in ("ru_utime",
                                                                                                   "ru_stime")),
                              "engine_code": str(Path(reference_engine.__file__).resolve().parent)}
    if sink is not None:  # checked after the clock stops
        result["spans"] = sink.spans_written  # type: ignore[attr-defined]
        result["bytes"] = out.stat().st_size
        result["sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
    return result


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x): the exponent k of y ∝ x^k."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    parser = side_by_side.parser(__doc__, MODES, repeat=3)
    parser.add_argument("--replicas", default="1,2,4,8,16", help="comma-separated replica counts N")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, int(args.replicas), args.workload, args.duration, args.out, args.tree)))
        return

    counts = [int(n) for n in args.replicas.split(",")]
    if args.blis:
        from benchmarks import blis  # here: a worker imports the engine only after choosing its checkout
    baseline = args.baseline.resolve() if args.baseline else None
    contenders = (list(MODES) + ([f"baseline {mode}" for mode in MODES] if baseline else [])
                  + (["blis"] if args.blis else []))
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        blis_traces: dict[int, tuple[Path, Path]] = {}
        for n in counts:
            if args.blis:
                blis_traces[n] = blis.write_trace(_requests(n, args.workload, args.duration)[1], Path(tmp) / f"blis{n}")

            def run(contender: str, n: int = n) -> dict[str, Any]:
                if contender == "blis":
                    result = blis.run(args.blis, *blis_traces[n], instances=n)
                    result["process_wall_s"], result["process_cpu_s"] = result["wall_s"], result["cpu_s"]
                    return result
                mode = contender.removeprefix("baseline ")
                tree = ["--tree", str(baseline)] if contender != mode else []
                return side_by_side.fresh_process(__file__, [
                    "--worker", mode, "--replicas", str(n), "--workload", str(args.workload), "--duration",
                    str(args.duration), "--out", str(Path(tmp) / f"{contender.replace(' ', '-')}.jsonl"), *tree])

            runs[n] = side_by_side.interleaved(contenders, args.repeat, run, label=f"N={n} ")

    def median(n: int, contender: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[n][contender])

    print(f"workload {args.workload.name}, {args.duration:.0f} s, N replicas at N× its load, round-robin; medians of "
          f"{args.repeat} fresh processes per contender and N, interleaved; load average before "
          f"{load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, after {os.getloadavg()[0]:.1f}")
    blis_cols = (" BLIS process wall s | BLIS simulated s / wall s "
                 "| traced vs BLIS: sim wall / process wall / process CPU |")
    print("| N | requests | simulated s | traced: sim wall s | simulated s / sim wall s | simulated s / process wall s "
          "| µs per request | untraced: sim wall s | simulated s / sim wall s |" + (blis_cols if args.blis else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if args.blis else ""))
    for n in counts:
        simulated, requests = median(n, "traced", "simulated_s"), runs[n]["traced"][0]["requests"]
        traced, traced_proc = median(n, "traced", "sim_wall_s"), median(n, "traced", "process_wall_s")
        untraced = median(n, "untraced", "sim_wall_s")
        row = (f"| {n} | {requests} | {simulated:.0f} | {traced:.2f} | {simulated / traced:.0f}× | "
               f"{simulated / traced_proc:.0f}× | {traced / requests * 1e6:.0f} | {untraced:.2f} | "
               f"{simulated / untraced:.0f}× |")
        if args.blis:
            wall = median(n, "blis", "process_wall_s")
            speed = median(n, "blis", "simulated_s") / wall
            cpu_speed = median(n, "blis", "simulated_s") / median(n, "blis", "process_cpu_s")
            row += (f" {wall:.2f} | {speed:.0f}× | {simulated / traced / speed:.2f} / "
                    f"{simulated / traced_proc / speed:.2f} / "
                    f"{simulated / median(n, 'traced', 'process_cpu_s') / cpu_speed:.2f} |")
        print(row)
    print("CPU s, medians: | N | traced: simulator + writer child | traced: all processes | untraced: simulator "
          "| untraced: all processes |" + (" BLIS: all threads |" if args.blis else ""))
    for n in counts:
        print(f"| {n} | {median(n, 'traced', 'sim_cpu_s'):.2f} + {median(n, 'traced', 'child_cpu_s'):.2f} | "
              f"{median(n, 'traced', 'process_cpu_s'):.2f} | {median(n, 'untraced', 'sim_cpu_s'):.2f} | "
              f"{median(n, 'untraced', 'process_cpu_s'):.2f} |"
              + (f" {median(n, 'blis', 'process_cpu_s'):.2f} |" if args.blis else ""))
    loads = [r["load_average"] for by_contender in runs.values() for c in by_contender.values() for r in c]
    print(f"load average during the runs: {min(loads):.1f}–{max(loads):.1f}")
    if baseline:
        print("| N | baseline traced: sim wall s / sim CPU s + writer | this: sim wall s / sim CPU s + writer "
              "| ratio, all CPU | baseline untraced: sim CPU s | this | traces |")
        print("|---|---|---|---|---|---|---|")
        for n in counts:
            base, mine = runs[n]["baseline traced"][-1], runs[n]["traced"][-1]
            if not Path(base["engine_code"]).is_relative_to(baseline):
                raise SystemExit(f"--baseline {baseline}: its runs imported the engine from {base['engine_code']}")
            cpu = {c: median(n, c, "process_cpu_s") for c in ("baseline traced", "traced")}
            print(f"| {n} | {median(n, 'baseline traced', 'sim_wall_s'):.2f} / "
                  f"{median(n, 'baseline traced', 'sim_cpu_s'):.2f} + {median(n, 'baseline traced', 'child_cpu_s'):.2f}"
                  f" | {median(n, 'traced', 'sim_wall_s'):.2f} / {median(n, 'traced', 'sim_cpu_s'):.2f} + "
                  f"{median(n, 'traced', 'child_cpu_s'):.2f} | {cpu['traced'] / cpu['baseline traced']:.3f} | "
                  f"{median(n, 'baseline untraced', 'sim_cpu_s'):.2f} | {median(n, 'untraced', 'sim_cpu_s'):.2f} | "
                  f"{'byte-identical' if base['sha256'] == mine['sha256'] else 'DIFFERENT'} |")
    if len(counts) > 1:
        line = (f"wall time ∝ N^k over N = {', '.join(map(str, counts))}: traced k = "
                f"{slope(counts, [median(n, 'traced', 'sim_wall_s') for n in counts]):.2f}, untraced k = "
                f"{slope(counts, [median(n, 'untraced', 'sim_wall_s') for n in counts]):.2f}")
        if args.blis:
            line += f", BLIS k = {slope(counts, [median(n, 'blis', 'process_wall_s') for n in counts]):.2f}"
        print(line)
    if args.json:
        args.json.write_text(json.dumps({str(n): r for n, r in runs.items()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
