"""`infertrace ingest` and `infertrace collect`: traces into a store, from files or over OTLP."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infertrace.cli.console import err, fail
from infertrace.cli.derived import materialize_store, start_helpers


def ingest(
    paths: Annotated[list[str], typer.Argument(help="OTLP JSON lines files (.jsonl, .jsonl.gz), directories, globs")],
    store: Annotated[Path, typer.Option(help="Store directory (created if missing)")],
    strict: Annotated[bool, typer.Option(help="Exit 1 if any line or span was skipped")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    materialize: Annotated[bool, typer.Option(
        help="Then compute the new snapshot's analyses once for the dashboard and report (docs/results.md)")] = True,
) -> None:
    """Ingest OTLP JSON lines (as the OpenTelemetry Collector's file exporter writes them) into a store.
    Re-ingesting the same data adds nothing; bad lines and spans are kept in the store's quarantine.

    Example:
      infertrace ingest --store traces/ otel-export/*.jsonl.gz
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from infertrace.store.ingest import expand_paths, ingest_paths

    try:
        files = expand_paths(list(paths))
        total = sum(f.stat().st_size for f in files)
        if progress:
            columns = (TextColumn("ingesting"), BarColumn(), DownloadColumn(), TimeElapsedColumn())
            with Progress(*columns, console=err, transient=True) as bar:
                task = bar.add_task("ingest", total=total)
                summary = ingest_paths(store, list(files), on_progress=lambda n: bar.advance(task, n))
        else:
            summary = ingest_paths(store, list(files))
    except OSError as e:
        raise fail(str(e)) from None
    err.print(summary.paragraph())
    if materialize:
        materialize_store(store, progress)
    if strict and summary.skipped:
        raise typer.Exit(1)


def collect(
    store: Annotated[Path, typer.Option(help="Store directory (created if missing)")],
    listen: Annotated[str, typer.Option(help="HOST:PORT to listen on (port 0: any free port)")] = "127.0.0.1:4318",
    token: Annotated[str | None, typer.Option(
        envvar="INFERTRACE_COLLECT_TOKEN", help="Require `Authorization: Bearer TOKEN` (401 without it)")] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body, after decompression (413 above)")] = (
        32 * 1024 * 1024),
    queue_size: Annotated[int, typer.Option(help="Requests accepted at once; more get 503 + Retry-After")] = 16,
    metrics: Annotated[str | None, typer.Option(
        help="Also serve the derived metrics for Prometheus at http://HOST:PORT/metrics (serve-metrics)")] = None,
    materialize: Annotated[bool, typer.Option(
        help="Compute each new snapshot's analyses once its segments settle (docs/results.md)")] = True,
) -> None:
    """Receive OTLP/HTTP traces (POST /v1/traces, protobuf or JSON, gzip) into a store. A request is answered
    200 only after its spans are durably stored.

    Example:
      infertrace collect --store traces/ --listen 127.0.0.1:4318 --metrics 127.0.0.1:9464
    """
    from infertrace.store.collector import Collector, parse_listen

    try:
        host, port = parse_listen(listen)
        collector = Collector(store, host, port, token=token, max_body_bytes=max_body_bytes, queue_size=queue_size)
    except (OSError, ValueError) as e:
        raise fail(str(e)) from None
    print(f"infertrace collect: listening on http://{collector.address}/v1/traces, store {store}", flush=True)
    helpers = start_helpers(store, metrics, materialize)
    try:
        collector.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        collector.shutdown()
        helpers.stop()
