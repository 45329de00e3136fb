"""Benchmark: writing the derived relations at ingest against ingest itself, in one run; with `--newer`, the
relations of a store's next snapshot (a collector's new segments), this code against another checkout.

    .venv/bin/python benchmarks/bench_materialize_relations.py F.jsonl.gz --store /tmp/mr-store
    .venv/bin/python benchmarks/bench_materialize_relations.py F.jsonl.gz --store /tmp/mr-store \\
        --newer G.jsonl.gz [--before DIR] [--rounds 2] [--all]

Ingests the traces into a fresh store (`ingest_paths`), then writes the snapshot's derived relations as Parquet
(`infertrace.results.relations.materialize_relations`, the first step of `infertrace.results.materialize`), and
prints each step's wall and CPU seconds (the process's, all threads), the load average around it, and the
relations' share of ingest. The analyses materialised after the relations are timed by bench_first_render.py.

With `--newer G`: G is ingested into the store (as segments a collector adds after the first snapshot is
materialised), and each contender, in a fresh process on a fresh copy of the store whose first snapshot's
relations it wrote itself, writes the relations of the new snapshot (timed: that is what a collector's
materialiser pays for each new burst of segments). Contenders: this checkout, and with `--before DIR` another one
(e.g. `git archive` of an earlier commit) run on `PYTHONPATH` from its directory; interleaved, `--rounds` times.
`--all` times the whole materialisation of each snapshot (relations, analyses, report and metrics documents)
instead of the relations alone: how far a collector's dashboard lags behind its store.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

from infertrace.results.relations import materialize_relations
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store

ROOT = Path(__file__).resolve().parents[1]

# Run in the contender's process: its relations of the store's snapshot without `--newer`'s segments (untimed:
# the state a collector's store is in), then those of the snapshot with them (timed).
_CHILD = """
import json, os, sys, time
from pathlib import Path
from infertrace.results import materialize
from infertrace.results.relations import materialize_relations
from infertrace.store.store import Store

store_dir, hold = Path(sys.argv[1]), Path(sys.argv[2])
run = materialize if sys.argv[3] == "all" else materialize_relations
newer = sorted(hold.rglob("seg-*.parquet"))
with Store.open(store_dir) as store:
    first = time.perf_counter(), time.process_time()
    run(store)
    first = time.perf_counter() - first[0], time.process_time() - first[1]
for path in newer:  # the collector's new segments arrive
    target = store_dir / path.relative_to(hold)
    target.parent.mkdir(parents=True, exist_ok=True)
    path.rename(target)
load_before = os.getloadavg()[0]
t0, c0 = time.perf_counter(), time.process_time()
with Store.open(store_dir) as store:
    run(store)
    segments = len(store.segments)
print(json.dumps({"first_wall_s": first[0], "first_cpu_s": first[1], "wall_s": time.perf_counter() - t0,
                  "cpu_s": time.process_time() - c0, "segments": segments, "new_segments": len(newer),
                  "load": [load_before, os.getloadavg()[0]]}))
"""


def _timed(step: str, run: Callable[[], object]) -> dict[str, Any]:
    load_before = os.getloadavg()
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    return {"step": step, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "load_before": load_before, "load_after": os.getloadavg()}


def _next_snapshot(base: Path, newer: Path, work: Path, code: Path | None, everything: bool) -> dict[str, Any]:
    """One contender on a fresh copy: `base` (a store without derived data) plus `newer`'s segments."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work / "store")
    shutil.copytree(newer, work / "newer")
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(work / "store"), str(work / "newer"),
                          "all" if everything else "relations"], check=True,
                         capture_output=True, text=True, env=env, cwd=code or ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _newer_segments(store: Path, traces: Path, work: Path) -> Path:
    """The segments ingest writes for `traces` into a copy of `store`, apart (as their paths in the store)."""
    copy = work / "with-newer"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(store, copy)
    existing = {p.relative_to(copy) for p in copy.rglob("seg-*.parquet")}
    ingest_paths(copy, [traces])
    held = work / "newer"
    shutil.rmtree(held, ignore_errors=True)
    for path in copy.rglob("seg-*.parquet"):
        if path.relative_to(copy) not in existing:
            target = held / path.relative_to(copy)
            target.parent.mkdir(parents=True, exist_ok=True)
            path.rename(target)
    shutil.rmtree(copy)
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", type=Path)
    parser.add_argument("--store", type=Path, required=True, help="a directory that does not exist yet")
    parser.add_argument("--newer", type=Path, help="traces ingested after the first snapshot is materialised")
    parser.add_argument("--before", type=Path, help="another checkout, measured on the same copies (with --newer)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--all", action="store_true",
                        help="with --newer: time the whole materialisation (`infertrace.results.materialize`: the "
                             "relations, then every analysis and document), not the relations alone")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.store.exists():
        parser.error(f"--store {args.store}: exists; the benchmark ingests into a fresh store")
    ingest = _timed("ingest", lambda: ingest_paths(args.store, [args.traces]))
    result: dict[str, Any] = {"ingest": ingest}
    if args.newer is None:
        def relations() -> None:
            with Store.open(args.store) as store:
                materialize_relations(store)

        written = _timed("relations", relations)
        result.update({"relations": written,
                       "relations_share_of_ingest_wall": written["wall_s"] / ingest["wall_s"],
                       "relations_share_of_ingest_cpu": written["cpu_s"] / ingest["cpu_s"]})
    else:
        work = args.store.with_name(args.store.name + "-work")
        held = _newer_segments(args.store, args.newer, work)
        contenders: dict[str, Path | None] = {"this code": None}
        if args.before is not None:
            contenders[f"before ({args.before})"] = args.before.resolve()
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
        for round_ in range(args.rounds):
            order = list(contenders)[round_ % len(contenders):] + list(contenders)[:round_ % len(contenders)]
            for name in order:
                runs[name].append(_next_snapshot(args.store, held, work / "run", contenders[name], args.all))
                print(name, json.dumps(runs[name][-1]), flush=True)
        shutil.rmtree(work)
        result["next_snapshot"] = {
            name: {"runs": measured, **{f"median_{k}": median(r[k] for r in measured)
                                        for k in ("first_wall_s", "first_cpu_s", "wall_s", "cpu_s")}}
            for name, measured in runs.items()}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
