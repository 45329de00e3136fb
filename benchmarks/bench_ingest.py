"""Ingest throughput and peak memory: `infertrace ingest` against Arrow's JSON reader alone and a naive pandas
`json_normalize` baseline, measured side by side in one run.

    .venv/bin/python benchmarks/bench_ingest.py --spans 1000000 --baseline-spans 100000
    .venv/bin/python benchmarks/bench_ingest.py --trace fleet --skip-baselines --before /tmp/ingest-before

The input is real engine output. `--trace engine` (the default): the reference engine replaying the Azure LLM
conversation trace (one hour) with different seeds (so different trace and span ids), concatenated until the
file has `--spans` spans. `--trace fleet`: `infertrace simulate --fleet examples/fleets/four_models.toml
--duration 3600` (four models behind a gateway: gateway, auth, rate-limit and route spans besides the
engines'; ≈ 853k spans, 784 MB). Each contender runs in a fresh subprocess that reports its own wall time,
CPU time (user + system, all threads) and peak RSS (ru_maxrss), all counted after the imports:

- `columnar`: `ingest_paths` as `infertrace ingest` runs it, on the whole file and on its first
  `--baseline-spans` spans (memory must not grow with the file);
- `Arrow JSON reader alone`: only the parse that ingest's fast path starts with (`columnar.parse_block`, on
  the blocks ingest reads, read the same way), nothing flattened or written: the ceiling of this design;
- `record`: the record-by-record fallback path on the prefix (for reference);
- `pandas`: `json.loads` per line, `pandas.json_normalize` of the spans and of their attributes, pivoted to
  one column per key, on the prefix. It does not write its result, which flatters it. On the whole 1M-span
  file it takes ≈ 3.5 minutes and ≈ 10.5 GB here, so by default it runs on the prefix, and the ratio
  compares both on that same prefix; `--baseline-spans 0` runs it (and the prefix rows) on the whole file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AZURE = ROOT.parent / "shared" / "workloads" / "azure_conv_2023.csv"
FLEET = ROOT / "examples" / "fleets" / "four_models.toml"


def generate(path: Path, spans: int) -> int:
    """Writes whole OTLP JSON lines until at least `spans` spans; returns the exact count."""
    from reference_engine.engine.config import EngineConfig
    from reference_engine.simulate import WorkloadSpec, simulate
    from reference_engine.telemetry.otlp import OtlpJsonLinesWriter

    total = 0
    seed = 0
    with open(path, "wb") as out:
        while total < spans:
            part = path.with_suffix(f".part{seed}")
            config = EngineConfig(instance_id=f"engine-{seed}")
            requests = WorkloadSpec("azure", AZURE).requests(3600.0, seed, config.model)
            writer = OtlpJsonLinesWriter(part)
            simulate(config, requests, writer, seed)
            with open(part, "rb") as f:
                for line in f:
                    if total >= spans:
                        break
                    out.write(line)
                    total += line.count(b'"spanId"')
            part.unlink()
            seed += 1
    return total


def generate_fleet(path: Path) -> int:
    """The benchmark fleet's hour as OTLP JSON lines; returns the span count."""
    done = subprocess.run([sys.executable, "-m", "infertrace.cli", "simulate", "--fleet", str(FLEET), "--duration",
                           "3600", "--no-progress", "--out", str(path)], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"simulate --fleet failed:\n{done.stderr}")
    with open(path, "rb") as f:
        return sum(line.count(b'"spanId"') for line in f)


def prefix(src: Path, dst: Path, spans: int) -> int:
    total = 0
    with open(src, "rb") as f, open(dst, "wb") as out:
        for line in f:
            if total >= spans:
                break
            out.write(line)
            total += line.count(b'"spanId"')
    return total


CHILD = r"""
import json, resource, sys, time
from pathlib import Path
kind, path, store = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
import pandas as pd
from infertrace.store.ingest import ingest_paths
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
start, start_cpu = time.perf_counter(), cpu()  # after the imports
if kind in ("columnar", "record"):
    summary = ingest_paths(store, [path], columnar=kind == "columnar")
    spans = summary.spans_read
elif kind == "arrow-parse":  # Arrow's JSON reader alone, on the blocks ingest reads: the ceiling
    import pyarrow.compute as pc
    from infertrace.store.columnar import parse_block
    from infertrace.store.ingest import DEFAULT_BLOCK_BYTES, DEFAULT_MAX_LINE_BYTES, _Lines
    spans = 0
    with open(path, "rb") as f:
        lines = _Lines(f, DEFAULT_MAX_LINE_BYTES, str(path))
        while (read := lines.block(DEFAULT_BLOCK_BYTES)).lines:
            table = parse_block(read.data, read.longest)
            scopes = pc.struct_field(pc.list_flatten(table.column("resourceSpans")), "scopeSpans")
            spans += pc.sum(pc.list_value_length(pc.struct_field(pc.list_flatten(scopes), "spans"))).as_py()
else:
    frames = []
    with open(path, "rb") as f:
        for line in f:
            data = json.loads(line)
            frames.append(pd.json_normalize(data["resourceSpans"], record_path=["scopeSpans", "spans"],
                                            meta=["resource"]))
    df = pd.concat(frames, ignore_index=True)
    attributes = df["attributes"].explode().dropna()
    long = pd.json_normalize(attributes.tolist())
    long.index = attributes.index
    values = long.drop(columns=["key"])
    wide = values.set_index(long["key"], append=True).unstack("key")
    wide.columns = [f"{key}.{field}" for field, key in wide.columns]
    df = df.drop(columns=["attributes"]).join(wide)
    spans = len(df)
elapsed = time.perf_counter() - start
print(json.dumps({"spans": spans, "seconds": elapsed, "cpu_seconds": cpu() - start_cpu,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(kind: str, path: Path, store: Path, tree: Path = ROOT) -> dict[str, float]:
    shutil.rmtree(store, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", CHILD, kind, str(path), str(store)], capture_output=True, text=True,
                          cwd=tree)
    if done.returncode:
        raise RuntimeError(f"{kind} on {path} failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["spans_per_s"] = result["spans"] / result["seconds"]
    result["mb_per_s"] = path.stat().st_size / 1e6 / result["seconds"]
    result["load_average"] = os.getloadavg()[0]
    return result


ARROW = "Arrow JSON reader alone (no flattening, no writing)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", choices=("engine", "fleet"), default="engine")
    parser.add_argument("--spans", type=int, default=1_000_000, help="spans of the engine trace")
    parser.add_argument("--baseline-spans", type=int, default=100_000,
                        help="spans of the prefix the baseline runs on (0: the whole file)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of ingest and Arrow alone (and --before), "
                        "alternating; each round's ratio is taken within the round")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/infertrace-bench-ingest"))
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--before", type=Path, help="another checkout (e.g. `git archive` of the previous commit): "
                        "its ingest runs on the whole file too, in every round")
    parser.add_argument("--skip-baselines", action="store_true", help="leave out the record and pandas rows")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    full = args.workdir / (f"azure-{args.spans}.jsonl" if args.trace == "engine" else "fleet-four-models-1h.jsonl")
    if not full.exists():
        t = time.perf_counter()
        n = generate(full, args.spans) if args.trace == "engine" else generate_fleet(full)
        print(f"generated {full} ({n} spans, {full.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.0f} s",
              file=sys.stderr)
    part = full
    if args.baseline_spans:
        part = args.workdir / f"{full.stem}-first-{args.baseline_spans}.jsonl"
        prefix(full, part, args.baseline_spans)
    store = args.workdir / "store"
    on = f"first {args.baseline_spans} spans" if args.baseline_spans else "whole file, again"
    load_at_start = os.getloadavg()
    results: dict[str, dict[str, float]] = {}
    rounds: list[dict[str, dict[str, float]]] = []
    for i in range(args.rounds):
        contenders = [("columnar", ROOT), ("arrow-parse", ROOT)] + ([("columnar", args.before)] if args.before else [])
        this: dict[str, dict[str, float]] = {}
        for kind, tree in contenders[i % len(contenders):] + contenders[:i % len(contenders)]:  # rotate the order
            name = ARROW if kind == "arrow-parse" else "ingest" if tree == ROOT else f"ingest, {tree}"
            this[name] = results[f"{name}, whole file, round {i + 1}"] = run(kind, full, store, tree)
        rounds.append(this)
    if not args.skip_baselines:
        results[f"columnar, {on}"] = run("columnar", part, store)
        results[f"record, {on}"] = run("record", part, store)
        results[f"pandas json_normalize, {on}"] = run("pandas", part, store)
    load = os.getloadavg()
    first = results[next(iter(results))]
    print(f"file: {full.name}, {full.stat().st_size / 1e6:.0f} MB, {first['spans']} spans "
          f"({full.stat().st_size / first['spans']:.0f} bytes/span); load average {load_at_start[0]:.1f} at the start, "
          f"{load[0]:.1f} at the end, on {os.cpu_count()} cores")
    print("| contender | spans | seconds | spans/s | MB/s | CPU s | peak RSS MB | load |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['spans']} | {r['seconds']:.1f} | {r['spans_per_s']:,.0f} | {r['mb_per_s']:.1f} | "
              f"{r['cpu_seconds']:.1f} | {r['peak_rss_mb']:.0f} | {r['load_average']:.1f} |")
    ratios: dict[str, list[str]] = {}
    for i, this in enumerate(rounds):
        arrow = this[ARROW]
        for name, r in this.items():
            if name != ARROW:
                ratios.setdefault(name, []).append(
                    f"round {i + 1}: {arrow['seconds'] / r['seconds']:.2f}× in wall time, "
                    f"{arrow['cpu_seconds'] / r['cpu_seconds']:.2f}× in CPU time")
    for name, said in ratios.items():
        print(f"{name}, throughput relative to Arrow's JSON reader alone: " + "; ".join(said))
    if not args.skip_baselines:
        ratio = results[f"columnar, {on}"]["spans_per_s"] / results[f"pandas json_normalize, {on}"]["spans_per_s"]
        print(f"ratio columnar / pandas (same input, {on}): {ratio:.1f}×")
    if args.json:
        args.json.write_text(json.dumps({"load_average": [load_at_start, load], "results": results}, indent=2))


if __name__ == "__main__":
    main()
