"""Full ITL analysis (`analyze_itl`, from opening the store to the typed result) on one simulated hour of a
4-model fleet, and, in the same run, a straightforward pandas `merge_asof` token-to-step join (every token
of every request matched to the step that produced it, then ITL by `groupby().shift()`) for comparison.

    .venv/bin/python benchmarks/bench_itl.py [--duration 3600] [--seed 1] [--work DIR] [--threads 2]
    .venv/bin/python benchmarks/bench_itl.py --store DIR   # a store already ingested, e.g. from
        infertrace simulate --fleet examples/fleets/four_models.toml --duration 3600 --out F.jsonl.gz
        infertrace ingest --store DIR F.jsonl.gz

Without --store the fleet is `reference_engine.scenarios.random_fleet` with 4 models; its traces are
simulated and ingested into DIR once (reused when present). Target: the full analysis ≤ 10 s on 2 cores.
Wall and CPU time (this process, all threads) are reported with the load average: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import pandas as pd

from infertrace.analyzers.itl import analyze_itl
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store


def prepare(work: Path, duration: float, seed: int) -> Path:
    store_dir = work / "store"
    if (store_dir / "READY").is_file():
        return store_dir
    from reference_engine.fleet.fleet import Fleet
    from reference_engine.fleet.workload import fleet_requests
    from reference_engine.scenarios.families import random_fleet
    from reference_engine.telemetry.otlp import OtlpJsonLinesWriter

    work.mkdir(parents=True, exist_ok=True)
    fleet = random_fleet(random.Random(seed), "bench-itl", num_models=4)
    trace = work / "fleet.jsonl.gz"
    writer = OtlpJsonLinesWriter(trace)
    started = time.perf_counter()
    try:
        Fleet(fleet, writer, seed).run(fleet_requests(fleet, duration, seed))
    finally:
        writer.close()
    print(f"simulated {duration:.0f} s of the fleet in {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    ingest_paths(store_dir, [trace])
    print(f"ingested in {time.perf_counter() - started:.0f} s")
    (store_dir / "READY").write_text("ok\n")
    return store_dir


def merge_asof_join(store: Store) -> tuple[int, float, float, float]:
    """The straightforward pandas form of the token-to-step join: every token (its request, engine and time,
    from the `tokens` relation, fetched before the clock starts) matched to the step that produced it with
    `merge_asof` (the last step of its engine ending at or before the token), then ITL per request with
    `groupby().shift()` (kept in int64: `diff()`, or a shift that fills NaN, goes through float64 and is off by
    up to 256 ns). Keys are integer codes, as one
    would write it for speed. Returns (tokens, wall seconds, CPU seconds, share of ITLs equal to the store's
    `itl_ns`)."""
    # Fetched in a fixed order (each engine's steps in order, each request's tokens in order), so the timed
    # part does the same sorting whatever order DuckDB would otherwise return rows in.
    steps = store.sql("SELECT instance, end_ns, step_index FROM steps ORDER BY instance, step_index").df()
    tokens = store.sql("SELECT request_id, instance, time_ns, itl_ns FROM tokens "
                       "ORDER BY request_id, token_index").df()
    started, cpu_started = time.perf_counter(), time.process_time()
    n_steps = len(steps)
    codes = pd.factorize(pd.concat([steps["instance"], tokens["instance"]], ignore_index=True))[0]
    steps = pd.DataFrame({"engine": codes[:n_steps], "time_ns": steps["end_ns"].to_numpy(),
                          "step_index": steps["step_index"].to_numpy()}).sort_values("time_ns", kind="stable")
    frame = pd.DataFrame({"request": pd.factorize(tokens["request_id"])[0], "engine": codes[n_steps:],
                          "time_ns": tokens["time_ns"].to_numpy(), "expected": tokens["itl_ns"].to_numpy()})
    frame = frame.sort_values("time_ns", kind="stable")
    joined = pd.merge_asof(frame, steps, on="time_ns", by="engine", direction="backward")
    joined = joined.sort_values(["request", "time_ns"], kind="stable")
    previous = joined.groupby("request")["time_ns"].shift(fill_value=-1)  # stays int64 (NaN would not)
    joined["itl_ns"] = (joined["time_ns"] - previous).where(previous >= 0)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    both = joined["expected"].notna() & joined["itl_ns"].notna()
    agree = float((joined.loc[both, "expected"] == joined.loc[both, "itl_ns"]).mean()) if both.any() else 0.0
    return len(joined), seconds, cpu, agree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("/tmp/infertrace-bench-itl"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--store", type=Path, default=None, help="an ingested store to analyze (no simulation)")
    args = parser.parse_args()
    store_dir = args.store or prepare(args.work, args.duration, args.seed)
    load_before = os.getloadavg()
    started, cpu_started = time.perf_counter(), time.process_time()
    with Store.open(store_dir, threads=args.threads) as store:
        result = analyze_itl(store)
        analysis_s, analysis_cpu = time.perf_counter() - started, time.process_time() - cpu_started
        load_after = os.getloadavg()
        tokens = sum(e.tokens for e in result.engines)
        steps = store.sql("SELECT count(*) FROM steps").fetchall()[0][0]
        spans = store.sql("SELECT count(*) FROM spans").fetchall()[0][0]
        rows, asof_s, asof_cpu, agree = merge_asof_join(store)
    print(f"store {store_dir}: spans {spans:,}, engines {len(result.engines)}, steps {steps:,}, tokens {tokens:,}, "
          f"stalls {len(result.stalls):,}, threads {args.threads}")
    print(f"load average (1/5/15 min) before {load_before[0]:.1f}/{load_before[1]:.1f}/{load_before[2]:.1f}, "
          f"after analyze_itl {load_after[0]:.1f}/{load_after[1]:.1f}/{load_after[2]:.1f}")
    print(f"analyze_itl (open store → result): wall {analysis_s:.2f} s, CPU {analysis_cpu:.2f} s")
    print(f"pandas merge_asof token-to-step join + ITL: wall {asof_s:.2f} s, CPU {asof_cpu:.2f} s "
          f"for {rows:,} tokens (after fetching steps and tokens; ITL equal to the store's on {agree:.2%} of them)")


if __name__ == "__main__":
    main()
