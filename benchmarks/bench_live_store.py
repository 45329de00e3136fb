"""A store a collector keeps writing: the first render of a dashboard page and one metrics scrape just after
new segments arrived, with and without an earlier materialised snapshot to show, in one run.

    .venv/bin/infertrace simulate --fleet examples/fleets/four_models.toml --duration 600 --seed 1 --out F.jsonl.gz
    .venv/bin/infertrace simulate --fleet examples/fleets/four_models.toml --duration 20 --seed 2 --out G.jsonl.gz
    .venv/bin/python benchmarks/bench_live_store.py --traces F.jsonl.gz --newer G.jsonl.gz [--before DIR] [--json J]

The store: F ingested and materialised (as `infertrace ingest` or the collector's materialiser leaves it), then
G ingested without materialising (the segments a collector wrote since). Each measurement runs in a fresh process
(its imports done before the clock starts, as in a running server) on a fresh copy of that store:

- "newest materialised shown" (this code): the page and the scrape answer from the materialised snapshot
  (`infertrace.results.live`). This process holds the store's materialisation lock meanwhile, as a collector's
  materialiser at work would, so no background materialisation runs beside the measurement (that one costs
  what the materialisation row of BENCHMARKS.md's first-render section says, at `nice` 10);
- "nothing materialised to show" (this code's fallback): the same copy without `derived/latest.json`, so the
  page and the scrape compute the current snapshot's relations and analyses themselves;
- with `--before DIR` (another checkout, e.g. `git archive` of an earlier commit, run on `PYTHONPATH` from its
  own directory): that code's page render (its own `bench_first_render.py --render`) and scrape on the same copy.

Prints wall and CPU seconds (the child's user + system) per step and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("views/fleet.py", "views/itl_spikes.py", "views/incidents.py")


def _child(kind: str, store: Path, page: str) -> None:
    """In a fresh process: one first render of `page` (AppTest, as a running server renders it) or one scrape."""
    if kind == "render":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_first_render import render_once

        wall, cpu, _ = render_once(store, page, None)
    else:
        from infertrace.export.metrics import exposition

        # what a running endpoint has imported by its first scrape after new segments arrived
        from infertrace.results import relations  # noqa: F401
        from infertrace.store.store import Store  # noqa: F401

        started, cpu = time.perf_counter(), time.process_time()
        exposition(store)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"{wall:.3f} {cpu:.3f}")


def _timed(kind: str, store: Path, page: str = "", code: Path | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of the step as its process reports them (after its imports); `code`: another
    checkout's (its own page renderer)."""
    env = {**os.environ, "INFERTRACE_RESULTS": ""}
    command = [sys.executable, __file__, "--child", kind, "--store", str(store), "--page", page]
    if code is not None:
        env["PYTHONPATH"] = str(code)
        if kind == "render":
            command = [sys.executable, str(code / "benchmarks" / "bench_first_render.py"), "--render", page,
                       "--store", str(store)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, cwd=code)
    wall, cpu = out.stdout.strip().splitlines()[-1].split()[:2]
    return float(wall), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path)
    parser.add_argument("--newer", type=Path, help="traces ingested after the materialisation")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--before", type=Path, help="another checkout to measure on the same copies")
    parser.add_argument("--child", choices=("render", "scrape"), help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--page", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.store, args.page)
        return
    if args.traces is None or args.newer is None:
        parser.error("--traces and --newer are required")

    from infertrace.results import materialize
    from infertrace.results.background import materialising
    from infertrace.results.materialized import LATEST
    from infertrace.store.ingest import ingest_paths
    from infertrace.store.store import Store

    work = Path(tempfile.mkdtemp(prefix="bench-live-"))
    rows: list[dict[str, object]] = []

    def row(step: str, wall: float, cpu: float) -> None:
        rows.append({"step": step, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                     "load": round(os.getloadavg()[0], 1)})
        print(f"{step:<62} {wall:8.2f} s {cpu:8.2f} CPU s  load {rows[-1]['load']}", flush=True)

    try:
        prepared = work / "prepared"
        started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        ingest_paths(prepared, [args.traces])
        with Store.open(prepared) as store:
            materialize(store)
        used = resource.getrusage(resource.RUSAGE_SELF)
        row("ingest and materialise the earlier traces", time.perf_counter() - started,
            used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime)
        ingest_paths(prepared, [args.newer])
        with Store.open(prepared) as store:
            (spans,), = store.sql("SELECT count(*) FROM spans").fetchall()
            row(f"snapshot: {len(store.segments)} segments, {spans:,} spans", 0.0, 0.0)
        steps = [("render", page) for page in PAGES] + [("scrape", "")]
        modes = ["newest materialised shown", "nothing materialised to show"]
        if args.before is not None:
            modes.append(f"before ({args.before})")
        for mode in modes:
            for kind, page in steps:
                copy = work / "copy"
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(prepared, copy)
                if mode == "nothing materialised to show":
                    (copy / LATEST).unlink()
                with materialising(copy, wait=True):  # a collector's materialiser at work
                    wall, cpu_s = _timed(kind, copy, page, args.before if mode.startswith("before") else None)
                row(f"{mode}: {'first render ' + page if kind == 'render' else 'one metrics scrape'}", wall, cpu_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
