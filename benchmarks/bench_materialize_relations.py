"""Benchmark: writing the derived relations at ingest against ingest itself, in one run.

    .venv/bin/python benchmarks/bench_materialize_relations.py F.jsonl.gz --store /tmp/mr-store

Ingests the traces into a fresh store (`ingest_paths`), then writes the snapshot's derived relations as Parquet
(`infertrace.results.relations.materialize_relations`, the first step of `infertrace.results.materialize`), and
prints each step's wall and CPU seconds (the process's, all threads), the load average around it, and the
relations' share of ingest. The analyses materialised after the relations are timed by bench_first_render.py.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infertrace.results.relations import materialize_relations
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store


def _timed(step: str, run: Callable[[], object]) -> dict[str, Any]:
    load_before = os.getloadavg()
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    return {"step": step, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "load_before": load_before, "load_after": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", type=Path)
    parser.add_argument("--store", type=Path, required=True, help="a directory that does not exist yet")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.store.exists():
        parser.error(f"--store {args.store}: exists; the benchmark ingests into a fresh store")
    ingest = _timed("ingest", lambda: ingest_paths(args.store, [args.traces]))

    def relations() -> None:
        with Store.open(args.store) as store:
            materialize_relations(store)

    written = _timed("relations", relations)
    result = {"steps": [ingest, written],
              "relations_share_of_ingest_wall": written["wall_s"] / ingest["wall_s"],
              "relations_share_of_ingest_cpu": written["cpu_s"] / ingest["cpu_s"]}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
