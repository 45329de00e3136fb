"""An analysis window (`collect --analysis-window`, `dashboard --analysis-window`, `serve-metrics
--analysis-window`): a long-kept store's snapshots are only the segments holding its last DURATION of spans, so
each materialisation costs what the window holds. A store of two incidents two hours apart, with real ingest and a
real child process materialising it."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import typer

from infertrace.analyzers.itl import analyze_itl
from infertrace.analyzers.slo import slo_summary
from infertrace.results.background import Materializer, spawn
from infertrace.results.live import covered, current_segments, lag, shown_snapshot
from infertrace.results.materialized import is_materialised, latest, load, load_report
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store, window_segments
from tests.incident_stores import SAMPLES

ROOT = Path(__file__).resolve().parents[1]
HOUR_NS = 3600 * 10**9


def _shifted(source: Path, out: Path, shift_ns: int) -> Path:
    """The sample's OTLP lines with every time `shift_ns` later and other trace ids (another incident, later)."""

    def shift(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: (str(int(v) + shift_ns) if k.endswith("UnixNano") else
                        "f" + v[1:] if k == "traceId" else shift(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [shift(v) for v in value]
        return value

    with gzip.open(source, "rt") as lines, open(out, "w") as shifted:
        for line in lines:
            shifted.write(json.dumps(shift(json.loads(line))) + "\n")
    return out


@pytest.fixture(scope="module")
def two_incidents(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a store holding prefill_storm and, two hours later, cache_busting; a store holding the later one alone)."""
    work = tmp_path_factory.mktemp("window")
    later = _shifted(SAMPLES / "cache_busting" / "traces.jsonl.gz", work / "later.jsonl", 2 * HOUR_NS)
    both, alone = work / "both", work / "alone"
    ingest_paths(both, [SAMPLES / "prefill_storm" / "traces.jsonl.gz"])
    ingest_paths(both, [later])
    ingest_paths(alone, [later])
    return both, alone


def _names(snapshot: tuple[str, ...]) -> list[str]:
    return sorted(Path(s).name for s in snapshot)


def test_the_window_is_the_segments_holding_the_last_duration_of_spans(two_incidents: tuple[Path, Path]) -> None:
    both, alone = two_incidents
    everything = current_segments(both)
    hour = window_segments(both, 3600)
    assert _names(hour) == _names(current_segments(alone)) and len(hour) < len(everything)
    assert current_segments(both, 3600) == hour
    assert window_segments(both, 3 * 3600) == everything  # both incidents lie within three hours of the newest span
    cover = covered(both, hour)
    assert (cover.segments, cover.store_segments) == (len(hour), len(everything))
    assert cover.first_ns is not None and cover.first_ns >= 1767225600 * 10**9 + 2 * HOUR_NS
    with pytest.raises(ValueError, match="must be positive"):
        window_segments(both, 0)
    # `store check` says which times the store holds, to choose a window by
    from infertrace.store.health import check

    health, whole = check(both, full=False), covered(both, everything)
    with Store.open(both) as store:
        first, last = store.sql("SELECT min(start_ns), max(end_ns) FROM spans_raw").fetchall()[0]
    assert (health.first_ns, health.last_ns) == (whole.first_ns, whole.last_ns) == (first, last)
    assert health.lines()[0].endswith(", spans from 2026-01-01 00:00:00 UTC to 2026-01-01 02:02:59 UTC.")


def test_the_dashboards_sidebar_says_what_the_window_covers(two_incidents: tuple[Path, Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    both, _ = two_incidents
    monkeypatch.syspath_prepend(str(ROOT / "dashboards"))
    import results  # the module the dashboard's pages import

    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(both)])
    assert results.window_s() is None and results.window_note(both, current_segments(both)) is None
    monkeypatch.setenv(results.WINDOW_ENV, "1h")
    hour = results.snapshot(both)
    assert hour == window_segments(both, 3600)
    note = results.window_note(both, hour)
    assert note is not None and note.startswith(
        f"Analysing the last 1 h of the store's data: {len(hour)} of its {len(current_segments(both))} segments, "
        "spans from 2026-01-01 02:00:")
    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(both), "--analysis-window", "90m"])  # before the env
    assert results.window_s() == 5400
    monkeypatch.setenv(results.WINDOW_ENV, "soon")
    monkeypatch.setattr(sys, "argv", ["app.py", "--store", str(both)])
    with pytest.raises(ValueError, match=f"{results.WINDOW_ENV} 'soon' is not a positive duration"):
        results.window_s()


def test_a_span_from_a_clock_running_years_ahead_does_not_move_the_window_past_every_other_span(
        tmp_path: Path, two_incidents: tuple[Path, Path]) -> None:
    import shutil

    both, _ = two_incidents
    store = tmp_path / "store"
    shutil.copytree(both, store)
    before = window_segments(store, 3600)
    year_2100 = 4102444800 * 10**9
    span = {"traceId": "e" * 32, "spanId": "e" * 16, "name": "llm_request", "kind": 2,
            "startTimeUnixNano": str(year_2100), "endTimeUnixNano": str(year_2100 + 10**9)}
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "skewed"}}]}
    line = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "x"}, "spans": [span]}]}]}
    (tmp_path / "skewed.jsonl").write_text(json.dumps(line) + "\n")
    ingest_paths(store, [tmp_path / "skewed.jsonl"])
    skewed = sorted(set(current_segments(store)) - set(current_segments(both)))
    assert len(skewed) == 1
    # its end counts as when its segment was written (now), which lies after every other span of this store
    assert window_segments(store, 3600) == tuple(sorted((*before, *skewed)))


def test_a_segment_whose_footer_gives_no_times_stays_in_the_window(tmp_path: Path,
                                                                   two_incidents: tuple[Path, Path]) -> None:
    import shutil

    both, _ = two_incidents
    store = tmp_path / "store"
    shutil.copytree(both, store)
    older = sorted(set(current_segments(store)) - set(window_segments(store, 3600)))[0]
    (store / older).write_bytes(b"not parquet")  # damaged: nothing says where its spans lie
    assert older in window_segments(store, 3600)


@pytest.mark.slow  # 9-13 s each: the default run stays under 10 minutes; CI runs it
def test_a_windowed_materialisation_gives_the_results_of_the_window_alone(tmp_path: Path,
                                                                          two_incidents: tuple[Path, Path]) -> None:
    import shutil

    both, alone = two_incidents
    store_dir = tmp_path / "store"
    shutil.copytree(both, store_dir)
    child = spawn(store_dir, window_s=3600)  # what `collect --analysis-window 1h` runs for each snapshot
    _, stderr = child.communicate(timeout=600)
    assert child.returncode == 0, stderr.decode()
    window = window_segments(store_dir, 3600)
    assert is_materialised(store_dir, (Path(s).name for s in window))
    assert not is_materialised(store_dir, (Path(s).name for s in current_segments(store_dir)))
    recorded = latest(store_dir)
    assert recorded is not None and recorded.segments == window
    with Store.open(store_dir, segments=window) as windowed, Store.open(alone) as only:
        assert load(windowed, "itl") == analyze_itl(only)
        assert load(windowed, "slo") == slo_summary(only)
    report = load_report(store_dir, (Path(s).name for s in window))
    with Store.open(alone) as only:
        spans = only.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    assert report is not None and report["store"]["spans"] == spans
    # The report says it covers a window, and how much of the store it left out: never read as "nothing there".
    left_out = len(current_segments(store_dir)) - len(window)
    assert (report["store"]["analysis_window_s"], report["store"]["segments_left_out"]) == (3600, left_out)
    from infertrace.report import render

    schema = json.loads((ROOT / "infertrace" / "report" / "schema.json").read_text())
    jsonschema.validate(json.loads(render(report, "json")), schema, cls=jsonschema.Draft202012Validator)
    assert (f"(an analysis window: the segments holding the store's last 1 h of spans; {left_out} older segments "
            "left out)") in " ".join(render(report, "markdown").split())
    # A reader of the window shows it, and is not behind; one of the whole store is not told that the older
    # segments the window left out are newer ones being analysed.
    assert shown_snapshot(store_dir, 3600) == window and lag(store_dir, window, 3600) is None
    assert lag(store_dir, window) is None
    # `report` without the window analyses the whole store, and first says how to read the collector's at once
    run = subprocess.run([sys.executable, "-m", "infertrace", "report", "--store", str(store_dir), "--format", "json",
                          "--fail-on", "never"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "Its collector analyses the last 1 h of it (--analysis-window): `--analysis-window 1h` reads that" \
        in " ".join(run.stderr.split())
    assert "analysis_window_s" not in json.loads(run.stdout)["store"]


@pytest.mark.slow  # 7-9 s: the default run stays under 10 minutes; CI runs it
def test_the_collectors_materialiser_materialises_the_windows_snapshot(tmp_path: Path,
                                                                        two_incidents: tuple[Path, Path]) -> None:
    import shutil

    both, _ = two_incidents
    store_dir = tmp_path / "store"
    shutil.copytree(both, store_dir)
    materializer = Materializer(store_dir, settle_s=0.2, poll_s=0.1, window_s=3600)
    assert materializer._snapshot() == window_segments(store_dir, 3600)  # the snapshot it watches
    # It starts from the snapshot it sees; a new segment (later spans) makes a new window, which it materialises.
    materializer.start()
    try:
        later = _shifted(SAMPLES / "host_pauses" / "traces.jsonl.gz", tmp_path / "latest.jsonl", 2 * HOUR_NS + 600)
        ingest_paths(store_dir, [later])
        window = window_segments(store_dir, 3600)
        deadline = time.monotonic() + 600
        while not is_materialised(store_dir, (Path(s).name for s in window)):
            assert time.monotonic() < deadline, "the window's snapshot was never materialised"
            time.sleep(0.5)
    finally:
        materializer.stop()
    assert not is_materialised(store_dir, (Path(s).name for s in current_segments(store_dir)))


@pytest.mark.parametrize("command", [["collect", "--listen", "127.0.0.1:0"], ["dashboard"], ["serve-metrics"],
                                     ["report"]])
def test_an_analysis_window_that_is_not_a_duration_is_a_usage_error(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "store").mkdir()
    run = subprocess.run([sys.executable, "-m", "infertrace", *command, "--store", str(tmp_path / "store"),
                          "--analysis-window", "soon"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2
    assert "--analysis-window 'soon' is not a positive duration" in run.stderr


def test_every_analysis_window_option_reads_the_environment(tmp_path: Path) -> None:
    import os

    from infertrace.cli import app
    from infertrace.cli.conventions import WINDOW_ENV

    group = typer.main.get_command(app)
    options = {name: param for name, command in group.commands.items()  # type: ignore[attr-defined]
               for param in command.params if param.name == "analysis_window"}
    assert set(options) == {"collect", "dashboard", "serve-metrics", "report", "query", "export"}
    assert all(param.envvar == WINDOW_ENV for param in options.values())
    (tmp_path / "store").mkdir()
    run = subprocess.run([sys.executable, "-m", "infertrace", "report", "--store", str(tmp_path / "store")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, WINDOW_ENV: "soon"})
    assert run.returncode == 2 and "--analysis-window 'soon' is not a positive duration" in run.stderr



@pytest.mark.slow  # 9-13 s each: the default run stays under 10 minutes; CI runs it
def test_report_of_an_analysis_window_says_so_and_is_kept_for_the_next_report(
        tmp_path: Path, two_incidents: tuple[Path, Path]) -> None:
    import shutil

    both, _ = two_incidents
    store_dir = tmp_path / "store"
    shutil.copytree(both, store_dir)

    def report(*extra: str) -> dict[str, Any]:
        run = subprocess.run([sys.executable, "-m", "infertrace", "report", "--store", str(store_dir), "--format",
                              "json", "--fail-on", "never", *extra], capture_output=True, text=True, cwd=ROOT,
                             timeout=600)
        assert run.returncode == 0, run.stderr
        return dict(json.loads(run.stdout))

    windowed = report("--analysis-window", "1h")
    window = window_segments(store_dir, 3600)
    assert windowed["store"]["segments"] == len(window)
    assert windowed["store"]["segments_left_out"] == len(current_segments(store_dir)) - len(window) > 0
    assert load_report(store_dir, (Path(s).name for s in window)) == windowed  # kept: the next one reads it
    whole = report()
    assert "analysis_window_s" not in whole["store"] and whole["store"]["segments"] == len(current_segments(store_dir))


@pytest.mark.slow  # 7-9 s: the default run stays under 10 minutes; CI runs it
def test_a_sliding_window_leaves_no_step_batches_behind_that_no_kept_snapshot_reads(
        tmp_path: Path, two_incidents: tuple[Path, Path]) -> None:
    import shutil

    from infertrace.results.relations import MANIFEST, RELATIONS_DIR, SEGMENT_RELATIONS_DIR, materialize_relations

    both, _ = two_incidents
    store_dir = tmp_path / "store"
    shutil.copytree(both, store_dir)
    samples = ["host_pauses", "engine_regression", "rate_limiter_flapping", "prefill_storm"]
    for i, name in enumerate(samples):  # every two hours a new incident: the 1 h window slides past the last one
        with Store.open(store_dir, window_s=3600) as store:
            materialize_relations(store)
        later = _shifted(SAMPLES / name / "traces.jsonl.gz", tmp_path / f"{name}.jsonl", (4 + 2 * i) * HOUR_NS)
        ingest_paths(store_dir, [later])
    with Store.open(store_dir, window_s=3600) as store:
        materialize_relations(store)
        held = set(store.segment_paths())
    read = {Path(f).parent.name for manifest in (store_dir / RELATIONS_DIR).glob(f"*/{MANIFEST}")
            for files in json.loads(manifest.read_text()).values() for f in files}
    batches = {done.parent for done in (store_dir / SEGMENT_RELATIONS_DIR).glob("*/*/done")}
    assert len(batches) >= 2
    for batch in batches:  # each is read by a kept snapshot, or holds only segments of the current one
        assert batch.name in read or set(json.loads((batch / MANIFEST).read_text())) <= held


def test_the_dashboard_with_an_analysis_window_shows_the_window_and_says_what_it_covers(
        two_incidents: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    both, alone = two_incidents
    monkeypatch.setenv("INFERTRACE_STORE", str(both))
    monkeypatch.setenv("INFERTRACE_ANALYSIS_WINDOW", "1h")
    at = AppTest.from_file(str(ROOT / "dashboards" / "app.py"), default_timeout=300)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["snapshot"] == window_segments(both, 3600)
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert f"Analysing the last 1 h of the store's data: {len(window_segments(both, 3600))} of its " in captions
    table = next(d.value for d in at.dataframe if "ttft p99 ms" in d.value.columns)
    with Store.open(alone) as only:  # the later incident's requests, none of the earlier one's
        assert list(table["requests"]) == [m.gateway_requests for m in slo_summary(only).models]
    monkeypatch.setenv("INFERTRACE_ANALYSIS_WINDOW", "soon")
    bad = AppTest.from_file(str(ROOT / "dashboards" / "app.py"), default_timeout=300)
    bad.run()
    assert [e.value for e in bad.error] == ["INFERTRACE_ANALYSIS_WINDOW 'soon' is not a positive duration like 30m, "
                                            "6h, 1h30m or 2d"]


@pytest.mark.parametrize("seconds", [3600, 5400, 2 * 86400, 45, 0.5, 90.25, 6 * 3600.0])
def test_a_window_handed_on_as_an_option_reads_back_the_same(seconds: float) -> None:
    from infertrace.cli.conventions import duration_option, parse_analysis_window

    assert parse_analysis_window(duration_option(seconds), "--analysis-window") == seconds


@pytest.mark.parametrize(("options", "told"), [([], True), (["--retain", "7d"], True), (["--retain", "12h"], False),
                                               (["--analysis-window", "6h"], False), (["--no-materialize"], False)])
def test_a_collector_that_keeps_days_without_a_window_is_told_what_its_snapshots_cost(
        tmp_path: Path, options: list[str], told: bool) -> None:
    process = subprocess.Popen([sys.executable, "-m", "infertrace", "collect", "--store", str(tmp_path / "store"),
                                "--listen", "127.0.0.1:0", "--compact-interval", "0", *options], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and "listening on" in process.stdout.readline()
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    said = " ".join(stderr.split())
    assert ("note: each new snapshot's analyses cover every segment the store keeps" in said) == told, stderr
    if told:
        assert "--analysis-window 6h bounds them to the last 6 h of spans" in said


@pytest.mark.slow  # 9-13 s each: the default run stays under 10 minutes; CI runs it
def test_a_runbook_query_of_an_analysis_window_reads_its_materialised_relations_and_says_what_it_left_out(
        tmp_path: Path, two_incidents: tuple[Path, Path]) -> None:
    import shutil

    both, alone = two_incidents
    store_dir = tmp_path / "store"
    shutil.copytree(both, store_dir)
    child = spawn(store_dir, window_s=3600)  # the collector's materialisation of the window
    assert child.wait(timeout=600) == 0

    def query(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "infertrace", "query", "slowest_requests", "--store",
                               str(store_dir), "--param", "top=1000", "--format", "json", *extra],
                              capture_output=True, text=True, cwd=ROOT, timeout=600)

    windowed, whole = query("--analysis-window", "1h"), query()
    assert windowed.returncode == whole.returncode == 0, windowed.stderr + whole.stderr
    with Store.open(alone) as only:
        later = {r for (r,) in only.sql("SELECT request_id FROM requests").fetchall()}
    assert {r["request_id"] for r in json.loads(windowed.stdout)} <= later
    assert {r["request_id"] for r in json.loads(whole.stdout)} - later  # the earlier incident's too
    left_out = len(current_segments(store_dir)) - len(window_segments(store_dir, 3600))
    assert (f"note: queried an analysis window, the segments holding the store's last 1 h of spans: {left_out} "
            "older segments left out, so nothing before it is in this answer") in " ".join(windowed.stderr.split())
    assert "analysis window" not in whole.stderr
    from infertrace.results.relations import open_reader

    with open_reader(store_dir, window_s=3600) as reader:  # the window's written relations, not the span views
        (definition,), = reader.con.execute(
            "SELECT sql FROM duckdb_views() WHERE view_name = 'requests' AND NOT internal").fetchall()
    assert "read_parquet" in definition and "derived/relations" in definition


@pytest.mark.slow  # 9-13 s each: the default run stays under 10 minutes; CI runs it
def test_an_export_of_an_analysis_window_writes_the_windows_spans_and_says_what_it_left_out(
        tmp_path: Path, two_incidents: tuple[Path, Path]) -> None:
    both, alone = two_incidents

    def export(fmt: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "infertrace", "export", "--store", str(both), "--format", fmt,
                               "--out", str(out), "--no-progress", *extra],
                              capture_output=True, text=True, cwd=ROOT, timeout=600)

    windowed = export("otlp", tmp_path / "window.jsonl", "--analysis-window", "1h")
    assert windowed.returncode == 0, windowed.stderr
    left_out = len(current_segments(both)) - len(window_segments(both, 3600))
    assert (f"(an analysis window: the segments holding the store's last 1 h of spans; {left_out} older segments "
            "left out)") in " ".join(windowed.stderr.split())
    exported = tmp_path / "exported"
    ingest_paths(exported, [tmp_path / "window.jsonl"])
    with Store.open(exported) as got, Store.open(alone) as only:
        query = "SELECT trace_id, span_id FROM spans ORDER BY ALL"
        assert got.sql(query).fetchall() == only.sql(query).fetchall()  # the later incident's spans, all of them
    perfetto = export("perfetto", tmp_path / "window.pftrace", "--analysis-window", "1h")
    assert perfetto.returncode == 0 and "(an analysis window:" in perfetto.stderr, perfetto.stderr
    bad = subprocess.run([sys.executable, "-m", "infertrace", "export", "--store", str(both), "--to",
                          "chdb:///nowhere", "--analysis-window", "1h"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert bad.returncode == 2 and "--analysis-window with it" in " ".join(bad.stderr.split())
