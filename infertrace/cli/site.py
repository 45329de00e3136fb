"""`infertrace dashboard` and `infertrace demo`: the dashboard on a store, and the whole chain on a canonical
incident."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infertrace.cli.console import check_choice, err, fail
from infertrace.cli.conventions import duration_option, parse_analysis_window


def dashboard(
    store: Annotated[str, typer.Option(help="Store directory, or ClickHouse's otel_traces (clickhouse://USER@HOST:"
                                            "8123/DB, chdb://PATH): a window of it is read into --snapshot first")],
    port: Annotated[int, typer.Option(help="Port to serve on")] = 8501,
    address: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    components: Annotated[Path | None, typer.Option(
        help="TOML naming the kinds of a gateway's components (docs/sources.md)")] = None,
    since: Annotated[str | None, typer.Option(help="ClickHouse: window start (ISO 8601 UTC, epoch, -1h)")] = None,
    until: Annotated[str | None, typer.Option(help="ClickHouse: window end (exclusive), same forms")] = None,
    snapshot: Annotated[Path | None, typer.Option(
        help="ClickHouse: the local store directory the window is read into (as `ingest --from`)")] = None,
    analysis_window: Annotated[str | None, typer.Option(
        help="Analyse only the segments holding the store's last DURATION of spans, e.g. 6h (docs/results.md)")] = None,
) -> None:
    """Serve the Streamlit dashboard on a store (fleet overview, ITL spikes, incidents, prefix cache, runbook,
    request waterfall). On ClickHouse, the window's traces are first read into a local store (`--snapshot`),
    which the dashboard then serves: the dashboard watches a store's segments for new data, which ClickHouse
    does not have, so restart it (or `ingest --from` again) to see newer spans.

    Example:
      infertrace dashboard --store traces/ --port 8501
      infertrace dashboard --store traces/ --components components.toml
      infertrace dashboard --store traces/ --analysis-window 6h
      infertrace dashboard --store clickhouse://oncall@ch1:8123/otel --since -1h --snapshot incident/
    """
    import os
    import sys

    from infertrace.store import not_a_store
    from infertrace.store.clickhouse.connection import is_clickhouse_url

    try:
        window_s = parse_analysis_window(analysis_window, "--analysis-window")
    except ValueError as e:
        raise fail(str(e)) from None
    if is_clickhouse_url(store):
        from infertrace.cli.store import ingest_from_clickhouse

        if snapshot is None:
            raise fail("--snapshot DIR is needed with a ClickHouse --store: the window is read into that store")
        ingest_from_clickhouse(snapshot, store, since, until)
        store = str(snapshot)
    elif since is not None or until is not None or snapshot is not None:
        raise fail("--since, --until and --snapshot choose a window of a ClickHouse --store; a store directory is "
                   "served whole, or its last DURATION of spans with --analysis-window DURATION")
    root = Path(store)

    app_path = Path(__file__).resolve().parents[2] / "dashboards" / "app.py"
    if not app_path.is_file():
        raise fail(f"{app_path}: the dashboard app is missing (run from a clone of the repository)")
    if not root.is_dir():
        raise fail(f"--store {store}: {not_a_store(root)}")
    extra = []
    if components is not None:
        from infertrace.sources.components import load_rules

        try:
            load_rules(components)
        except ValueError as e:
            raise fail(str(e)) from None
        extra = ["--components", str(components.resolve())]
    if window_s is not None:
        extra += ["--analysis-window", duration_option(window_s)]
    command = [sys.executable, "-m", "streamlit", "run", str(app_path), "--server.headless", "true",
               "--server.address", address, "--server.port", str(port), "--browser.gatherUsageStats", "false",
               "--", "--store", str(root.resolve()), *extra]
    print(f"infertrace dashboard: http://{address}:{port}/ on store {store}", flush=True)
    # Become the Streamlit server (same process id), so a signal to this command stops the server.
    try:
        os.execv(sys.executable, command)
    except OSError as e:
        raise fail(f"cannot start streamlit with {sys.executable}: {e}") from None


def demo(
    out: Annotated[Path, typer.Option(help="Store directory to create (the scenario goes into OUT/scenario)")] = (
        Path("demo-store")),
    fmt: Annotated[str, typer.Option("--format", help="Report format: table, markdown, json or html")] = "table",
    seed: Annotated[int, typer.Option(help="Seed of the incident's onset, length and magnitude")] = 7,
    duration: Annotated[float, typer.Option(help="Simulated seconds of traffic")] = 300.0,
) -> None:
    """Simulate a canonical multi-model incident (a shared router degrading two of three models, prefill
    collisions on one), ingest it, print the report, and say how to open the dashboard on that store.

    Example:
      infertrace demo --out demo-store
    """
    from infertrace.demo import injected, run_demo
    from infertrace.report import FORMATS, build_report, render
    from infertrace.store.store import Store

    check_choice("--format", fmt, FORMATS)
    if duration < 60:
        raise fail(f"--duration must be ≥ 60 simulated seconds (a baseline, then the incident), got {duration}")
    if out.exists() and not out.is_dir():
        raise fail(f"--out {out} exists and is not a directory")
    err.print(f"Simulating the demo incident ({duration:.0f} s of a three-model fleet) into {out} …",
              soft_wrap=True, markup=False)
    try:
        with err.status("Simulating and ingesting …"):
            run = run_demo(out, seed, duration)
    except OSError as e:
        raise fail(f"--out {out}: {e}") from None
    err.print(injected(run.truth), soft_wrap=True, markup=False)
    with Store.open(out) as store, err.status("Analysing …"):
        doc = build_report(store)
    print(render(doc, fmt), end="")
    err.print(f"\nOpen the dashboard on this store:\n  infertrace dashboard --store {out}\n"
              f"then browse http://127.0.0.1:8501/ (ITL spikes, incidents, runbook). Ask the runbook:\n"
              f"  infertrace query --store {out} worst_itl_gaps --param top=5", soft_wrap=True, markup=False)
