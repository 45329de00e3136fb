"""`infertrace report` and `infertrace query`: the anomaly report and the on-call runbook over a store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infertrace.cli.console import fail


def query(
    name: Annotated[str | None, typer.Argument(help="Runbook query name (see --list)")] = None,
    store: Annotated[Path | None, typer.Option(help="Store directory")] = None,
    param: Annotated[list[str] | None, typer.Option(help="KEY=VALUE (repeatable)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, csv or json")] = "table",
    list_: Annotated[bool, typer.Option("--list", help="List the runbook queries and exit")] = False,
    show_sql: Annotated[bool, typer.Option("--sql", help="Print the query's SQL instead of running it")] = False,
) -> None:
    """Run a named runbook query (RUNBOOK.md) on a store; parameters are bound, never formatted into SQL."""
    from infertrace.runbook import RunbookError, get_query, load_queries, run_query
    from infertrace.runbook.runner import FORMATS, format_frame

    if list_:
        for q in load_queries().values():
            params = " ".join(p.name if p.required else f"[{p.name}]" for p in q.parameters)
            print(f"{q.name:34} {q.title}" + (f"  ({params})" if params else ""))
        return
    if name is None:
        raise fail("give a query NAME, or --list to see them")
    if fmt not in FORMATS:
        raise fail(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    values: dict[str, str] = {}
    for item in param or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--param {item!r}: expected KEY=VALUE")
        values[key.strip()] = value
    try:
        q = get_query(name)
        if show_sql:
            print(q.sql)
            return
        if store is None:
            raise fail("--store DIR is required to run a query")
        from infertrace.store.store import Store

        with Store.open(store) as opened:
            frame = run_query(opened, q, values)
    except RunbookError as e:
        raise fail(str(e)) from None
    except OSError as e:
        raise fail(f"--store {store}: {e}") from None
    print(format_frame(frame, fmt))


def report(
    store: Annotated[Path, typer.Option(help="Store directory")],
    since: Annotated[str | None, typer.Option(help="Window start: ISO 8601 (UTC), epoch s or ns")] = None,
    until: Annotated[str | None, typer.Option(help="Window end (exclusive)")] = None,
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
) -> None:
    """The anomaly report over a store: SLO summary, incidents with ranked causes, ITL spike culprits,
    recommendations. Exit 0: nothing at or above --fail-on; 1: findings at or above it; 2: usage or I/O error."""
    from infertrace.analyzers.slo import parse_target, with_targets
    from infertrace.report import FORMATS, SEVERITIES, ReportOptions, build_report, render, severity_at_least
    from infertrace.report.model import SECTIONS, check_selection
    from infertrace.runbook import parse_time_ns

    if fmt not in FORMATS:
        raise fail(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fail_on not in (*SEVERITIES[1:], "never"):
        raise fail(f"--fail-on must be info, warning, critical or never, got {fail_on!r}")
    unknown = sorted(set(section or ()) - set(SECTIONS))
    if unknown:
        raise fail(f"--section: unknown {unknown}; known: {', '.join(SECTIONS)}")
    try:
        targets = with_targets([parse_target(t) for t in slo or ()])
        since_ns = parse_time_ns(since) if since is not None else None
        until_ns = parse_time_ns(until) if until is not None else None
    except ValueError as e:
        raise fail(str(e)) from None
    if since_ns is not None and until_ns is not None and since_ns >= until_ns:
        raise fail(f"--since {since} is not before --until {until}")
    options = ReportOptions(since_ns=since_ns, until_ns=until_ns, model=model, tenant=tenant, targets=targets,
                            sections=tuple(section) if section else SECTIONS)
    from infertrace.sources.components import load_rules, register
    from infertrace.store.store import Store

    try:
        rules = load_rules(components) if components is not None else ()
    except ValueError as e:
        raise fail(str(e)) from None

    try:
        with Store.open(store) as opened:
            if not opened.segments:
                raise fail(f"--store {store}: the store holds no spans (ingest traces first)")
            if (problem := check_selection(opened, options)) is not None:
                raise fail(problem)
            register(opened, rules)
            doc = build_report(opened, options)
    except FileNotFoundError as e:
        raise fail(f"--store {store}: {e}") from None
    text = render(doc, fmt)
    if out is None:
        print(text, end="")
    else:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as e:
            raise fail(f"--out {out}: {e}") from None
    if fail_on != "never" and severity_at_least(doc["severity"], fail_on):
        raise typer.Exit(1)
