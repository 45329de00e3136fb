"""Ingest throughput and peak memory: `infertrace ingest` against Arrow's JSON reader alone and a naive pandas
`json_normalize` baseline, measured side by side in one run.

    .venv/bin/python benchmarks/bench_ingest.py --trace engine --rounds 3 --skip-baselines
    .venv/bin/python benchmarks/bench_ingest.py --trace fleet --rounds 3 --skip-baselines --before /tmp/ingest-before
    .venv/bin/python benchmarks/bench_ingest.py --trace engine --spans 1000000 --baseline-spans 100000
    .venv/bin/python benchmarks/bench_ingest.py --trace fleet --parsers 4 --rounds 3
    .venv/bin/python benchmarks/bench_ingest.py --trace engine --rounds 3 --skip-baselines --shapes

The input is real engine output. `--trace engine` (the default): one engine (Llama-3-8B on H100) replaying
the Azure LLM conversation trace for an hour, written by `infertrace simulate --workload azure --duration
3600`; with `--spans N`, instead the same replay with different seeds (so different trace and span ids),
concatenated until the file has N spans. `--trace fleet`: `infertrace simulate --fleet
examples/fleets/four_models.toml --duration 3600` (four models behind a gateway: gateway, auth, rate-limit
and route spans besides the engines'; ≈ 853k spans, 784 MB). `--file PATH` benchmarks an existing file.

Each contender runs in a fresh subprocess that reports its own wall time, CPU time (user + system, all
threads) and peak RSS (ru_maxrss), all counted after the imports. `--rounds` rounds alternate, each in its
own order (rotated per round):

- `ingest`: `ingest_paths` as `infertrace ingest` runs it, on the whole file;
- `pyarrow.json.read_json alone`: Arrow's JSON reader reading the same whole file into one table with the
  OTLP schema ingest parses with (`columnar.OTLP_SCHEMA`), on its threads, nothing flattened or written;
- `pyarrow.json.read_json alone, schema inferred`: the same, with the schema Arrow infers from the file (only
  the fields the file sets; a second reference, not what ingest can run: inference crashes the process on a
  line nested 100,000 deep, which the OTLP schema ignores);
- `--arrow-blocks`: also Arrow's reader on the blocks ingest reads, read the same way (`parse_block`);
- `--duckdb-parse`: also ingest with DuckDB's `json_transform` in place of Arrow's reader (a measurement of
  what a faster parse would give; not type-safe, so not what ingest runs);
- `--stages`: also ingest's steps one after another on each block, on this thread (reading lines, the parse,
  the pivot into the span table, the Parquet segments), each step's CPU time summed over the blocks: the
  parse's ratio to the reader alone bounds what ingest can reach by making the other steps cheaper;
- `--before DIR`: another checkout's ingest (e.g. `git archive` of an earlier commit) on the same file;
- `--shapes`: also ingest of the same spans in the other shapes ingest reads (docs/store.md), each written once
  before the rounds: gzip (level 6, as the engine writes it), zstd (level 1, as the engine writes it), and the
  OpenTelemetry Collector's file exporter's length-prefixed messages, as `protobuf` (`format: proto`) and as
  zstd-compressed JSON (`compression: zstd`, one frame per message), and trace JSON as other tools print it (the
  protobuf library's generic JSON mapping, a line per message, and the same pretty-printed: `store/json_forms.py`);
  `--shape SUFFIX` (repeatable) keeps only the shapes whose file suffix is given (`.pb` for `format: proto`), and
  with `--before` the other checkout ingests each shape too.

`--parsers` instead compares JSON readers on the same blocks, in this process: Arrow's reader on its threads
with the full OTLP schema, as ingest reads them (`columnar.BlockParser`: after the first block, the schema less
the fields no earlier block set), and on the calling thread, DuckDB's `json_transform` into the same nested
columns (from the block's lines as an Arrow string array, exported to Arrow or only counted), DuckDB's parse alone, and
DuckDB parsing, unnesting the spans and writing Parquet in one plan (no attribute pivot); CPU time per round,
the order rotated per round. It also shows what each reader makes of a few lines the record path rejects.

It prints every run, then per contender the medians over the rounds, and the throughput ratios to Arrow's
reader alone taken within each round (wall and CPU time) with their medians. Without `--skip-baselines` it
also runs, on the first `--baseline-spans` spans, ingest, the record-by-record fallback path and `pandas`:
`json.loads` per line, `pandas.json_normalize` of the spans and of their attributes, pivoted to one column
per key. It does not write its result, which flatters it. On the whole 1M-span file it takes ≈ 3.5 minutes
and ≈ 10.5 GB here, so by default it runs on the prefix; `--baseline-spans 0` runs it on the whole file.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

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


def simulate_hour(path: Path, fleet: bool) -> int:
    """One hour as OTLP JSON lines, written by `infertrace simulate` (the fleet, or one engine on the Azure
    trace); returns the span count."""
    what = ["--fleet", str(FLEET)] if fleet else ["--model", "llama-3-8b", "--hardware", "H100-SXM", "--workload",
                                                  "azure", "--workload-file", str(AZURE)]
    done = subprocess.run([sys.executable, "-m", "infertrace.cli", "simulate", *what, "--duration", "3600",
                           "--no-progress", "--out", str(path)], capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"simulate failed:\n{done.stderr}")
    with open(path, "rb") as f:
        return sum(line.count(b'"spanId"') for line in f)


SHAPES = {"gzip": ".jsonl.gz", "zstd": ".jsonl.zst", "Collector, format: proto": ".pb",
          "Collector, compression: zstd": ".zstd-frames",
          "protobuf generic JSON mapping (base64 ids, enum names), a line per message": ".generic.jsonl",
          "the same pretty-printed, one value after another (jq .)": ".pretty.json"}


def write_shapes(full: Path, suffixes: list[str] | None = None) -> dict[str, Path]:
    """`full`'s lines in each of `SHAPES` (or those of the given file suffixes), beside it (written once; kept for
    later runs)."""
    import gzip

    import zstandard
    from google.protobuf import json_format

    from infertrace.otlp_json import parse_traces_data

    out = {}
    for shape, suffix in SHAPES.items():
        if suffixes and suffix not in suffixes:
            continue
        path = out[shape] = full.with_name(full.stem + suffix)
        if path.exists():
            continue
        part = path.with_name(path.name + ".part")
        with open(full, "rb") as lines, open(part, "wb") as raw:
            if suffix == ".jsonl.gz":
                with gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6, mtime=0) as packed:
                    shutil.copyfileobj(lines, packed)
            elif suffix == ".jsonl.zst":
                with zstandard.ZstdCompressor(level=1, write_checksum=True).stream_writer(raw) as packed:
                    shutil.copyfileobj(lines, packed)
            elif suffix in (".generic.jsonl", ".pretty.json"):
                for line in lines:
                    generic = json_format.MessageToDict(parse_traces_data(line))
                    raw.write(json.dumps(generic, indent=2 if suffix == ".pretty.json" else None).encode() + b"\n")
            else:
                packer = zstandard.ZstdCompressor(level=3)
                for line in lines:
                    body = parse_traces_data(line).SerializeToString() if suffix == ".pb" else packer.compress(
                        line.rstrip(b"\n"))
                    raw.write(len(body).to_bytes(4, "big") + body)
        part.rename(path)
    return out


def longest_line(path: Path) -> int:
    with open(path, "rb") as f:
        return max((len(line) for line in f), default=0)


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
kind, path, store, longest = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
import pandas as pd
from infertrace.store.ingest import ingest_paths
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
if kind == "duckdb-parse":  # ingest with Arrow's parse swapped for DuckDB's json_transform (not type-safe)
    import infertrace.store.ingest
    sys.path.insert(0, "benchmarks")
    from bench_ingest import duckdb_parse_block
    infertrace.store.ingest.BlockParser.parse = lambda self, data, longest, objects=None: duckdb_parse_block(
        bytes(data), longest)  # every block: ingest parses through `BlockParser` (a copy out of its buffer)
start, start_cpu = time.perf_counter(), cpu()  # after the imports
if kind in ("columnar", "record", "duckdb-parse"):
    summary = ingest_paths(store, [path], columnar=kind != "record")
    spans = summary.spans_read
elif kind == "stages":  # ingest's steps one after another on each block, each step's CPU time summed
    from infertrace.store.columnar import BlockParser, spans_table
    from infertrace.store.ingest import DEFAULT_BLOCK_BYTES, DEFAULT_MAX_LINE_BYTES, _Lines, gc_paused
    from infertrace.store.segments import write_segments
    steps = dict.fromkeys(("read lines", "parse", "pivot", "write"), 0.0)
    def timed(step, work, *args):
        started = cpu()
        result = work(*args)
        steps[step] += cpu() - started
        return result
    spans = 0
    blocks = BlockParser()
    with gc_paused(), open(path, "rb") as f:
        lines = _Lines(f, DEFAULT_MAX_LINE_BYTES, str(path))
        while (read := timed("read lines", lines.block, DEFAULT_BLOCK_BYTES)).lines:
            parsed = timed("parse", blocks.parse, read.data, read.longest, read.objects)
            table, notes = timed("pivot", spans_table, parsed)
            timed("write", write_segments, store, table, notes)
            spans += table.num_rows
elif kind == "read_json":  # Arrow's JSON reader alone on the whole file, with the schema ingest parses with
    import pyarrow.compute as pc
    import pyarrow.json as pj
    from infertrace.store.columnar import OTLP_SCHEMA
    table = pj.read_json(path, read_options=pj.ReadOptions(block_size=max(4 << 20, longest + 1), use_threads=True),
                         parse_options=pj.ParseOptions(explicit_schema=OTLP_SCHEMA, unexpected_field_behavior="ignore"))
    scopes = pc.struct_field(pc.list_flatten(table.column("resourceSpans")), "scopeSpans")
    spans = pc.sum(pc.list_value_length(pc.struct_field(pc.list_flatten(scopes), "spans"))).as_py()
elif kind == "read_json_inferred":  # Arrow's JSON reader alone on the whole file, inferring the schema itself
    import pyarrow.compute as pc
    import pyarrow.json as pj
    table = pj.read_json(path, read_options=pj.ReadOptions(block_size=max(4 << 20, longest + 1), use_threads=True))
    scopes = pc.struct_field(pc.list_flatten(table.column("resourceSpans")), "scopeSpans")
    spans = pc.sum(pc.list_value_length(pc.struct_field(pc.list_flatten(scopes), "spans"))).as_py()
elif kind == "arrow-blocks":  # Arrow's JSON reader alone, on the blocks ingest reads
    import pyarrow.compute as pc
    from infertrace.store.columnar import BlockParser
    from infertrace.store.ingest import DEFAULT_BLOCK_BYTES, DEFAULT_MAX_LINE_BYTES, _Lines
    spans = 0
    with open(path, "rb") as f:
        lines = _Lines(f, DEFAULT_MAX_LINE_BYTES, str(path))
        while (read := lines.block(DEFAULT_BLOCK_BYTES)).lines:
            table = BlockParser().parse(read.data, read.longest, read.objects)  # each block in full
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
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  **({"steps": steps} if kind == "stages" else {})}))
"""


_DUCKDB_SCALARS = {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN"}


def _duckdb_type(arrow: pa.DataType) -> str:
    """A `json_transform` structure for an Arrow type (an empty struct, which DuckDB lacks, as raw JSON)."""
    if pa.types.is_struct(arrow):
        if not arrow.num_fields:
            return '"JSON"'
        return "{" + ",".join(f"{json.dumps(f.name)}:{_duckdb_type(f.type)}" for f in arrow) + "}"
    if pa.types.is_list(arrow):
        return "[" + _duckdb_type(arrow.value_type) + "]"
    return json.dumps(_DUCKDB_SCALARS[arrow])


def _lines_table(data: bytes, chunks: int) -> pa.Table:
    """A block's lines as one string column in `chunks` chunks (zero copy), for DuckDB to scan in parallel."""
    text = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(text == ord("\n"))
    offsets = pa.py_buffer(np.concatenate([[0], ends + 1]).astype(np.int32))
    lines = pa.StringArray.from_buffers(len(ends), offsets, pa.py_buffer(data))
    step = max(1, -(-len(lines) // chunks))
    return pa.table({"line": pa.chunked_array([lines.slice(i, step) for i in range(0, len(lines), step)])})


_DUCKDB: list[Any] = []  # the connection of duckdb_parse_block (ingest parses on one thread)


def duckdb_parse_block(data: bytes, longest_line: int) -> pa.Table | None:
    """`columnar.parse_block` with DuckDB's `json_transform` in place of Arrow's reader, for `--duckdb-parse`.
    A measurement only: DuckDB coerces values of the wrong JSON type that Arrow refuses (see `--parsers`), so
    ingest cannot take it as it is."""
    import duckdb

    from infertrace.store.columnar import OTLP_SCHEMA, _every_line_an_object

    if not _every_line_an_object(data):
        return None
    if not _DUCKDB:
        _DUCKDB.append(duckdb.connect())
        _DUCKDB[0].execute("SET threads = $n", {"n": os.cpu_count() or 1})
    con = _DUCKDB[0]
    con.register("lines", _lines_table(data, 4))
    try:
        return con.sql("SELECT json_transform(line, $s).resourceSpans AS resourceSpans FROM lines",
                       params={"s": _structure(OTLP_SCHEMA)}).to_arrow_table()
    except duckdb.Error:
        return None
    finally:
        con.unregister("lines")


def _structure(schema: pa.Schema) -> str:
    return "{" + '"resourceSpans":' + _duckdb_type(schema.field("resourceSpans").type) + "}"


HOSTILE = {  # lines the record path quarantines or reads differently from how DuckDB's transform coerces them
    "span id as a JSON number": '{"spanId": 1234567890123456, "kind": 1}',
    "kind 1.5": '{"spanId": "1234567890abcdef", "kind": 1.5}',
    "kind as the string \"2\"": '{"spanId": "1234567890abcdef", "kind": "2"}',
    "doubleValue as a string": '{"spanId": "1234567890abcdef", "value": {"doubleValue": "1e3"}}',
    "boolValue as 1": '{"spanId": "1234567890abcdef", "value": {"boolValue": 1}}',
}


def compare_parsers(path: Path, blocks: int, rounds: int, workdir: Path) -> None:
    """JSON readers side by side on the same blocks of `path` (see the module docstring)."""
    import duckdb
    import pyarrow.json as pj

    from infertrace.store.columnar import _PARSE, OTLP_SCHEMA, BlockParser, parse_block
    from infertrace.store.ingest import DEFAULT_BLOCK_BYTES, DEFAULT_MAX_LINE_BYTES, _Lines

    reads = []
    with open(path, "rb") as f:
        lines = _Lines(f, DEFAULT_MAX_LINE_BYTES, str(path))
        while len(reads) < blocks and (read := lines.block(DEFAULT_BLOCK_BYTES)).lines:
            reads.append(dataclasses.replace(read, data=bytes(read.data)))  # kept: out of the reused buffers
    structure = _structure(OTLP_SCHEMA)
    con = duckdb.connect()
    con.execute("SET threads = $n", {"n": os.cpu_count() or 1})
    unnest = ("WITH r AS (SELECT unnest(json_transform(line, $s).resourceSpans) AS r FROM lines), "
              "s AS (SELECT r.resource.attributes AS res, unnest(r.scopeSpans) AS s FROM r), "
              "p AS (SELECT res, s.scope AS scope, unnest(s.spans) AS sp FROM s) "
              "SELECT sp.traceId AS trace_id, sp.spanId AS span_id, sp.parentSpanId AS parent_span_id, sp.name, "
              "sp.kind::TINYINT AS kind, sp.startTimeUnixNano::BIGINT AS start_ns, "
              "sp.endTimeUnixNano::BIGINT AS end_ns, sp.status.code::TINYINT AS status_code, "
              "sp.status.message AS status_message, scope.name AS scope_name, scope.version AS scope_version, "
              "sp.events, res AS resource_attributes, sp.attributes AS span_attributes FROM p")

    def arrow(read: Any, threads: bool) -> None:
        options = pj.ReadOptions(block_size=max(read.longest + 1, 4 << 20), use_threads=threads)
        pj.read_json(io.BytesIO(read.data), read_options=options, parse_options=_PARSE)

    def on_duckdb(query: str, to: str) -> Callable[[Any], None]:
        def parse(read: Any) -> None:
            con.register("lines", _lines_table(read.data, 4))
            try:
                result = con.sql(query, params={"s": structure} if "$s" in query else None)
                if to == "arrow":
                    result.to_arrow_table()
                elif to == "parquet":
                    result.write_parquet(str(workdir / "parsers.parquet"))
                else:
                    result.fetchall()
            finally:
                con.unregister("lines")
        return parse

    parsers: list[BlockParser] = []

    def narrowed(read: Any) -> None:
        if read is reads[0]:  # each pass over the blocks starts a fresh ingest: its first block in full
            parsers[:] = [BlockParser()]
        parsers[0].parse(read.data, read.longest)

    contenders: dict[str, Callable[[Any], None]] = {
        "Arrow read_json on its threads, the full OTLP schema": lambda read: parse_block(read.data, read.longest),
        "Arrow read_json, narrowed after the first block, as ingest parses": narrowed,
        "Arrow read_json on the calling thread": lambda read: arrow(read, False),
        "DuckDB json_transform → Arrow": on_duckdb("SELECT json_transform(line, $s) AS t FROM lines", "arrow"),
        "DuckDB json_transform, not exported": on_duckdb("SELECT count(json_transform(line, $s)) FROM lines", ""),
        "DuckDB parse alone (json_array_length)": on_duckdb(
            "SELECT sum(json_array_length(line, '$.resourceSpans')) FROM lines", ""),
        "DuckDB parse + unnest + Parquet write, no pivot": on_duckdb(unnest, "parquet"),
    }
    base = next(iter(contenders))
    cpu_s: dict[str, list[float]] = {name: [] for name in contenders}
    wall_s: dict[str, list[float]] = {name: [] for name in contenders}
    load_at_start = os.getloadavg()[0]
    names = list(contenders)
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            started, started_cpu = time.perf_counter(), time.process_time()
            for read in reads:
                contenders[name](read)
            cpu_s[name].append(time.process_time() - started_cpu)
            wall_s[name].append(time.perf_counter() - started)
    megabytes = sum(len(read.data) for read in reads) / 1e6
    print(f"{path.name}: first {len(reads)} blocks ({megabytes:.0f} MB, {sum(r.lines for r in reads)} lines), "
          f"{rounds} rounds; load average {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
          f"on {os.cpu_count()} cores; duckdb {duckdb.__version__}, pyarrow {pa.__version__}")
    print(f"| reader | median CPU s | median wall s | {base} CPU ÷ this CPU: median (rounds) |")
    print("|---|---|---|---|")
    for name in names:
        ratios = [b / c for b, c in zip(cpu_s[base], cpu_s[name], strict=True)]
        print(f"| {name} | {statistics.median(cpu_s[name]):.2f} | {statistics.median(wall_s[name]):.2f} | "
              f"{statistics.median(ratios):.2f}× ({', '.join(f'{r:.2f}' for r in ratios)}) |")
    print("\nWhat each reader makes of values of the wrong JSON type (both told the types of these fields):")
    hostile_type = pa.schema([("spanId", pa.string()), ("kind", pa.int64()),
                              ("value", pa.struct([("doubleValue", pa.float64()), ("boolValue", pa.bool_())]))])
    for what, line in HOSTILE.items():
        try:
            arrow_says = str(pj.read_json(io.BytesIO(line.encode()), parse_options=pj.ParseOptions(
                explicit_schema=hostile_type, unexpected_field_behavior="ignore")).to_pylist()[0])
        except pa.ArrowInvalid as e:
            arrow_says = f"error ({str(e).splitlines()[0][:80]})"
        duck = "{" + ",".join(f"{json.dumps(f.name)}:{_duckdb_type(f.type)}" for f in hostile_type) + "}"
        duck_says = str(con.sql("SELECT json_transform($l, $s)", params={"l": line, "s": duck}).fetchall()[0][0])
        print(f"- {what}: `{line}` — Arrow: {arrow_says}; DuckDB: {duck_says}")


def run(kind: str, path: Path, store: Path, tree: Path | None = ROOT, longest: int = 0) -> dict[str, float]:
    shutil.rmtree(store, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", CHILD, kind, str(path), str(store), str(longest)],
                          capture_output=True, text=True, cwd=tree)
    if done.returncode:
        raise RuntimeError(f"{kind} on {path} failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["spans_per_s"] = result["spans"] / result["seconds"]
    result["mb_per_s"] = path.stat().st_size / 1e6 / result["seconds"]
    result["load_average"] = os.getloadavg()[0]
    return result


ARROW = "pyarrow.json.read_json alone, whole file"
INFERRED = "pyarrow.json.read_json alone, schema inferred"
STAGES = "ingest's steps one after another"
NAMES = {"read_json": ARROW, "read_json_inferred": INFERRED, "arrow-blocks": "Arrow's reader alone, on ingest's blocks",
         "duckdb-parse": "ingest, DuckDB's json_transform as the parse", "stages": STAGES}


def print_stages(rounds: list[dict[str, dict[str, Any]]]) -> None:
    """Each step's CPU time (medians over the rounds) and Arrow's reader alone's CPU ÷ it: the parse's ratio is
    what ingest would reach if the other steps cost nothing."""
    print(f"\nIngest's steps one after another, CPU s: medians over {len(rounds)} rounds, and Arrow's reader alone's "
          "CPU ÷ the step's (within each round)")
    print("| step | CPU s | share of the steps | ratio to read_json, CPU |")
    print("|---|---|---|---|")
    steps = rounds[0][STAGES]["steps"]
    total = statistics.median(sum(this[STAGES]["steps"].values()) for this in rounds)
    for step in [*steps, "all steps"]:
        cpu = [sum(this[STAGES]["steps"].values()) if step == "all steps" else this[STAGES]["steps"][step]
               for this in rounds]
        ratio = [this[ARROW]["cpu_seconds"] / c for this, c in zip(rounds, cpu, strict=True)]
        print(f"| {step} | {statistics.median(cpu):.2f} | {statistics.median(cpu) / total:.0%} | "
              f"{statistics.median(ratio):.2f}× ({', '.join(f'{x:.2f}' for x in ratio)}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", choices=("engine", "fleet"), default="engine")
    parser.add_argument("--spans", type=int, help="engine trace: seeds concatenated up to this many spans "
                        "(default: the one-engine hour)")
    parser.add_argument("--file", type=Path, help="benchmark this OTLP JSON lines file instead")
    parser.add_argument("--baseline-spans", type=int, default=100_000,
                        help="spans of the prefix the baseline runs on (0: the whole file)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of ingest and Arrow alone (and --before), "
                        "alternating; each round's ratio is taken within the round")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/infertrace-bench-ingest"))
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--before", type=Path, help="another checkout (e.g. `git archive` of the previous commit): "
                        "its ingest runs on the whole file too, in every round")
    parser.add_argument("--arrow-blocks", action="store_true", help="also Arrow's reader alone on ingest's blocks")
    parser.add_argument("--skip-baselines", action="store_true", help="leave out the record and pandas rows")
    parser.add_argument("--duckdb-parse", action="store_true", help="also ingest with DuckDB's json_transform "
                        "in place of Arrow's reader (a measurement: it coerces what Arrow refuses)")
    parser.add_argument("--stages", action="store_true", help="also ingest's steps (reading lines, parse, pivot, "
                        "write) one after another on each block, with each step's CPU time")
    parser.add_argument("--shapes", action="store_true", help="also ingest of the same spans as gzip, zstd and the "
                        "Collector file exporter's length-prefixed protobuf and zstd-compressed JSON messages")
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES.values()), default=[],
                        help="with --shapes: only the shapes of these file suffixes (repeatable)")
    parser.add_argument("--parsers", type=int, metavar="BLOCKS", help="compare JSON readers on the first BLOCKS "
                        "blocks instead (in this process, --rounds rounds); nothing is ingested")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.file is not None:
        full = args.file
    elif args.trace == "fleet":
        full = args.workdir / "fleet-four-models-1h.jsonl"
    else:
        full = args.workdir / (f"azure-{args.spans}.jsonl" if args.spans else "azure-one-engine-1h.jsonl")
    if not full.exists():
        t = time.perf_counter()
        n = generate(full, args.spans) if args.trace == "engine" and args.spans else \
            simulate_hour(full, args.trace == "fleet")
        print(f"generated {full} ({n} spans, {full.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.0f} s",
              file=sys.stderr)
    if args.parsers:
        compare_parsers(full, args.parsers, args.rounds, args.workdir)
        return
    longest = longest_line(full)
    part = full
    if args.baseline_spans:
        part = args.workdir / f"{full.stem}-first-{args.baseline_spans}.jsonl"
        prefix(full, part, args.baseline_spans)
    store = args.workdir / "store"
    on = f"first {args.baseline_spans} spans" if args.baseline_spans else "whole file, again"
    load_at_start = os.getloadavg()
    results: dict[str, dict[str, float]] = {}
    rounds: list[dict[str, dict[str, float]]] = []
    shapes = write_shapes(full, args.shape) if args.shapes else {}
    contenders = [("columnar", ROOT, full), ("read_json", ROOT, full), ("read_json_inferred", ROOT, full)] \
        + ([("arrow-blocks", ROOT, full)] if args.arrow_blocks else []) \
        + ([("duckdb-parse", ROOT, full)] if args.duckdb_parse else []) \
        + ([("stages", ROOT, full)] if args.stages else []) \
        + ([("columnar", args.before, full)] if args.before else []) \
        + [("columnar", tree, path) for path in shapes.values() for tree in (ROOT, args.before) if tree]
    named = {path: f"ingest, {shape} ({path.stat().st_size / 1e6:.0f} MB)" for shape, path in shapes.items()}
    for i in range(args.rounds):
        this: dict[str, dict[str, float]] = {}
        for kind, tree, path in contenders[i % len(contenders):] + contenders[:i % len(contenders)]:  # rotated
            name = ((named.get(path) or NAMES.get(kind) or "ingest") if tree == ROOT else
                    f"{named.get(path) or 'ingest'}, {tree}")
            this[name] = results[f"{name}, round {i + 1}"] = run(kind, path, store, tree, longest)
            print(f"round {i + 1}: {name}: {this[name]['seconds']:.1f} s, {this[name]['cpu_seconds']:.1f} CPU s, "
                  f"{this[name]['peak_rss_mb']:.0f} MB, load {this[name]['load_average']:.1f}", file=sys.stderr)
        rounds.append(this)
    if not args.skip_baselines:
        results[f"ingest, {on}"] = run("columnar", part, store)
        results[f"record, {on}"] = run("record", part, store)
        results[f"pandas json_normalize, {on}"] = run("pandas", part, store)
    load = os.getloadavg()
    first = results[next(iter(results))]
    print(f"file: {full.name}, {full.stat().st_size / 1e6:.0f} MB, {first['spans']} spans "
          f"({full.stat().st_size / first['spans']:.0f} bytes/span); load average {load_at_start[0]:.1f} at the start, "
          f"{load[0]:.1f} at the end, on {os.cpu_count()} cores")
    print("| run | spans | seconds | spans/s | MB/s | CPU s | peak RSS MB | load |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['spans']} | {r['seconds']:.1f} | {r['spans_per_s']:,.0f} | {r['mb_per_s']:.1f} | "
              f"{r['cpu_seconds']:.1f} | {r['peak_rss_mb']:.0f} | {r['load_average']:.1f} |")
    print(f"\nMedians over {args.rounds} rounds (ratio: Arrow's reader alone's time ÷ this one's, i.e. throughput "
          "relative to it, taken within each round):")
    print("| contender | wall s | CPU s | spans/s | peak RSS MB (max) | ratio to read_json, wall | ratio, CPU "
          "| ratio to read_json with the inferred schema, CPU |")
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[str, dict[str, float]] = {}
    for name in rounds[0]:
        runs = [this[name] for this in rounds]
        wall = [this[ARROW]["seconds"] / this[name]["seconds"] for this in rounds]
        cpu = [this[ARROW]["cpu_seconds"] / this[name]["cpu_seconds"] for this in rounds]
        inferred = [this[INFERRED]["cpu_seconds"] / this[name]["cpu_seconds"] for this in rounds]
        summary[name] = {"seconds": statistics.median(r["seconds"] for r in runs),
                         "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
                         "spans_per_s": statistics.median(r["spans_per_s"] for r in runs),
                         "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                         "ratio_wall": statistics.median(wall), "ratio_cpu": statistics.median(cpu),
                         "ratio_cpu_inferred": statistics.median(inferred)}
        m = summary[name]
        print(f"| {name} | {m['seconds']:.1f} | {m['cpu_seconds']:.1f} | {m['spans_per_s']:,.0f} | "
              f"{m['peak_rss_mb']:.0f} | {m['ratio_wall']:.2f}× ({', '.join(f'{x:.2f}' for x in wall)}) | "
              f"{m['ratio_cpu']:.2f}× ({', '.join(f'{x:.2f}' for x in cpu)}) | "
              f"{m['ratio_cpu_inferred']:.2f}× ({', '.join(f'{x:.2f}' for x in inferred)}) |")
    if args.stages:
        print_stages(rounds)
    if not args.skip_baselines:
        ratio = results[f"ingest, {on}"]["spans_per_s"] / results[f"pandas json_normalize, {on}"]["spans_per_s"]
        print(f"ratio ingest / pandas (same input, {on}): {ratio:.1f}×")
    if args.json:
        args.json.write_text(json.dumps({"file": str(full), "load_average": [load_at_start, load], "results": results,
                                         "medians": summary}, indent=2))


if __name__ == "__main__":
    main()
