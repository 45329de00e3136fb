"""Benchmark: what a collector's materialiser pays for each new burst of segments on a store of several hours, the
whole store against an analysis window (`collect --analysis-window`), measured side by side in one run.

    .venv/bin/infertrace simulate --fleet examples/fleets/four_models.toml --duration 10800 --seed 1 --out H3.jsonl.gz
    .venv/bin/infertrace simulate --fleet examples/fleets/four_models.toml --duration 20 --seed 2 --out G.jsonl.gz
    .venv/bin/python benchmarks/bench_analysis_window.py H3.jsonl.gz --newer G.jsonl.gz --window 1h --rounds 2

The traces are ingested into a store (not materialised). The newer traces are moved in time to start a minute after
the store's newest span (and given other trace ids): a collector's next burst of segments. Each contender, in a
fresh process on a fresh copy of the store, materialises its first snapshot (untimed here: the state a
collector's store is in), then the newer segments arrive and it materialises the next snapshot (timed: what a
collector's materialiser pays, i.e. how far the dashboard lags behind the store): `whole`, the store's every
segment, as `collect` does by default; `window`, the segments holding the store's last `--window` of spans, as
`collect --analysis-window` does (`infertrace.store.store.window_segments`). Contenders interleaved, the order
rotated per round; wall and CPU seconds of the process (all threads), and what each snapshot analysed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

from infertrace.cli.conventions import parse_analysis_window
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store

# In the contender's process: the first snapshot (untimed), the newer segments copied in, the next one (timed).
_CHILD = """
import json, shutil, sys, time
from pathlib import Path
from infertrace.results import materialize
from infertrace.store.store import Store

store_dir, hold, window = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]) or None

def snapshot():
    started = time.perf_counter(), time.process_time()
    with Store.open(store_dir, window_s=window) as store:
        materialize(store)
        timed = {"wall_s": time.perf_counter() - started[0], "cpu_s": time.process_time() - started[1]}
        first, last, spans = store.sql("SELECT min(start_ns), max(end_ns), count(*) FROM spans").fetchall()[0]
        return {**timed, "segments": len(store.segments), "spans": spans, "hours": (last - first) / 3.6e12}

first = snapshot()
for path in sorted(hold.rglob("seg-*.parquet")):
    target = store_dir / path.relative_to(hold)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, target)
print(json.dumps({"first": first, "next": snapshot()}))
"""

_TIME = re.compile(rb'"(startTimeUnixNano|endTimeUnixNano|timeUnixNano)":"(\d+)"')
_TRACE = re.compile(rb'"traceId":"([0-9a-f])')


def shifted(source: Path, out: Path, after_ns: int) -> Path:
    """The OTLP JSON lines of `source` moved in time to start one minute after `after_ns`, each trace id's first
    digit changed (other traces than the store's)."""
    with gzip.open(source, "rb") if source.suffix == ".gz" else open(source, "rb") as f:
        lines = f.read().splitlines()
    first = min(int(m.group(2)) for line in lines for m in _TIME.finditer(line) if m.group(1) != b"timeUnixNano")
    shift = after_ns + 60 * 10**9 - first
    with open(out, "wb") as f:
        for line in lines:
            line = _TIME.sub(lambda m: b'"%s":"%d"' % (m.group(1), int(m.group(2)) + shift), line)
            line = _TRACE.sub(lambda m: b'"traceId":"%x' % ((int(m.group(1), 16) + 1) % 16), line)
            f.write(line + b"\n")
    return out


def _listed(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", type=Path, help="OTLP JSON lines of several hours")
    p.add_argument("--newer", type=Path, required=True, help="OTLP JSON lines of the next burst (moved in time)")
    p.add_argument("--window", default="1h", help="the analysis window (default 1h)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/infertrace-bench-window"))
    p.add_argument("--json", type=Path, help="also write every run's figures here")
    args = p.parse_args()
    window_s = parse_analysis_window(args.window, "--window")
    assert window_s is not None

    shutil.rmtree(args.workdir, ignore_errors=True)
    base, hold = args.workdir / "base", args.workdir / "newer"
    started = time.perf_counter()
    ingest_paths(base, [args.traces])
    with Store.open(base) as store:
        newest = store.sql("SELECT max(end_ns) FROM spans").fetchall()[0][0]
    ingest_paths(hold, [shifted(args.newer, args.workdir / "newer.jsonl", newest)])
    print(f"store: {args.traces.name} ingested in {time.perf_counter() - started:.1f} s; newer segments: "
          f"{len(list(hold.rglob('seg-*.parquet')))} ({args.newer.name}, a minute after the newest span)", flush=True)

    contenders = {"whole": 0.0, "window": window_s}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for i in range(args.rounds):
        order = list(contenders)[i % 2:] + list(contenders)[:i % 2]
        for name in order:
            work = args.workdir / "work"
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(base, work)
            done = subprocess.run([sys.executable, "-c", _CHILD, str(work), str(hold), repr(contenders[name])],
                                  capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{name}: {done.stderr[-2000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["load_average"] = os.getloadavg()[0]
            runs[name].append(result)
            n = result["next"]
            print(f"round {i + 1} {name}: next snapshot {n['wall_s']:.1f} s wall, {n['cpu_s']:.1f} CPU s, "
                  f"{n['segments']} segments, {n['spans']:,} spans over {n['hours']:.2f} h "
                  f"(load {result['load_average']:.1f})", flush=True)

    print(f"\nthe next snapshot's materialisation, medians over {args.rounds} rounds (the rounds):\n")
    print("| contender | segments | spans | hours of spans | wall s | CPU s |")
    print("|---|---|---|---|---|---|")
    for name, done_runs in runs.items():
        nexts = [r["next"] for r in done_runs]
        label = "whole store" if name == "whole" else f"analysis window {args.window}"
        walls, cpus = [r["wall_s"] for r in nexts], [r["cpu_s"] for r in nexts]
        print(f"| {label} | {nexts[0]['segments']} | {nexts[0]['spans']:,} | {nexts[0]['hours']:.2f} | "
              f"{median(walls):.1f} ({_listed(walls)}) | {median(cpus):.1f} ({_listed(cpus)}) |")
    whole = median(r["next"]["cpu_s"] for r in runs["whole"])
    windowed = median(r["next"]["cpu_s"] for r in runs["window"])
    print(f"\nwindow / whole store, CPU: {windowed / whole:.2f}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
