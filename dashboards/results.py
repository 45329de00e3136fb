"""Analyzer and runbook results for the dashboard, cached per store snapshot.

Analyzer results are read from the store's materialised results (`infertrace.results`) when `infertrace
ingest` or `collect` wrote them for this snapshot, and computed (and written) otherwise; the store reader's
relation views read the materialised relations when they exist.

A snapshot is the store's segments (paths relative to it). The pages show the current one when its results are
materialised, or when none ever were (they are then computed here, once per snapshot). While a collector adds
segments faster than the analyses of the whole store run, the pages show the newest materialised snapshot instead,
at once, and the sidebar says how far behind it is; a background process materialises the current one (unless
another is at it: the collector's), and the sidebar's watcher reruns the page when it is done. All results are
read through one store reader per snapshot (`reader`), whose connection keeps the relations the analyzers
materialize (on a store without materialised relations, the `requests` or `step_membership` of an hour of a
busy fleet take seconds to compute: once, not once per page). A lock serializes the reader's use (a DuckDB
connection is not shared between threads). Analyzer results are frozen dataclasses, shared as they are
(`st.cache_resource`: no copy per rerun); runbook tables are copied (`st.cache_data`). Nothing here computes a
statistic: it calls the analyzers and the runbook and returns their results.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from infertrace.cli.conventions import WINDOW_ENV, parse_analysis_window
from infertrace.results import result
from infertrace.results.live import covered, lag, shown_snapshot
from infertrace.results.relations import attach
from infertrace.store.store import Store, duration_text, utc_text

STORE_ENV = "INFERTRACE_STORE"


def store_dir() -> Path | None:
    """The store: `--store DIR` after `--` on the streamlit command line, else $INFERTRACE_STORE."""
    args = sys.argv[1:]
    if "--store" in args and args.index("--store") + 1 < len(args):
        return Path(args[args.index("--store") + 1])
    env = os.environ.get(STORE_ENV)
    return Path(env) if env else None


def components_file() -> str | None:
    """`--components FILE` after `--` on the streamlit command line: the kinds of a gateway's components."""
    args = sys.argv[1:]
    if "--components" in args and args.index("--components") + 1 < len(args):
        return args[args.index("--components") + 1]
    return None


def window_s() -> float | None:
    """The analysis window in seconds (`--analysis-window DURATION` after `--` on the streamlit command line, else
    $INFERTRACE_ANALYSIS_WINDOW), or None: the whole store. Raises ValueError for a value that is not a duration."""
    args = sys.argv[1:]
    option = "--analysis-window"
    text = args[args.index(option) + 1] if option in args and args.index(option) + 1 < len(args) else \
        os.environ.get(WINDOW_ENV) or None
    return parse_analysis_window(text, option if option in args else WINDOW_ENV)


def snapshot(root: Path) -> tuple[str, ...]:
    """The snapshot the pages show (see above; `infertrace.results.live`): of the analysis window, when one is
    given."""
    return shown_snapshot(root, window_s())


def window_note(root: str | Path, shown: tuple[str, ...]) -> str | None:
    """What the sidebar says of the analysis window (which segments and times the pages analyse), else None."""
    window = window_s()
    if window is None:
        return None
    cover = covered(root, shown)
    times = (f"spans from {utc_text(cover.first_ns)} to {utc_text(cover.last_ns)}"
             if cover.first_ns is not None and cover.last_ns is not None else "span times unknown")
    return (f"Analysing the last {duration_text(window)} of the store's data: {cover.segments} of its "
            f"{cover.store_segments} segments, {times} (whole segments: the older ones are left out).")


def behind(root: str | Path, shown: tuple[str, ...]) -> str | None:
    """What the sidebar says when the pages show an older snapshot than the store's current one, else None."""
    found = lag(root, shown, window_s())
    if found is None:
        return None
    return (f"Showing the analysis of the spans stored until {found.until_utc()}; {found.newer_segments} newer "
            "segment(s) are being analysed, and the page refreshes when they are.")


_LOCK = threading.Lock()


@st.cache_resource(max_entries=1, show_spinner=False)
def _shared_reader(root: str, snapshot: tuple[str, ...]) -> Store:
    store = Store.open(root, segments=snapshot, window_s=window_s())  # the window's next snapshot, if compacted
    attach(store)  # the snapshot's materialised relations, when written
    if (path := components_file()) is not None:  # results are then kept under a key of their own
        from infertrace.sources.components import load_rules, register

        register(store, load_rules(path))
    return store


@contextmanager
def reader(root: str, snapshot: tuple[str, ...]) -> Iterator[Store]:
    """The snapshot's store reader, for one thread at a time."""
    with _LOCK:
        yield _shared_reader(root, snapshot)


@st.cache_resource(max_entries=2, show_spinner="SLO summary …")
def slo(root: str, snapshot: tuple[str, ...]) -> Any:
    with reader(root, snapshot) as store:
        return result(store, "slo")


@st.cache_resource(max_entries=2, show_spinner="ITL spikes and culprits …")
def itl(root: str, snapshot: tuple[str, ...]) -> Any:
    with reader(root, snapshot) as store:
        return result(store, "itl")


@st.cache_resource(max_entries=2, show_spinner="ITL stall windows from request spans …")
def itl_windows(root: str, snapshot: tuple[str, ...]) -> dict[str, Any]:
    """On a store without step spans: the report's ITL section, from the best method its inputs allow (client
    token times, token spans, the iteration log), with its method named."""
    from infertrace.report.model import ReportOptions, build_report

    with reader(root, snapshot) as store:
        return build_report(store, ReportOptions(sections=("itl",), top=50))["sections"]["itl"]


@st.cache_resource(max_entries=2, show_spinner="Incidents and ranked causes …")
def rca(root: str, snapshot: tuple[str, ...]) -> Any:
    with reader(root, snapshot) as store:
        return result(store, "rca")


@st.cache_data(max_entries=64, show_spinner=False)
def runbook(root: str, snapshot: tuple[str, ...], name: str, values: tuple[tuple[str, str], ...]) -> pd.DataFrame:
    from infertrace.runbook import run_query

    with reader(root, snapshot) as store:
        return run_query(store, name, dict(values))


@st.cache_data(max_entries=64, show_spinner=False)
def runbook_notes(root: str, snapshot: tuple[str, ...], name: str, values: tuple[tuple[str, str], ...],
                  rows: int) -> list[str]:
    """What a runbook answer of `rows` rows could not draw on in this store, and with no rows why not."""
    from infertrace.runbook import answer_notes

    with reader(root, snapshot) as store:
        return answer_notes(store, name, dict(values), rows)


def current() -> tuple[str, tuple[str, ...]]:
    """(store directory, snapshot) for the page being rendered; stops the page when there is no store."""
    root = st.session_state.get("store_dir")
    if not root:
        st.info("No store: start the dashboard with `infertrace dashboard --store DIR`.")
        st.stop()
    return root, st.session_state.get("snapshot", ())


@st.cache_resource(max_entries=2, show_spinner="Prefix cache …")
def prefix_cache(root: str, snapshot: tuple[str, ...]) -> Any:
    with reader(root, snapshot) as store:
        return result(store, "prefix_cache")


@st.cache_resource(max_entries=2, show_spinner="TTFT and disaggregation …")
def ttft(root: str, snapshot: tuple[str, ...]) -> Any:
    with reader(root, snapshot) as store:
        return result(store, "ttft")


@st.cache_resource(max_entries=2, show_spinner="What the store can answer …")
def coverage(root: str, snapshot: tuple[str, ...]) -> Any:
    from infertrace.sources.capabilities import store_coverage

    with reader(root, snapshot) as store:
        return store_coverage(store)
