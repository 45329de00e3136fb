"""`infertrace report` and `infertrace query`: the anomaly report and the on-call runbook over a store."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from infertrace.cli.console import check_choice, did_you_mean, err, fail, show
from infertrace.cli.conventions import parse_analysis_window, parse_when, warn_if_outside

STORE_HELP = ("Store directory, or ClickHouse's otel_traces: clickhouse://USER@HOST:8123/DB (password from "
              "$INFERTRACE_CLICKHOUSE_PASSWORD or the file $INFERTRACE_CLICKHOUSE_PASSWORD_FILE), chdb://PATH")

if TYPE_CHECKING:
    import pandas as pd

    from infertrace.report import ReportOptions
    from infertrace.store.store import Store


def _query_names(incomplete: str) -> list[str]:
    from infertrace.runbook import load_queries

    return [name for name in load_queries() if name.startswith(incomplete)]


def query(
    name: Annotated[str | None, typer.Argument(help="Runbook query name (see --list)",
                                               autocompletion=_query_names)] = None,
    store: Annotated[str | None, typer.Option(help=STORE_HELP)] = None,
    param: Annotated[list[str] | None, typer.Option(help="KEY=VALUE (repeatable); time values also as -15m, 2h, "
                                                         "now")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, csv or json")] = "table",
    list_: Annotated[bool, typer.Option("--list", help="List the runbook queries and exit")] = False,
    show_sql: Annotated[bool, typer.Option("--sql", help="Print the query's SQL instead of running it")] = False,
    analysis_window: Annotated[str | None, typer.Option(
        help="Query only the segments holding the store's last DURATION of spans, e.g. 6h, reading the relations "
             "`collect --analysis-window` materialised for them (docs/results.md)")] = None,
) -> None:
    """Run a named runbook query (RUNBOOK.md) on a store; parameters are bound, never formatted into SQL.

    Example:
      infertrace query --list
      infertrace query --store traces/ worst_itl_gaps --param top=5
      infertrace query --store traces/ slowest_requests --param since=-15m --format csv
      infertrace query --store traces/ worst_itl_gaps --analysis-window 6h
    """
    from infertrace.runbook import RunbookError, answer_notes, load_queries, run_query
    from infertrace.runbook.runner import FORMATS, format_frame, frame_table

    queries = load_queries()
    if list_:
        show(lambda width: [frame_table(_catalog(queries))], lambda: format_frame(_catalog(queries), "table"))
        return
    if name is None:
        raise fail("give a query NAME, or --list to see them")
    check_choice("--format", fmt, FORMATS)
    if name not in queries:
        raise fail(f"no runbook query named {name!r}{did_you_mean(name, queries)}; `infertrace query --list` "
                   f"shows them")
    q = queries[name]
    values: dict[str, object] = {}
    for item in param or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--param {item!r}: expected KEY=VALUE")
        key = key.strip()
        known = [p.name for p in q.parameters]
        if key not in known:
            raise fail(f"--param {key}: query {name} has no such parameter{did_you_mean(key, known)}; its "
                       f"parameters: {', '.join(known) or 'none'}")
        values[key] = _time_value(key, value) if q.parameter(key).type == "time" else value
    if show_sql:
        print(q.sql)
        return
    if store is None:
        raise fail("--store DIR (or $INFERTRACE_STORE) is required to run a query")
    try:
        window_s = parse_analysis_window(analysis_window, "--analysis-window")
    except ValueError as e:
        raise fail(str(e)) from None
    from infertrace.results.relations import open_reader

    # On ClickHouse, the query's own window (its since/until parameters) chooses the spans read.
    window = (values.get("since"), values.get("until"))
    try:
        with open_reader(store, *(int(w) if isinstance(w, int) else None for w in window), window_s) as opened, \
                err.status(f"Running {name} …"):
            frame = run_query(opened, q, values)
            said = answer_notes(opened, q, values, len(frame))
    except RunbookError as e:
        raise fail(str(e)) from None
    except (OSError, ValueError) as e:
        raise fail(f"--store {store}: {e}") from None
    if fmt == "table":
        show(lambda width: [frame_table(frame)], lambda: format_frame(frame, "table"))
    else:
        print(format_frame(frame, fmt))
    # on stderr, so that the rows on stdout stay as they are for whatever reads them
    for line in ([f"{name}: no rows"] if frame.empty else []) + [f"note: {note}" for note in said]:
        err.print(line, markup=False, highlight=False, soft_wrap=True)


def _catalog(queries: dict) -> pd.DataFrame:  # type: ignore[type-arg]
    import pandas as pd

    return pd.DataFrame([{
        "query": q.name, "title": q.title,
        "parameters": " ".join(p.name if p.required else f"[{p.name}]" for p in q.parameters),
    } for q in queries.values()])


def _materialized_report(spec: str, window_s: float | None) -> dict[str, Any] | None:
    """The unfiltered report of the store's current snapshot (of the analysis window, with `window_s`), when
    materialised (`infertrace.results`)."""
    from infertrace.results.live import current_segments
    from infertrace.results.materialized import load_report
    from infertrace.store.clickhouse.connection import is_clickhouse_url

    root = Path(spec)
    if is_clickhouse_url(spec) or not root.is_dir():
        return None
    return load_report(root, [Path(s).name for s in current_segments(root, window_s)])


def _newest_materialized_report(spec: str, window_s: float | None) -> dict[str, Any] | None:
    """`report --materialized`: the report of the store's newest materialised snapshot, saying on stderr how far
    behind the store it is; None (the current snapshot is then computed) when none was materialised."""
    from infertrace.results.live import lag
    from infertrace.results.materialized import latest, load_report
    from infertrace.store.clickhouse.connection import is_clickhouse_url

    root = Path(spec)
    if is_clickhouse_url(spec):
        raise fail(f"--store {spec}: --materialized reads a store directory's materialised results; ClickHouse "
                   "keeps none")
    record = latest(root) if root.is_dir() else None
    doc = load_report(root, [Path(s).name for s in record.segments]) if record is not None else None
    if record is None or doc is None:
        err.print("No materialised snapshot in this store yet: analysing its current one.", markup=False,
                  highlight=False, soft_wrap=True)
        return None
    behind = lag(root, record.segments, window_s)
    if behind is not None:
        err.print(f"Reporting on the spans stored until {behind.until_utc()}: {behind.newer_segments} newer "
                  "segment(s) are not in this report (being analysed; without --materialized the report includes "
                  "them).", markup=False, highlight=False, soft_wrap=True)
    return doc


def _collectors_window(spec: str) -> str | None:
    """When the store's newest materialised snapshot is an analysis window's (a collector run with
    `--analysis-window`) and the whole store is about to be analysed instead: how to read that one at once."""
    from infertrace.cli.conventions import duration_option
    from infertrace.results.materialized import latest, load_report
    from infertrace.store.store import duration_text

    root = Path(spec)
    record = latest(root) if root.is_dir() else None
    doc = load_report(root, [Path(s).name for s in record.segments]) if record is not None else None
    window = doc["store"].get("analysis_window_s") if doc is not None else None
    if window is None:
        return None
    return (f"Analysing the whole store. Its collector analyses the last {duration_text(window)} of it "
            f"(--analysis-window): `--analysis-window {duration_option(window)}` reads that "
            "analysis, and `--materialized` the newest one, at once.")


def materialized_results(store: Store, options: ReportOptions) -> dict[str, Any]:
    """The analyses the report needs, from the store's materialised results (computed and kept when
    missing): whole-store analyses always, the SLO summary only for an unfiltered report."""
    from infertrace.report import ReportOptions
    from infertrace.results import result
    from infertrace.results.relations import attach

    attach(store)
    wanted = {"incidents": "rca", "itl": "itl", "ttft": "ttft", "prefix_cache": "prefix_cache",
              "prefill_throughput": "roofline"}
    out: dict[str, Any] = {"cache" if name == "prefix_cache" else name: result(store, name)
                           for section, name in wanted.items() if section in options.sections}
    default = ReportOptions(sections=options.sections)
    if "slo" in options.sections and options == default:
        out["slo"] = result(store, "slo")
    return out


def _time_value(key: str, value: str) -> int:
    try:
        return parse_when(value)
    except ValueError as e:
        raise fail(f"--param {key}: {e}") from None


def report(
    store: Annotated[str, typer.Option(help=STORE_HELP)],
    since: Annotated[str | None, typer.Option(
        help="Window start: ISO 8601 (UTC), epoch s or ns, or back from now: -15m, 2h, 1d")] = None,
    until: Annotated[str | None, typer.Option(help="Window end (exclusive), same forms")] = None,
    model: Annotated[str | None, typer.Option(help="Only this model")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, json or html")] = "table",
    fail_on: Annotated[str, typer.Option(
        help="Exit 1 when a finding is at least this severe: info, warning, critical, or never")] = "critical",
    slo: Annotated[list[str] | None, typer.Option(
        help="SLO target KEY=VALUE (repeatable): ttft|itl|e2e_p50|p95|p99_ms, error_rate, rejected_rate")] = None,
    section: Annotated[list[str] | None, typer.Option(help="Only these sections (repeatable)")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the report to this file instead of stdout")] = None,
    components: Annotated[Path | None, typer.Option(
        help="TOML naming the kinds of a gateway's components (docs/sources.md)")] = None,
    materialized: Annotated[bool, typer.Option(
        "--materialized",
        help="At once, from the newest materialised snapshot, while a collector's newest segments are still being "
             "analysed (says how far behind it is); unfiltered reports only")] = False,
    analysis_window: Annotated[str | None, typer.Option(
        help="Analyse only the segments holding the store's last DURATION of spans, e.g. 6h, as `collect "
             "--analysis-window` materialises them (docs/results.md)")] = None,
) -> None:
    """The anomaly report over a store: SLO summary, incidents with ranked causes, ITL spike culprits,
    recommendations. Exit 0: nothing at or above --fail-on; 1: findings at or above it; 2: usage or I/O error.

    Example:
      infertrace report --store traces/ --since -15m
      infertrace report --store /var/lib/infertrace --materialized
      infertrace report --store /var/lib/infertrace --analysis-window 6h
      infertrace report --store traces/ --model llama-3-8b --format markdown --out report.md
      infertrace report --store traces/ --slo ttft_p99_ms=800 --fail-on warning
      INFERTRACE_CLICKHOUSE_PASSWORD_FILE=~/.ch infertrace report --store clickhouse://oncall@ch1:8123/otel --since -1h
    """
    from infertrace.analyzers.slo import parse_target, with_targets
    from infertrace.report import FORMATS, SEVERITIES, ReportOptions, build_report, render, severity_at_least
    from infertrace.report.model import SECTIONS, check_selection
    from infertrace.sources.components import load_rules, register

    check_choice("--format", fmt, FORMATS)
    if fail_on not in (*SEVERITIES[1:], "never"):
        raise fail(f"--fail-on must be info, warning, critical or never, got {fail_on!r}")
    unknown = sorted(set(section or ()) - set(SECTIONS))
    if unknown:
        raise fail(f"--section: unknown {unknown}; known: {', '.join(SECTIONS)}")
    try:
        targets = with_targets([parse_target(t) for t in slo or ()])
        since_ns = parse_when(since) if since is not None else None
        until_ns = parse_when(until) if until is not None else None
        window_s = parse_analysis_window(analysis_window, "--analysis-window")
    except ValueError as e:
        raise fail(str(e)) from None
    if since_ns is not None and until_ns is not None and since_ns >= until_ns:
        raise fail(f"--since {since} is not before --until {until}")
    options = ReportOptions(since_ns=since_ns, until_ns=until_ns, model=model, tenant=tenant, targets=targets,
                            sections=tuple(section) if section else SECTIONS)
    try:
        rules = load_rules(components) if components is not None else ()
    except ValueError as e:
        raise fail(str(e)) from None
    # The materialised report is the one without --components rules (they rename the components RCA ranks).
    if materialized and (options != ReportOptions() or rules):
        raise fail("--materialized reports the whole store as materialised: it takes no --since, --until, --model, "
                   "--tenant, --slo, --section or --components")
    doc = (_newest_materialized_report(store, window_s) if materialized else
           _materialized_report(store, window_s) if options == ReportOptions() and not rules else None)
    if doc is None:
        from infertrace.results.materialized import save_report
        from infertrace.store.store import Store, open_store

        if window_s is None and (hint := _collectors_window(store)) is not None:
            err.print(hint, markup=False, highlight=False, soft_wrap=True)
        try:
            with open_store(store, since_ns, until_ns, window_s) as opened:
                if not opened.segments:
                    raise fail(f"--store {store}: the store holds no spans (ingest traces first)")
                if (problem := check_selection(opened, options)) is not None:
                    raise fail(problem)
                register(opened, rules)
                with err.status("Analysing the store …"):
                    doc = build_report(opened, options, **materialized_results(opened, options))
                if options == ReportOptions() and not rules and type(opened) is Store:
                    with contextlib.suppress(OSError):  # a read-only store: the report is right, only not kept
                        save_report(opened, doc)
        except (OSError, ValueError) as e:  # no such directory; a bad URL; ClickHouse unreachable or failing
            raise fail(f"--store {store}: {e}") from None
    warn_if_outside(doc["store"], since_ns, until_ns)
    if out is None and fmt == "table":
        from infertrace.report.layout import layout
        from infertrace.report.render import renderables

        show(lambda width: renderables(layout(doc), min(width, 110)), lambda: render(doc, fmt))
    elif out is None:
        print(render(doc, fmt), end="")
    else:
        try:
            out.write_text(render(doc, fmt), encoding="utf-8")
        except OSError as e:
            raise fail(f"--out {out}: {e}") from None
    if fail_on != "never" and severity_at_least(doc["severity"], fail_on):
        raise typer.Exit(1)
