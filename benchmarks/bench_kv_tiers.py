"""Prefix hit rate on the public Mooncake trace as a host-memory KV tier grows behind one GPU, read from the
exported spans by the prefix-cache analyzer, against the trace's own infinite-cache bound; what the GPU-only
run's reuse accounting predicted more capacity would buy; and what the copies back cost.

Llama-3-8B on one H100-SXM (decode-first, chunked prefill, 8192-token budget, 64 sequences, prefix caching),
the first `--trace-s` seconds of `../shared/workloads/mooncake_synthetic.jsonl` replayed at `--speedup`. Host
tiers are multiples of the GPU's own KV memory.

    .venv/bin/python benchmarks/bench_kv_tiers.py [--trace-s 150] [--speedup 0.5] [--times 0 1 4 12]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from infertrace.analyzers.prefix_cache import analyze_prefix_cache
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.llm_engine import num_kv_blocks
from reference_engine.engine.models import model
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.workload import mooncake_requests, mooncake_reusable_tokens

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "workloads" / "mooncake_synthetic.jsonl"
TTFT = """SELECT quantile_cont("attr.gen_ai.latency.time_to_first_token", [0.5, 0.99]) AS q
          FROM spans WHERE name = 'llm_request'"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace-s", type=float, default=150.0, help="seconds of the trace to replay")
    parser.add_argument("--speedup", type=float, default=0.5)
    parser.add_argument("--times", type=float, nargs="+", default=[0, 1, 4, 12],
                        help="host tiers, in multiples of the GPU's KV memory")
    args = parser.parse_args()
    start = time.perf_counter()
    requests = mooncake_requests(MOONCAKE, duration_s=args.trace_s / args.speedup, speedup=args.speedup)
    reusable, total = mooncake_reusable_tokens(MOONCAKE, len(requests))
    bound = reusable / total
    spec = model("llama-3-8b")
    base = EngineConfig(hardware="H100-SXM", policy="decode_first", chunked_prefill=True, max_num_batched_tokens=8192,
                        max_num_seqs=64, kv_reuse_accounting=True)
    gpu_blocks = num_kv_blocks(base, spec)
    gpu_gb = gpu_blocks * base.block_size * spec.kv_bytes_per_token / 1e9
    print(f"{len(requests)} requests ({args.trace_s:.0f} s of the Mooncake trace at {args.speedup}× its rate); "
          f"infinite-cache bound {bound:.2%} of prompt tokens; GPU KV {gpu_blocks} blocks = {gpu_gb:.1f} GB")
    print("| host tier | GB | hit rate | from GPU | from host | copy time s | TTFT p50 s | TTFT p99 s |")
    print("|---|---|---|---|---|---|---|---|")
    capacity = {}
    with tempfile.TemporaryDirectory() as tmp:
        for times in args.times:
            name = f"host-{times:g}x"
            config = EngineConfig(**{**base.__dict__, "kv_host_tier_gb": times * gpu_gb * 1.0001, "instance_id": name})
            trace = Path(tmp) / f"{name}.jsonl"
            simulate(config, requests, OtlpJsonLinesWriter(trace))
            ingest_paths(Path(tmp) / name, [trace])
            with Store.open(Path(tmp) / name) as store:
                result = analyze_prefix_cache(store)
                ((p50, p99),) = store.sql(TTFT).fetchall()[0]
            (t,) = result.by_tier
            if times == 0:
                capacity = {c.extra_blocks: c.hit_rate for c in result.capacity}
            print(f"| {times:g}× | {times * gpu_gb:.0f} | {t.hit_rate:.2%} | {t.device_hit_rate:.2%} | "
                  f"{t.host_hit_rate:.2%} | {t.load_s:.2f} | {p50:.2f} | {p99:.2f} |")
    print("GPU-only run's prediction of what more capacity buys (extra KV blocks → hit rate): "
          + ", ".join(f"{'unbounded' if k is None else f'+{k / gpu_blocks:g}×'} → {v:.2%}"
                      for k, v in capacity.items()))
    print(f"({time.perf_counter() - start:.1f} s, load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
