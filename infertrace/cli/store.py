"""`infertrace ingest`, `infertrace collect` and `infertrace store …`: traces into a store, from files or over
OTLP, and the store's upkeep (compaction, check, repair)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from infertrace.cli.console import err, fail
from infertrace.cli.conventions import parse_analysis_window
from infertrace.cli.derived import materialize_store, start_helpers

TOKEN_ENV = "INFERTRACE_COLLECT_TOKEN"
# A collector keeping more than this (or everything) without an analysis window is told what its snapshots cost.
LONG_RETENTION_S = 86400.0
RESOURCE_HELP = ("KEY=VALUE: keep only the spans whose resource has this attribute (repeatable: all must match), "
                 "e.g. deployment.environment.name=production for one environment of a collector's output")


def ingest(
    store: Annotated[Path, typer.Option(help="Store directory (created if missing)")],
    paths: Annotated[list[str] | None, typer.Argument(
        help="OTLP JSON lines files (.jsonl, .jsonl.gz, .jsonl.zst; also trace JSON downloaded from Tempo, "
             "Jaeger or Zipkin, pretty-printed or not), directories, globs; - reads standard input (curl … | "
             "infertrace ingest --store DIR -)")] = None,
    strict: Annotated[bool, typer.Option(
        help="Exit 1 if anything was skipped (without it: only if nothing was stored)")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    max_line_bytes: Annotated[int, typer.Option(help="Longest line read; a longer one is quarantined unread")] = (
        32 * 1024 * 1024),
    materialize: Annotated[bool, typer.Option(
        help="Then compute the new snapshot's analyses once for the dashboard and report (docs/results.md)")] = True,
    source: Annotated[str, typer.Option(
        help="What the files are: auto (by their first lines), otlp, client-tokens (a streaming client's token "
             "times, JSON lines: docs/sources.md) or vllm-iteration-log (--enable-logging-iteration-details "
             "lines; the file's name is the engine instance)")] = "auto",
    from_: Annotated[str | None, typer.Option(
        "--from", help="Instead of files: a window of ClickHouse's otel_traces (clickhouse://USER@HOST:8123/DB, "
                       "password from $INFERTRACE_CLICKHOUSE_PASSWORD or the file "
                       "$INFERTRACE_CLICKHOUSE_PASSWORD_FILE; chdb://PATH)")] = None,
    since: Annotated[str | None, typer.Option(
        help="--from: window start (ISO 8601 UTC, epoch s/ns, or back from now: -15m, 2h)")] = None,
    until: Annotated[str | None, typer.Option(help="--from: window end (exclusive), same forms")] = None,
    resource: Annotated[list[str] | None, typer.Option(help=RESOURCE_HELP)] = None,
) -> None:
    """Ingest OTLP JSON lines (as the OpenTelemetry Collector's file exporter writes them) into a store; also a
    streaming client's token times and vLLM's iteration logs, each into a relation of its own (client_tokens,
    iteration_log), which ITL spike attribution reads on engines that export no step spans.
    Trace JSON as other tools print it (pretty, base64 ids, enum names, Tempo's and Jaeger's API responses,
    Jaeger's and Zipkin's own JSON) is read too. Re-ingesting the same data adds nothing; bad lines and spans are
    kept in the store's quarantine, and a truncated file keeps every complete line.

    With --from, pulls the traces overlapping --since/--until out of ClickHouse's otel_traces (with the engine
    steps of those requests' whole lives) into the store: an incident's window for a laptop, a ticket or a
    replay.

    Example: infertrace ingest --store traces/ otel-export/*.jsonl.gz client_tokens.jsonl
             infertrace ingest --store traces/ --source vllm-iteration-log logs/llama-3-8b-0.log
             infertrace ingest --store prod/ --resource deployment.environment.name=production otel-export/
             infertrace ingest --store incident/ --from clickhouse://oncall@ch1:8123/otel --since 2026-12-01T14:00Z \
                 --until 2026-12-01T14:30Z
    """
    from infertrace.store.ingest import expand_paths

    wanted = _resource(resource)
    if from_ is not None:
        if paths:
            raise fail("give files or --from clickhouse://…, not both")
        if wanted:
            raise fail("--resource filters files; with --from, choose the spans in ClickHouse")
        ingest_from_clickhouse(store, from_, since, until)
        if materialize:
            materialize_store(store, progress)
        return
    if since is not None or until is not None:
        raise fail("--since and --until choose a window of --from clickhouse://…; files are ingested whole")
    if not paths:
        raise fail("give files to ingest (or - for standard input), or --from clickhouse://…")
    if max_line_bytes < 1:
        raise fail(f"--max-line-bytes must be positive, got {max_line_bytes}")
    kinds = ("auto", "otlp", "client-tokens", "vllm-iteration-log")
    if source not in kinds:
        raise fail(f"--source must be one of {', '.join(kinds)}, got {source!r}")
    try:
        with _stdin_spooled(list(paths)) as (named, labels):
            files = _expand(named, source, expand_paths)
            _ingest_files(store, files, labels, source, progress, max_line_bytes, wanted, materialize, strict)
    except OSError as e:
        raise fail(str(e)) from None


def _ingest_files(store: Path, files: list[Path], labels: dict[str, str], source: str, progress: bool,
                  max_line_bytes: int, wanted: tuple[tuple[str, str], ...], materialize: bool, strict: bool) -> None:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from infertrace.store.ingest import in_store, ingest_paths
    from infertrace.store.side_inputs import ingest_side_inputs, sniff

    side: dict[str, list[Path]] = {"client-tokens": [], "vllm-iteration-log": []}
    if source != "otlp":
        for f in [f for f in files if not in_store(f, store)]:  # the store's own files: left out by ingest_paths
            kind = source if source != "auto" else sniff(f)
            if kind == "vllm-iteration-log" and str(f) in labels:
                raise fail("vLLM iteration logs are named by their file (the engine instance): give the file, "
                           "not standard input")
            if kind in side:
                side[kind].append(f)
                files.remove(f)
        for kind, what, unit in (("client-tokens", "client token times", "requests"),
                                 ("vllm-iteration-log", "vLLM iteration logs", "iterations")):
            if side[kind]:
                said = ingest_side_inputs(store, side[kind], kind, labels)
                err.print(said.paragraph(what, unit), soft_wrap=True, highlight=False)
        if not files:
            if materialize:
                materialize_store(store, progress)
            return
        total = sum(f.stat().st_size for f in files)
        if progress:
            columns = (TextColumn("ingesting"), BarColumn(), DownloadColumn(), TimeElapsedColumn())
            with Progress(*columns, console=err, transient=True) as bar:
                task = bar.add_task("ingest", total=total)
                summary = ingest_paths(store, list(files), on_progress=lambda n: bar.advance(task, n),
                                       max_line_bytes=max_line_bytes, resource=wanted, labels=labels)
        else:
            summary = ingest_paths(store, list(files), max_line_bytes=max_line_bytes, resource=wanted, labels=labels)
    err.print(summary.paragraph(), soft_wrap=True, highlight=False)
    if materialize:
        materialize_store(store, progress)
    if summary.skipped and (strict or not summary.spans_read):
        if not summary.spans_read:
            err.print("Nothing was stored: everything given was rejected (exit 1; the quarantine keeps it).",
                      soft_wrap=True, highlight=False)
        raise typer.Exit(1)


def _resource(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """`--resource KEY=VALUE` options as (key, value) pairs; a usage error names a malformed one."""
    wanted = []
    for item in items or []:
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise fail(f"--resource {item!r}: expected KEY=VALUE, e.g. deployment.environment.name=production")
        wanted.append((key.strip(), value))
    return tuple(wanted)


def ingest_from_clickhouse(store: Path, url: str, since: str | None, until: str | None) -> None:
    from infertrace.cli.conventions import parse_window
    from infertrace.store.clickhouse.connection import ClickHouseError, is_clickhouse_url
    from infertrace.store.clickhouse.store import ingest_window

    if not is_clickhouse_url(url):
        raise fail(f"--from {url!r}: expected clickhouse://USER@HOST:PORT/DB, clickhouses://… or chdb://PATH")
    try:
        since_ns, until_ns = parse_window(since, until)
    except ValueError as e:
        raise fail(str(e)) from None
    try:
        with err.status(f"Reading spans from {url} …"):
            read, new = ingest_window(store, url, since_ns, until_ns)
    except (ClickHouseError, ValueError) as e:
        raise fail(f"--from {url}: {e}") from None
    except OSError as e:
        raise fail(f"--store {store}: {e}") from None
    if read == 0:
        err.print(f"No spans in {url} for that window: nothing ingested", highlight=False)
    else:
        err.print(f"Read {read} spans from {url}: {new} new to {store}, {read - new} already there", highlight=False)


@contextmanager
def _stdin_spooled(paths: list[str]) -> Iterator[tuple[list[str], dict[str, str]]]:
    """`paths` with `-` (standard input) replaced by a temporary copy of what arrives there, and the copy's label
    (`<stdin>`, as rejections name it). Copied first because what a file is (compressed, length-prefixed, pretty
    JSON, a side input) is told by its first bytes and size, and a pipe can be read only once."""
    if "-" not in paths:
        yield paths, {}
        return
    if paths.count("-") > 1:
        raise fail("- (standard input) can be given once")
    if sys.stdin is None or sys.stdin.isatty():
        raise fail("- reads traces from standard input, which is a terminal here: pipe them in, e.g. "
                   "curl -s $TEMPO/api/v2/traces/<id> | infertrace ingest --store DIR -")
    with tempfile.TemporaryDirectory(prefix="infertrace-stdin-") as directory:
        copy = Path(directory) / "stdin"
        with open(copy, "wb") as out:
            shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
        yield [str(copy) if p == "-" else p for p in paths], {str(copy): "<stdin>"}


def _expand(paths: list[str], source: str, expand_paths: Callable[[list[str | Path]], list[Path]]) -> list[Path]:
    """Files to ingest: OTLP and token files as `expand_paths` finds them; with --source vllm-iteration-log a
    directory gives its `*.log`, `*.log.gz` and `*.log.zst` files."""
    if source != "vllm-iteration-log":
        return expand_paths(list(paths))
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out += sorted(p for p in path.rglob("*")
                          if p.is_file() and p.name.endswith((".log", ".log.gz", ".log.zst")))
        else:
            out += expand_paths([raw])
    return out


def _token(token: str | None, token_file: Path | None) -> str | None:
    given = [name for name, value in (("--token", token), ("--token-file", token_file),
                                      (TOKEN_ENV, os.environ.get(TOKEN_ENV))) if value]
    if len(given) > 1:
        raise fail(f"give the token one way, not {' and '.join(given)}")
    if token_file is not None:
        try:
            text = token_file.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise fail(f"--token-file {token_file}: {e.strerror or e}") from None
        if not text:
            raise fail(f"--token-file {token_file}: the file is empty")
        return text
    if token:
        err.print("[yellow]warning:[/yellow] --token is visible to every user of this host in `ps`; prefer "
                  f"--token-file or the {TOKEN_ENV} environment variable", soft_wrap=True, highlight=False)
        return token
    return os.environ.get(TOKEN_ENV) or None


def collect(
    store: Annotated[Path, typer.Option(help="Store directory (created if missing)")],
    listen: Annotated[str, typer.Option(help="OTLP/HTTP HOST:PORT (port 0: any free port)")] = "127.0.0.1:4318",
    grpc: Annotated[str | None, typer.Option(help="Also OTLP/gRPC on HOST:PORT, e.g. 127.0.0.1:4317")] = None,
    token: Annotated[str | None, typer.Option(
        help=f"Require `Authorization: Bearer TOKEN` (visible in ps: prefer --token-file or {TOKEN_ENV})")] = None,
    token_file: Annotated[Path | None, typer.Option(help="Read the bearer token from this file")] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="Serve TLS with this certificate (PEM)")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="… and this private key (PEM)")] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body, after decompression (413 above)")] = (
        32 * 1024 * 1024),
    queue_size: Annotated[int, typer.Option(
        help="Requests waiting for a writer or being written; more get 503 + Retry-After")] = 64,
    writers: Annotated[int, typer.Option(help="Requests decoded and written at once")] = 4,
    memory_limit_mib: Annotated[int, typer.Option(
        help="Memory for decoding admitted requests; above it 503 + Retry-After")] = 1024,
    header_timeout: Annotated[float, typer.Option(help="Seconds to send complete request headers")] = 10.0,
    body_timeout: Annotated[float, typer.Option(help="Seconds to send a request body (408 after)")] = 30.0,
    idle_timeout: Annotated[int, typer.Option(help="Seconds an idle kept-alive connection stays open")] = 30,
    compact_interval: Annotated[float, typer.Option(help="Seconds between background compactions (0: none)")] = 30.0,
    compact_min_age: Annotated[float, typer.Option(help="Only segments older than this many seconds merge")] = 10.0,
    grace: Annotated[float, typer.Option(help="Seconds merged segments stay for readers' snapshots")] = 300.0,
    retain: Annotated[str | None, typer.Option(help="Drop partitions older than this, e.g. 7d")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error: one line per request at info")] = (
        "info"),
    metrics: Annotated[str | None, typer.Option(
        help="Also serve the derived metrics for Prometheus at http://HOST:PORT/metrics (serve-metrics)")] = None,
    materialize: Annotated[bool, typer.Option(
        help="Compute each new snapshot's analyses once its segments settle, or after 60 s of steady "
             "arrivals (docs/results.md)")] = True,
    analysis_window: Annotated[str | None, typer.Option(
        help="Analyse only the segments holding the store's last DURATION of spans, e.g. 6h (--materialize, "
             "--metrics): each snapshot then costs what the window holds, not what --retain keeps")] = None,
    resource: Annotated[list[str] | None, typer.Option(help=RESOURCE_HELP)] = None,
) -> None:
    """Receive OTLP traces over HTTP (POST /v1/traces: protobuf or JSON; gzip, deflate, zstd), Zipkin's v2 JSON (POST
    /api/v2/spans) and optionally OTLP over gRPC into a store. A request is answered with success only after its
    spans are durably stored; a busy, over-memory or full-disk collector answers with a retryable code and a delay.
    Logs one line per request.

    Example: infertrace collect --store traces/ --grpc 127.0.0.1:4317 --token-file /etc/infertrace/token
    """
    from infertrace.store.collector import Collector, is_loopback, parse_listen
    from infertrace.store.compaction import parse_duration

    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise fail(f"--log-level must be debug, info, warning or error, got {log_level!r}")
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("infertrace.collect").setLevel(level)
    if (tls_cert is None) != (tls_key is None):
        raise fail("--tls-cert and --tls-key go together")
    secret = _token(token, token_file)
    wanted = _resource(resource)
    try:
        host, port = parse_listen(listen)
        grpc_at = parse_listen(grpc, "--grpc", 4317) if grpc else None
        retain_s = parse_duration(retain) if retain else None
        window_s = parse_analysis_window(analysis_window, "--analysis-window")
        tls = (str(tls_cert), str(tls_key)) if tls_cert and tls_key else None
        collector = Collector(store, host, port, token=secret, max_body_bytes=max_body_bytes, queue_size=queue_size,
                              writers=writers,
                              memory_limit_bytes=memory_limit_mib << 20, grpc=grpc_at, tls=tls,
                              header_timeout=header_timeout, body_timeout=body_timeout, idle_timeout=idle_timeout,
                              compact_interval_s=compact_interval or None, compact_min_age_s=compact_min_age,
                              grace_s=grace, retain_s=retain_s, resource=wanted)
    except (OSError, ValueError) as e:
        raise fail(str(e)) from None
    exposed = [h for h in (host, grpc_at[0] if grpc_at else "127.0.0.1") if not is_loopback(h)]
    if exposed and secret is None:
        err.print(f"[bold red]WARNING: listening on {', '.join(exposed)} without a token: anyone who can reach "
                  f"this port can write spans into {store}. Give --token-file (or {TOKEN_ENV}) and "
                  f"--tls-cert/--tls-key, or listen on 127.0.0.1.[/bold red]", soft_wrap=True, highlight=False)
    elif exposed and tls is None:
        err.print("[yellow]warning:[/yellow] the bearer token crosses the network in clear text without "
                  "--tls-cert/--tls-key", soft_wrap=True, highlight=False)
    if materialize and window_s is None and (retain_s is None or retain_s > LONG_RETENTION_S):
        kept = f"up to {retain} with --retain {retain}" if retain else "everything, without --retain"
        err.print(f"note: each new snapshot's analyses cover every segment the store keeps ({kept}), so they take "
                  "longer as it fills; --analysis-window 6h bounds them to the last 6 h of spans (docs/results.md)",
                  soft_wrap=True, highlight=False, markup=False)
    where = collector.http.url + (f" and OTLP/gRPC on {collector.grpc_address}" if collector.grpc else "")
    print(f"infertrace collect: listening on {where}, store {store}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    collector.start()
    helpers = start_helpers(store, metrics, materialize, window_s)
    try:
        stop.wait()
    finally:
        collector.shutdown()
        helpers.stop()


store_app = typer.Typer(no_args_is_help=True, help="Upkeep of a store: compact, check, repair.")


@store_app.command("compact")
def compact_command(
    store: Annotated[Path, typer.Option(help="Store directory")],
    target_mib: Annotated[int, typer.Option(help="Size of merged segments, in MiB of input")] = 128,
    min_age: Annotated[float, typer.Option(help="Only merge segments older than this many seconds")] = 0.0,
    grace: Annotated[float, typer.Option(help="Keep merged segments this many seconds for open readers")] = 300.0,
    retain: Annotated[str | None, typer.Option(help="Drop partitions older than this, e.g. 7d")] = None,
) -> None:
    """Merge small segments into large ones (readers keep working throughout; safe to interrupt at any
    point), remove segments merged more than --grace seconds ago, and apply --retain.

    Example: infertrace store compact --store traces/ --retain 7d
    """
    from infertrace.store import not_a_store
    from infertrace.store.compaction import compact, parse_duration

    if not store.is_dir():
        raise fail(f"--store {store}: {not_a_store(store)}")
    try:
        retain_s = parse_duration(retain) if retain else None
        summary = compact(store, target_bytes=target_mib << 20, min_age_s=min_age, grace_s=grace, retain_s=retain_s)
    except (OSError, ValueError) as e:
        raise fail(str(e)) from None
    err.print(summary.paragraph(), soft_wrap=True, highlight=False)


@store_app.command("check")
def check_command(
    store: Annotated[Path, typer.Option(help="Store directory")],
    quick: Annotated[bool, typer.Option(help="Read only each segment's footer, not every page")] = False,
    fmt: Annotated[str, typer.Option("--format", help="text or json")] = "text",
) -> None:
    """Report unreadable segments, leftovers of dead writers, the quarantine, converted or truncated values,
    and duplicate or conflicting spans. Exit 0 when every segment reads, 1 when some do not.

    Example: infertrace store check --store traces/
    """
    from infertrace.store.health import check

    if fmt not in ("text", "json"):
        raise fail(f"--format must be text or json, got {fmt!r}")
    try:
        health = check(store, full=not quick)
    except FileNotFoundError as e:
        raise fail(f"--store {store}: {e}") from None
    if fmt == "json":
        print(json.dumps({"healthy": health.healthy, "segments": health.segments, "rows": health.rows,
                          "bytes": health.bytes, "corrupt": [[str(p), r] for p, r in health.corrupt],
                          "temporaries": [str(p) for p in health.temporaries],
                          "orphan_sidecars": [str(p) for p in health.orphan_sidecars],
                          "superseded": health.superseded, "quarantined": health.quarantined,
                          "reasons": health.reasons, "notes": health.notes, "duplicate_rows": health.duplicate_rows,
                          "conflicting_spans": health.conflicting_spans, "first_span_ns": health.first_ns,
                          "last_span_ns": health.last_ns}, indent=1))
    else:
        print("\n".join(health.lines()))
    if not health.healthy:
        raise typer.Exit(1)


@store_app.command("repair")
def repair_command(store: Annotated[Path, typer.Option(help="Store directory")]) -> None:
    """Set unreadable segments aside in corrupt/ (salvaging the row groups that still read), remove the
    temporaries of dead writers and the leftovers of interrupted compactions. Never deletes a readable span.

    Example: infertrace store repair --store traces/
    """
    from infertrace.store.health import repair

    try:
        summary = repair(store)
    except FileNotFoundError as e:
        raise fail(f"--store {store}: {e}") from None
    err.print(summary.paragraph(), soft_wrap=True, highlight=False)
    if summary.busy:
        raise typer.Exit(1)
