"""The report and the ITL analysis on the same spans in a local store and in ClickHouse's `otel_traces` (chdb,
in this process, rows as the Collector's exporter writes them), side by side in one run, at growing sizes.

    .venv/bin/python benchmarks/bench_clickhouse.py --hours 1 --hours 12 [--window 10] [--work DIR] [--seed 0]

For each size, the four-model benchmark fleet (examples/fleets/four_models.toml) is simulated for that many
hours (`infertrace simulate --fleet … --duration`, once; the trace is kept in DIR), ingested into a local
store, and the store written into chdb (`export --to`); with `--hour-trace FILE` that hour is ingested instead
and longer runs are tiled from it (`tile`: shifted copies with their own ids). Then, alternately on each
backend, each in a fresh process (opening the store included): `itl_distributions` (each engine's ITL
distribution; in ClickHouse it is computed there and only its rows come back, no span is read back),
`analyze_itl` and `report` (the whole report document, nothing materialised; on ClickHouse both read the
spans back, into compressed Parquet files of the store's private directory, and run in DuckDB, but for the
pushed-down aggregations). Wall and CPU time (the child process,
all threads), its peak RSS, the load average, and ClickHouse's compressed bytes per span are printed. The
machine is shared: quote the load average with any figure. `report` runs also give CPU and peak RSS per
analysis the report runs; with BENCH_CLICKHOUSE_PROGRESS=FILE each timed process appends its stage, CPU and RSS
to FILE every 30 s (where a run stopped before its end was); BENCH_CLICKHOUSE_MAX_SPILL=16GB caps what DuckDB
spills to disk (at 10M spans the local report spilled 21.7 GB under a 5 GB memory limit).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from infertrace.analyzers.itl import analyze_itl, itl_distributions
from infertrace.report import ReportOptions, build_report
from infertrace.store.clickhouse.connection import connect
from infertrace.store.clickhouse.store import ClickHouseStore, export_rows
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "examples" / "fleets" / "four_models.toml"


def timed(what: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    what()
    return time.perf_counter() - wall, time.process_time() - cpu


def prepare(work: Path, hours: float, seed: int, hour_trace: Path | None = None) -> tuple[Path, str, int, float,
                                                                                         float]:
    """(local store, chdb URL, spans, ingest s, export s) of `hours` of the fleet, built once per size. With
    `hour_trace` (one simulated hour of the fleet, OTLP JSON lines), that hour is ingested and longer runs are
    tiled from it (`tile`) instead of simulated."""
    name = f"fleet-{hours:g}h-seed{seed}" + ("-tiled" if hour_trace is not None and hours != 1 else "")
    trace, store = work / f"{name}.jsonl", work / f"{name}-store"
    url = f"chdb://{work / 'chdb'}?database=" + name.replace("-", "_").replace(".", "_")
    if hour_trace is None and not trace.is_file():
        partial = trace.with_suffix(".partial.jsonl")
        subprocess.run([sys.executable, "-m", "infertrace", "simulate", "--fleet", str(FLEET), "--duration",
                        str(hours * 3600), "--seed", str(seed), "--out", str(partial)], check=True)
        partial.rename(trace)
    ingest_s = export_s = 0.0
    if not (store / "READY").is_file():
        shutil.rmtree(store, ignore_errors=True)
        if hour_trace is None:
            ingest_s, _ = timed(lambda: ingest_paths(store, [trace]))
        elif hours == 1:
            ingest_s, _ = timed(lambda: ingest_paths(store, [hour_trace]))
        else:
            if hours != int(hours):
                raise ValueError(f"--hours {hours:g}: tiled runs are whole hours")
            one = prepare(work, 1, seed, hour_trace)[0]
            ingest_s, _ = timed(lambda: tile(one, int(hours), store))
        (store / "READY").write_text("", encoding="utf-8")
    if not (store / "CHDB_READY").is_file():
        connection = connect(url)
        connection.command(f"DROP TABLE IF EXISTS {connection.target.table}")
        connection.close()
        if hour_trace is None or hours == 1:
            with Store.open(store) as opened:
                export_s, _ = timed(lambda: export_rows(opened, url))
        else:
            hour_url = prepare(work, 1, seed, hour_trace)[1]
            export_s, _ = timed(lambda: tile_in_clickhouse(hour_url, int(hours), url))
        (store / "CHDB_READY").write_text("", encoding="utf-8")
    with Store.open(store) as opened:
        spans = opened.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    return store, url, spans, ingest_s, export_s


# Columns holding a request id (scalar or list): suffixed per copy, so that copies are distinct requests.
_REQUEST_IDS = ("attr.gen_ai.request.id", "attr.rid")
_REQUEST_ID_LISTS = ("attr.infertrace.step.prefill.request_ids", "attr.infertrace.step.decode.request_ids",
                     "attr.infertrace.step.preempted.request_ids")


def tile(hour_store: Path, copies: int, out: Path) -> None:
    """A `copies`-hour store from a one-hour store: copy k is the hour's spans shifted by k hours, with trace and
    span ids prefixed by k (two hex digits in place of the first two), request ids suffixed `-hK` and engine step
    indexes moved past the previous copies' (so each copy's requests and steps are distinct ones). Streams in
    batches of 200k spans; the result is an ordinary store (segments), written with `write_segments`."""
    from infertrace.store.segments import write_segments

    ids = ", ".join(f'"{c}" || $suffix AS "{c}"' for c in _REQUEST_IDS)
    lists = ", ".join(f'list_transform("{c}", lambda r: r || $suffix) AS "{c}"' for c in _REQUEST_ID_LISTS)
    sql = f"""SELECT * REPLACE (
        $prefix || trace_id[3:] AS trace_id, $prefix || span_id[3:] AS span_id,
        CASE WHEN parent_span_id IS NULL OR parent_span_id = '' THEN parent_span_id
             ELSE $prefix || parent_span_id[3:] END AS parent_span_id,
        start_ns + $shift AS start_ns, end_ns + $shift AS end_ns,
        list_transform(events, lambda e: struct_pack(time_ns := e.time_ns + $shift, name := e.name,
                                                     attributes := e.attributes)) AS events,
        "attr.infertrace.step.index" + $steps AS "attr.infertrace.step.index", {ids}, {lists})
    FROM spans"""
    with Store.open(hour_store) as source:
        schema = source.sql("SELECT * FROM spans LIMIT 0").to_arrow_table().schema
        for k in range(copies):
            params = {"prefix": f"{k:02x}", "suffix": f"-h{k}", "shift": k * 3600 * 10**9, "steps": k * 10**9}
            for batch in source.sql(sql, params=params).to_arrow_reader(200_000):
                write_segments(out, pa.Table.from_batches([batch]).cast(schema))
            print(f"tiled hour {k + 1}/{copies}", flush=True)


def tile_in_clickhouse(hour_url: str, copies: int, url: str) -> None:
    """`tile` inside ClickHouse: `otel_traces` at `url` filled from the one-hour table at `hour_url` with the same
    copies, rewritten as `tile` rewrites them but in the exporter's columns (ids in the text maps, the lists as JSON
    text), by INSERT … SELECT: the same rows `export --to` would write for the tiled store, without moving them
    through this process. (On a sample incident tiled three times both ways, the spans, `requests` and `tokens`
    read back from ClickHouse equal the local tiled store's row for row.)"""
    from infertrace.store.clickhouse.store import create_otel_traces

    source = connect(hour_url)
    source_table = source.target.table
    source.close()
    connection = connect(url)
    try:
        create_otel_traces(connection)
        scalars = "['gen_ai.request.id', 'rid']"
        lists = "['infertrace.step.prefill.request_ids', 'infertrace.step.decode.request_ids', " \
                "'infertrace.step.preempted.request_ids']"
        for k in range(copies):
            connection.command(f"""INSERT INTO {connection.target.table} SELECT * REPLACE (
                fromUnixTimestamp64Nano(toUnixTimestamp64Nano(Timestamp) + {k * 3600 * 10**9}) AS Timestamp,
                concat('{k:02x}', substring(TraceId, 3)) AS TraceId,
                concat('{k:02x}', substring(SpanId, 3)) AS SpanId,
                if(ParentSpanId = '', '', concat('{k:02x}', substring(ParentSpanId, 3))) AS ParentSpanId,
                mapApply((key, v) -> (key, multiIf(
                    has({scalars}, key), concat(v, '-h{k}'),
                    has({lists}, key), replaceRegexpAll(v, '"([^"]*)"', '"\\\\1-h{k}"'),
                    key = 'infertrace.step.index', toString(toInt64(v) + {k * 10**9}),
                    v)), SpanAttributes) AS SpanAttributes,
                arrayMap(t -> fromUnixTimestamp64Nano(toUnixTimestamp64Nano(t) + {k * 3600 * 10**9}),
                         `Events.Timestamp`) AS `Events.Timestamp`)
            FROM {source_table}""")
            print(f"tiled hour {k + 1}/{copies} in ClickHouse", flush=True)
    finally:
        connection.close()


def compressed_bytes_per_span(url: str) -> float:
    connection = connect(url)
    try:
        row = connection.query_arrow(
            "SELECT sum(data_compressed_bytes) AS b, sum(rows) AS n FROM system.parts WHERE active AND database = "
            "{db:String} AND table = 'otel_traces'", {"db": connection.target.database}).to_pylist()[0]
        return row["b"] / max(row["n"], 1)
    finally:
        connection.close()


# The shared machine's budget per process (--max-rss-gb); DuckDB's own limit below it (it spills to disk past it).
MAX_RSS_GB = 8.0
DUCKDB_MEMORY_LIMIT = "5GB"


# A file each timed process appends a line of progress to every 30 s, when this environment variable names one.
PROGRESS_ENV = "BENCH_CLICKHOUSE_PROGRESS"
# DuckDB's max_temp_directory_size in each timed process, when this environment variable gives one (e.g. 16GB).
MAX_TEMP_ENV = "BENCH_CLICKHOUSE_MAX_SPILL"

# Per stage of the timed work (`_staged`): [CPU s, peak RSS MB sampled by `_watch_rss`], in the order run.
_STAGES: dict[str, list[float]] = {}
_stage = ["open"]
_failed_in: list[str] = []  # the stages an exception passed through


def _watch_rss(max_rss_gb: float) -> None:
    """Ends the process (exit 3, a line saying so, with the stages so far) when its RSS passes `max_rss_gb`;
    records each stage's peak RSS as sampled every half second."""
    page = os.sysconf("SC_PAGE_SIZE")
    started = last = time.perf_counter()
    progress = os.environ.get(PROGRESS_ENV)
    while True:
        with open("/proc/self/statm", encoding="ascii") as f:
            rss = int(f.read().split()[1]) * page
        entry = _STAGES.setdefault(_stage[0], [0.0, 0.0])
        entry[1] = max(entry[1], rss / 2**20)
        if progress and time.perf_counter() - last >= 30:  # where a long run is, should it be stopped
            last = time.perf_counter()
            with open(progress, "a", encoding="utf-8") as f:
                f.write(json.dumps({"after_s": round(last - started), "stage": _stage[0], "rss_mb": round(rss / 2**20),
                                    "cpu": round(time.process_time(), 1), "stages": _STAGES}) + "\n")
        if rss > max_rss_gb * 2**30:
            print(json.dumps({"over_rss_gb": max_rss_gb, "after_s": time.perf_counter() - started,
                              "stage": _stage[0], "stages": _STAGES}), flush=True)
            os._exit(3)
        time.sleep(0.5)


def _staged(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, timed as the stage `name` (its CPU added to the stage's; RSS sampled under its name)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        before, cpu = _stage[0], time.process_time()
        _stage[0] = name
        try:
            return function(*args, **kwargs)
        except Exception:
            _failed_in.append(name)  # innermost first
            raise
        finally:
            _STAGES.setdefault(name, [0.0, 0.0])[0] += time.process_time() - cpu
            _stage[0] = before
    return run


def _stage_report() -> None:
    """Each analysis the report runs timed as a stage of its own (the report imports them when it runs them)."""
    import infertrace.analyzers.itl as itl
    import infertrace.analyzers.prefix_cache as prefix_cache
    import infertrace.analyzers.rca as rca
    import infertrace.analyzers.roofline as roofline
    import infertrace.analyzers.ttft as ttft
    import infertrace.report.model as model

    model.slo_summary = _staged("slo", model.slo_summary)
    model.itl_section = _staged("itl_section", model.itl_section)
    for module, name in ((rca, "analyze_incidents"), (itl, "analyze_itl"), (ttft, "analyze_ttft"),
                         (prefix_cache, "analyze_prefix_cache"), (roofline, "analyze_prefill_roofline")):
        setattr(module, name, _staged(name, getattr(module, name)))


def _work(what: str, backend: str, store: Path, url: str, since: int | None, until: int | None,
          duckdb_memory_limit: str = DUCKDB_MEMORY_LIMIT) -> None:
    """One timed piece of work on one backend (in a child process of its own: its peak RSS is its own)."""
    opened = Store.open(store) if backend == "local" else ClickHouseStore.open(url, since, until)
    with opened as s:
        # DuckDB's connection (ClickHouseStore's without reading the spans back: `con` would)
        con = s.duckdb if isinstance(s, ClickHouseStore) else s.con
        con.execute("SET memory_limit = $limit", {"limit": duckdb_memory_limit})
        _stage[0] = what
        con.execute("SET temp_directory = $dir", {"dir": str(store.parent / "duckdb-spill")})  # not the checkout
        if os.environ.get(MAX_TEMP_ENV):  # a cap on the spill (the disk is shared): past it DuckDB fails instead
            con.execute("SET max_temp_directory_size = $size", {"size": os.environ[MAX_TEMP_ENV]})
        if what == "report":
            build_report(s, ReportOptions(since_ns=since, until_ns=until))
        elif what == "analyze_itl":
            analyze_itl(s)
        elif what == "itl_distributions":
            itl_distributions(s)
        else:
            raise ValueError(what)


def child(argv: list[str]) -> None:
    what, backend, store, url, since, until, max_rss_gb, duckdb_memory_limit = argv
    bounds = (int(since) if since != "-" else None, int(until) if until != "-" else None)
    if what == "report":
        _stage_report()
    threading.Thread(target=_watch_rss, args=(float(max_rss_gb),), daemon=True).start()
    try:
        wall, cpu = timed(lambda: _work(what, backend, Path(store), url, *bounds, duckdb_memory_limit))
    except Exception as e:  # the error's first lines and where it happened, as the line of figures
        stages = {name: [round(c, 1), round(mb)] for name, (c, mb) in _STAGES.items()}
        print(json.dumps({"failed": type(e).__name__, "error": str(e).splitlines()[:3],
                          "stage": (_failed_in or [_stage[0]])[0], "cpu": time.process_time(), "stages": stages}),
              flush=True)
        raise
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stages = {name: [round(c, 1), round(mb)] for name, (c, mb) in _STAGES.items()}
    print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": rss, "stages": stages}))


WORK = ("itl_distributions", "analyze_itl", "report")
BACKENDS = ("local", "chdb")


def measure(store: Path, url: str, spans: int, since: int | None = None, until: int | None = None,
            work: tuple[str, ...] = WORK, max_rss_gb: float = MAX_RSS_GB,
            backends: tuple[str, ...] = BACKENDS, duckdb_memory_limit: str = DUCKDB_MEMORY_LIMIT) -> None:
    """Each piece of work on each backend, alternately, each in a fresh process (opening the store included;
    CPU is that process's, all threads). With a window, the local store is opened whole and the report selects
    the window (what `report --since/--until` does); ClickHouse reads the window only."""
    label = "" if since is None else f" {(until - since) / 60e9:g} min window"  # type: ignore[operator]
    for what in work if since is None else ("report",):
        got = {}
        for backend in backends:
            done = subprocess.run([sys.executable, __file__, "--child", what, backend, str(store), url,
                                   "-" if since is None else str(since), "-" if until is None else str(until),
                                   str(max_rss_gb), duckdb_memory_limit],
                                  capture_output=True, text=True)
            lines = done.stdout.strip().splitlines()
            got[backend] = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {
                "failed": done.returncode, "error": done.stderr.strip().splitlines()[-1:]}
        if len(backends) == 1:  # one backend of a run split over processes: its figures alone
            print(f"{spans:>10} {what + label:<26} {backends[0]}: {json.dumps(got[backends[0]])} "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            continue
        lo, ch = got["local"], got["chdb"]
        if "wall" not in lo or "wall" not in ch:
            print(f"{spans:>10} {what + label:<26} not measured: local {lo}, chdb {ch}", flush=True)
            continue
        print(f"{spans:>10} {what + label:<26} {lo['wall']:>12.1f} {lo['cpu']:>11.1f} {lo['rss_mb']:>8.0f} "
              f"{ch['wall']:>11.1f} {ch['cpu']:>10.1f} {ch['rss_mb']:>8.0f} {ch['wall'] / lo['wall']:>10.2f} "
              f"{ch['cpu'] / lo['cpu']:>9.2f} {os.getloadavg()[0]:>5.1f}", flush=True)


def run(hours: list[float], windows: list[float], work: Path, seed: int, whole: bool = True,
        hour_trace: Path | None = None, prepare_only: bool = False, items: tuple[str, ...] = WORK,
        max_rss_gb: float = MAX_RSS_GB, backends: tuple[str, ...] = BACKENDS,
        duckdb_memory_limit: str = DUCKDB_MEMORY_LIMIT) -> None:
    work.mkdir(parents=True, exist_ok=True)
    print(f"{'spans':>10} {'what':<26} {'local wall s':>12} {'local cpu s':>11} {'local MB':>8} {'chdb wall s':>11} "
          f"{'chdb cpu s':>10} {'chdb MB':>8} {'wall ratio':>10} {'cpu ratio':>9} {'load':>5}", flush=True)
    for h in hours:
        store, url, spans, ingest_s, export_s = prepare(work, h, seed, hour_trace)
        if ingest_s or export_s:
            how = "ingest / export --to" if hour_trace is None or h == 1 else "tile / tile in ClickHouse"
            print(f"{spans:>10} {how:<26} {ingest_s:>12.1f} {'':>11} {'':>8} {export_s:>11.1f}  (wall s)", flush=True)
        if prepare_only:
            continue
        if whole:
            measure(store, url, spans, work=items, max_rss_gb=max_rss_gb, backends=backends,
                    duckdb_memory_limit=duckdb_memory_limit)
        with Store.open(store) as opened:
            first = opened.sql("SELECT min(start_ns) FROM spans").fetchall()[0][0]
        for minutes in windows:  # windows from the middle of the run
            since = first + int(h * 3600e9 / 2)
            measure(store, url, spans, since, since + int(minutes * 60e9), max_rss_gb=max_rss_gb,
                    duckdb_memory_limit=duckdb_memory_limit)
        print(f"{spans:>10} compressed bytes/span in otel_traces: {compressed_bytes_per_span(url):.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, action="append", help="simulated hours per size (repeatable)")
    parser.add_argument("--window", type=float, action="append", default=[],
                        help="also a report over a window of this many minutes (repeatable)")
    parser.add_argument("--no-whole", action="store_true", help="only the windowed reports")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-clickhouse"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hour-trace", type=Path, help="one simulated hour of the fleet: ingested, and longer runs "
                        "tiled from it instead of simulated")
    parser.add_argument("--prepare-only", action="store_true", help="build the stores and chdb tables, time nothing")
    parser.add_argument("--work-item", action="append", choices=WORK, help="what to time (repeatable; default all)")
    parser.add_argument("--max-rss-gb", type=float, default=MAX_RSS_GB,
                        help="stop a timed process whose RSS passes this (default %(default)s)")
    parser.add_argument("--backend", action="append", choices=BACKENDS,
                        help="time only this backend (repeatable; default both, side by side)")
    parser.add_argument("--duckdb-memory-limit", default=DUCKDB_MEMORY_LIMIT,
                        help="DuckDB's memory limit in each timed process (default %(default)s; it spills past it)")
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    args = parser.parse_args()
    run(args.hours or [1.0], args.window, args.work, args.seed, whole=not args.no_whole, hour_trace=args.hour_trace,
        prepare_only=args.prepare_only, items=tuple(args.work_item or WORK), max_rss_gb=args.max_rss_gb,
        backends=tuple(args.backend or BACKENDS), duckdb_memory_limit=args.duckdb_memory_limit)


if __name__ == "__main__":
    main()
