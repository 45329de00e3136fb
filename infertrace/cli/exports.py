"""`infertrace export` and `infertrace serve-metrics`: a store's traces and derived metrics for other tools
(ui.perfetto.dev, an OpenTelemetry backend, Prometheus and Grafana)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from infertrace.cli.console import check_choice, err, fail
from infertrace.cli.conventions import parse_analysis_window, parse_when

EXPORT_FORMATS = ("perfetto", "otlp")


def export(
    store: Annotated[Path, typer.Option(help="Store directory")],
    fmt: Annotated[str | None, typer.Option("--format", help="perfetto (a Perfetto trace of the engines: steps, "
                                                             "requests, stalls as flows) or otlp (the spans as OTLP "
                                                             "JSON lines)")] = None,
    out: Annotated[Path | None, typer.Option(help="File to write (otlp: .gz for gzip, .zst for zstd)")] = None,
    to: Annotated[str | None, typer.Option(
        "--to", help="Instead of a file: ClickHouse's otel_traces, written as the Collector's exporter writes it "
                     "(clickhouse://USER@HOST:8123/DB, password from $INFERTRACE_CLICKHOUSE_PASSWORD or the file "
                     "$INFERTRACE_CLICKHOUSE_PASSWORD_FILE; chdb://PATH)")] = None,
    since: Annotated[str | None, typer.Option(help="Window start: ISO 8601 (UTC), epoch s/ns, or back from now: "
                                                   "-15m, 2h")] = None,
    until: Annotated[str | None, typer.Option(help="Window end (exclusive), same forms")] = None,
    engine: Annotated[list[str] | None, typer.Option(
        help="perfetto: only this engine instance (repeatable); default: all")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    analysis_window: Annotated[str | None, typer.Option(
        help="Export only the segments holding the store's last DURATION of spans, e.g. 6h, with the analyses "
             "`collect --analysis-window` materialised for them (docs/results.md)")] = None,
) -> None:
    """Export a store's traces for other tools. `perfetto`: one process per engine with its steps, load counters
    and request lanes (queue, prefill chunks, decode), each ITL stall as flows from the culprit prefill chunk to
    its victims; open it in ui.perfetto.dev. `otlp`: every stored span as OTLP JSON lines, which `infertrace
    ingest` and the OpenTelemetry Collector read. `--to clickhouse://…`: every stored span as a row of the
    Collector's ClickHouse exporter (`otel_traces`, created when missing), for `--store clickhouse://…`.

    Example:
      infertrace export --store traces/ --format perfetto --since -10m --out incident.pftrace
      infertrace export --store traces/ --format perfetto --engine llama-3-8b-0 --out llama.pftrace
      infertrace export --store traces/ --format otlp --out spans.jsonl.gz
      infertrace export --store traces/ --format perfetto --analysis-window 1h --out last-hour.pftrace
      INFERTRACE_CLICKHOUSE_PASSWORD_FILE=~/.ch infertrace export --store traces/ --to clickhouse://ops@ch1:8123/otel
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from infertrace.results.relations import open_reader

    try:
        window_s = parse_analysis_window(analysis_window, "--analysis-window")
    except ValueError as e:
        raise fail(str(e)) from None
    if to is not None:
        if fmt is not None or out is not None or since is not None or until is not None or engine or window_s:
            raise fail("--to writes every span of the store to ClickHouse: give no --format, --out, --since, "
                       "--until, --engine or --analysis-window with it")
        _export_to_clickhouse(store, to)
        return
    if fmt is None or out is None:
        raise fail("give --format and --out (a file), or --to clickhouse://… (ClickHouse's otel_traces)")
    check_choice("--format", fmt, EXPORT_FORMATS)
    try:
        since_ns = parse_when(since) if since is not None else None
        until_ns = parse_when(until) if until is not None else None
    except ValueError as e:
        raise fail(str(e)) from None
    if engine and fmt != "perfetto":
        raise fail("--engine selects engines of a perfetto export; an otlp export writes every span in the window")
    columns = (TextColumn(f"exporting {fmt}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    started = time.perf_counter()
    try:
        with open_reader(store, window_s=window_s) as opened:
            if not opened.segments:
                raise fail(f"--store {store}: the store holds no spans (ingest traces first)")
            if window_s is not None:
                from infertrace.store.store import window_phrase

                covered = (f" (an analysis window: {window_phrase(window_s)}; {opened.segments_left_out()} older "
                           "segments left out)")
            else:
                covered = ""
            known = {r[0] for r in opened.sql("SELECT DISTINCT instance FROM steps UNION "
                                              "SELECT DISTINCT instance FROM request_legs").fetchall()}
            for name in engine or ():
                if name not in known:
                    from infertrace.cli.console import did_you_mean

                    raise fail(f"--engine {name!r}: no engine instance of that name in the store"
                               f"{did_you_mean(name, known)}")
            with Progress(*columns, console=err, transient=True, disable=not progress) as bar:
                task = bar.add_task(fmt, total=None)
                if fmt == "perfetto":
                    from infertrace.export.perfetto import write_perfetto
                    from infertrace.results import result
                    from infertrace.store.clickhouse.connection import is_clickhouse_url

                    # a store directory's materialised ITL analysis (the window's, with one), else computed here
                    itl = None if is_clickhouse_url(str(store)) else result(opened, "itl")
                    summary = write_perfetto(opened, out, since_ns, until_ns, engine or None, itl=itl,
                                             on_progress=lambda done: bar.update(task, completed=done))
                    said = summary.sentence()
                else:
                    from infertrace.export.otlp import write_otlp

                    spans = write_otlp(opened, out, since_ns, until_ns, on_progress=lambda n: bar.advance(task, n))
                    said = f"{spans} spans"
    except FileNotFoundError as e:
        raise fail(f"--store {store}: {e}") from None
    except OSError as e:
        raise fail(f"--out {out}: {e}") from None
    err.print(f"Wrote {out} in {time.perf_counter() - started:.1f} s: {said}{covered}", markup=False,
              highlight=False, soft_wrap=True)


def _export_to_clickhouse(store: Path, to: str) -> None:
    from infertrace.store.clickhouse.connection import ClickHouseError, is_clickhouse_url
    from infertrace.store.clickhouse.store import export_rows
    from infertrace.store.store import Store

    if not is_clickhouse_url(to):
        raise fail(f"--to {to!r}: expected clickhouse://USER@HOST:PORT/DB, clickhouses://… or chdb://PATH")
    started = time.perf_counter()
    try:
        with Store.open(store) as opened, err.status(f"Writing spans to {to} …"):
            if not opened.segments:
                raise fail(f"--store {store}: the store holds no spans (ingest traces first)")
            written = export_rows(opened, to)
    except FileNotFoundError as e:
        raise fail(f"--store {store}: {e}") from None
    except (ClickHouseError, ValueError) as e:
        raise fail(f"--to {to}: {e}") from None
    err.print(f"Wrote {written} spans to {to} in {time.perf_counter() - started:.1f} s", markup=False,
              highlight=False)


def serve_metrics(
    store: Annotated[Path, typer.Option(help="Store directory")],
    listen: Annotated[str, typer.Option(help="HOST:PORT to serve /metrics on (port 0: any free port)")] = (
        "127.0.0.1:9464"),
    analysis_window: Annotated[str | None, typer.Option(
        help="Analyse only the segments holding the store's last DURATION of spans, e.g. 6h (docs/results.md)")] = None,
) -> None:
    """Serve the store's derived metrics for Prometheus at /metrics: TTFT, ITL, E2E and phase histograms,
    token, prefix-cache, preemption and outcome counters under vLLM's names, ITL stalls by culprit tenant and
    cache hit rates by tenant (docs/export.md). Each scrape sees the segments written so far.

    Example:
      infertrace serve-metrics --store traces/ --listen 127.0.0.1:9464
    """
    from infertrace.export.metrics import serve
    from infertrace.store import not_a_store
    from infertrace.store.collector import parse_listen

    if not store.is_dir():
        raise fail(f"--store {store}: {not_a_store(store)}")
    try:
        window_s = parse_analysis_window(analysis_window, "--analysis-window")
    except ValueError as e:
        raise fail(str(e)) from None
    try:
        host, port = parse_listen(listen)
        server, thread = serve(store, host, port, window_s)
    except (OSError, ValueError) as e:
        raise fail(f"--listen {listen}: {e}") from None
    bound_host, bound_port = server.server_address[:2]
    print(f"infertrace serve-metrics: http://{bound_host}:{bound_port}/metrics on store {store}", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
