"""Benchmark: the whole multi-model incident analysis (anomaly detection, incident grouping, topology,
root-cause ranking with evidence, attribute lift) over one simulated hour of a 4-model fleet.

    .venv/bin/infertrace simulate --fleet examples/fleets/four_models.toml --duration 3600 --seed 1 \\
        --out /tmp/fleet4h.jsonl.gz
    .venv/bin/python benchmarks/bench_rca.py /tmp/fleet4h.jsonl.gz --store /tmp/fleet4h-store --repeat 3

The store is built once (ingest is measured by the store's own benchmark); the timed part starts from an
opened store, as `infertrace report` does, and ends with the ranked causes of every incident.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from infertrace.analyzers.rca import RcaInputs, analyze_inputs, describe
from infertrace.results.relations import attach, materialize_relations
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", type=Path)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--materialized", action="store_true",
                        help="read the derived relations from the Parquet that ingest's materialisation writes "
                             "(written first, untimed, when missing), as the materialiser's and a filtered "
                             "report's analyses do; default: expand them from the spans")
    args = parser.parse_args()
    if not args.store.is_dir():
        ingest_paths(args.store, [args.traces])
    if args.materialized:
        with Store.open(args.store) as store:
            materialize_relations(store)
    runs = []
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        with Store.open(args.store) as store:
            if args.materialized and not attach(store):
                raise SystemExit(f"{args.store}: no materialised relations for its snapshot")
            inputs = RcaInputs.load(store)
            t1 = time.perf_counter()
            report = analyze_inputs(inputs)
        t2, c2 = time.perf_counter(), time.process_time()
        # CPU seconds of this process (all its threads): what the wall time would be on an idle core, roughly
        runs.append({"load_s": t1 - t0, "analyze_s": t2 - t1, "total_s": t2 - t0, "cpu_s": c2 - c0})
    with Store.open(args.store) as store:
        spans = store.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    result = {
        "requests": report.anomalies.requests,
        "models": len(report.topology.models),
        "spans": spans,
        "simulated_s": (report.anomalies.end_ns - report.anomalies.start_ns) / 1e9,
        "incidents": len(report.diagnoses),
        "runs": runs,
        "best_total_s": min(r["total_s"] for r in runs),
        "median_total_s": sorted(r["total_s"] for r in runs)[len(runs) // 2],
        "median_cpu_s": sorted(r["cpu_s"] for r in runs)[len(runs) // 2],
    }
    print("\n".join(describe(report)))
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
