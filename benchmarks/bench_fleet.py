"""Simulated seconds per wall second for a 4-model fleet (examples/fleets/four_models.toml: llama-3-8b,
qwen-2.5-1.5b, mixtral-8x7b on 2 GPUs, llama-3-70b on 4, one replica each, behind shared auth, rate limiter and
two routers), each model replaying the Azure conversation trace from a different point, i.e. four times the
trace's load, for one simulated hour: with every span written to an OTLP JSON lines file, and with tracing off.

    .venv/bin/python benchmarks/bench_fleet.py [--fleet FILE] [--duration 3600] [--repeat 1] [--json OUT]

Peers measured here on 4 replicas at 4× the Azure conversation load (issue 4): BLIS 74×, Vidur 9.5× (neither
traces). Target ≥ 100×, 25× at the very least. Reports wall-clock and CPU-time ratios (the machine is shared:
the CPU-time ratio is what an idle machine would show, roughly), and the load average during the run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from reference_engine.fleet.config import load_fleet
from reference_engine.fleet.fleet import Fleet
from reference_engine.fleet.workload import fleet_requests
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter

DEFAULT_FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleets" / "four_models.toml"


def _run(fleet: Path, duration: float, traced: bool) -> dict[str, Any]:
    spec = load_fleet(fleet)
    requests = fleet_requests(spec, duration, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.jsonl"
        writer = OtlpJsonLinesWriter(path) if traced else None
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        summary = Fleet(spec, writer, seed=0).run(requests)
        if writer is not None:
            writer.close()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        size = path.stat().st_size if traced else 0
    return {"traced": traced, "requests": summary.requests, "simulated_s": summary.simulated_s,
            "wall_s": wall, "cpu_s": cpu, "ratio_wall": summary.simulated_s / wall,
            "ratio_cpu": summary.simulated_s / cpu, "spans": summary.spans, "bytes": size,
            "output_tokens": summary.output_tokens, "load_average": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet", type=Path, default=DEFAULT_FLEET)
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--repeat", type=int, default=1, help="interleaved repetitions; the best is reported")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args()
    runs = []
    for i in range(args.repeat):
        for traced in (True, False) if i % 2 == 0 else (False, True):
            runs.append(_run(args.fleet, args.duration, traced))
            r = runs[-1]
            print(f"{'traced  ' if traced else 'untraced'}: {r['requests']} requests, {r['simulated_s']:.0f} "
                  f"simulated s in {r['wall_s']:.1f} s wall ({r['ratio_wall']:.0f}×), {r['cpu_s']:.1f} s CPU "
                  f"({r['ratio_cpu']:.0f}×); {r['spans']} spans, {r['bytes'] / 1e6:.0f} MB; "
                  f"load average {r['load_average']:.1f}", flush=True)
    for traced in (True, False):
        best = max((r for r in runs if r["traced"] is traced), key=lambda r: r["ratio_wall"])
        print(f"best {'traced' if traced else 'untraced'}: {best['ratio_wall']:.0f}× wall, "
              f"{best['ratio_cpu']:.0f}× CPU")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
