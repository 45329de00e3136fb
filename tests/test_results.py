"""Materialised analysis results: written once per snapshot, read back equal to what the analyzers compute,
never read for another snapshot, recomputed when unreadable, and what `report` and the dashboard read."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infertrace.export.metrics import exposition_text
from infertrace.results import ANALYSES, materialize, result, snapshot_key
from infertrace.results.materialized import RESULTS_DIR, load, load_metrics
from infertrace.results.relations import MANIFEST, PER_SEGMENT, RELATIONS_DIR, SEGMENT_RELATIONS_DIR, attach
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import RELATIONS, Store
from tests.incident_stores import SAMPLES, sample_store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    shutil.copytree(sample_store("prefill_storm").store / "spans", store / "spans")
    return store


@pytest.mark.slow
def test_every_materialised_result_reads_back_equal_to_the_analyzers_result(store_dir: Path) -> None:
    with Store.open(store_dir) as store:
        live = {name: compute(store) for name, compute in ANALYSES.items()}
        spent = materialize(store)
    assert set(spent) == {"relations", *ANALYSES, "report", "metrics"} and all(s > 0 for s in spent.values())
    with Store.open(store_dir) as store:
        for name in ANALYSES:
            assert load(store, name) == live[name], name
        # the metrics endpoint's exposition, as computed from the analyzers' results on the spans themselves
        served = load_metrics(store_dir, (p.name for p in store.segments))
        assert served == exposition_text(store, live["itl"], live["prefix_cache"])
        again = materialize(store)  # nothing to do the second time
        assert again == dict.fromkeys(set(spent) - {"report", "metrics"}, 0.0)
    assert not list(store_dir.glob("derived/**/.*tmp*")), "no temporary left behind"


def _relation_rows(store: Store, name: str) -> pa.Table:
    """The relation's rows in one order, whatever order they are read in."""
    table = store.sql(f"SELECT * FROM {name}").to_arrow_table()
    keys = [c for c in ("request_id", "instance", "trace_id", "span_id", "step_index", "token_index", "role",
                        "start_ns") if c in table.column_names]
    return table.sort_by([(k, "ascending") for k in keys])


def test_attached_relations_give_the_same_rows_as_the_views(store_dir: Path) -> None:
    with Store.open(store_dir) as store:
        materialize(store, names=())
    with Store.open(store_dir) as store:
        views = {name: _relation_rows(store, name) for name in RELATIONS}
        assert attach(store)
        for name in RELATIONS:
            assert _relation_rows(store, name).equals(views[name]), name


def _batches(store_dir: Path) -> dict[Path, tuple[frozenset[str], int]]:
    """Each batch of per-segment relations: its segments, and when its files were written."""
    return {done.parent: (frozenset(json.loads((done.parent / MANIFEST).read_text())), done.stat().st_mtime_ns)
            for done in (store_dir / SEGMENT_RELATIONS_DIR).rglob("done")}


def _read_batches(store: Store, store_dir: Path) -> set[Path]:
    """The batches the snapshot's relations read (its folder's manifest)."""
    folder = store_dir / RELATIONS_DIR / snapshot_key(store, "relations")
    listed = json.loads((folder / MANIFEST).read_text())
    assert set(listed) == set(PER_SEGMENT)
    return {(store_dir / f).parent for files in listed.values() for f in files}


def _segment_names(store: Store, store_dir: Path) -> set[str]:
    return {p.relative_to(store_dir).as_posix() for p in store.segments}


def test_a_new_snapshot_expands_only_its_new_segments_step_spans(store_dir: Path) -> None:
    with Store.open(store_dir) as store:
        materialize(store, names=())
        first = _segment_names(store, store_dir)
    before = _batches(store_dir)
    partitions = {name.rsplit("/", 1)[0] for name in first}
    assert len(before) == len(partitions)  # a one-shot ingest: one batch per partition, few files to scan
    assert frozenset().union(*(names for names, _ in before.values())) == first
    ingest_paths(store_dir, [SAMPLES / "engine_regression" / "traces.jsonl.gz"])
    with Store.open(store_dir) as store:
        views = {name: _relation_rows(store, name) for name in PER_SEGMENT}
        materialize(store, names=())
        after = _batches(store_dir)
        assert {folder: after[folder] for folder in before} == before  # the earlier batches untouched …
        read = _read_batches(store, store_dir)
        assert set(before) <= read  # … and read
        new = {name for folder in read - set(before) for name in after[folder][0]}
        assert new == _segment_names(store, store_dir) - first  # only the new segments were expanded
        assert attach(store)
        for name in PER_SEGMENT:
            assert _relation_rows(store, name).equals(views[name]), name


def test_a_batch_whose_list_of_segments_is_unreadable_is_expanded_again_and_removed(store_dir: Path) -> None:
    with Store.open(store_dir) as store:
        materialize(store, names=())
    damaged = max(_batches(store_dir), key=lambda folder: len(_batches(store_dir)[folder][0]))
    (damaged / MANIFEST).write_text("{not json")
    ingest_paths(store_dir, [SAMPLES / "engine_regression" / "traces.jsonl.gz"])  # a new snapshot
    with Store.open(store_dir) as store:
        views = {name: _relation_rows(store, name) for name in PER_SEGMENT}
        materialize(store, names=())
        assert not damaged.exists() and damaged not in _read_batches(store, store_dir)
        assert attach(store)
        for name in PER_SEGMENT:
            assert _relation_rows(store, name).equals(views[name]), name


def test_a_span_stored_twice_is_expanded_once(store_dir: Path) -> None:
    segment = next(store_dir.glob("spans/**/seg-*.parquet"))
    shutil.copy(segment, segment.with_name("seg-copy.parquet"))  # every span of that segment stored twice
    with Store.open(store_dir) as store:
        assert store.duplicate_rows > 0
        views = {name: _relation_rows(store, name) for name in PER_SEGMENT}
        materialize(store, names=())
        assert attach(store)
        for name in PER_SEGMENT:  # the whole-snapshot files, from the spans view that keeps one copy
            assert _relation_rows(store, name).equals(views[name]), name
        folder = store_dir / RELATIONS_DIR / snapshot_key(store, "relations")
        assert not (folder / MANIFEST).exists() and (folder / "steps.parquet").is_file()


def test_compaction_makes_new_batches_of_what_it_merged_and_a_missing_file_is_not_read(store_dir: Path) -> None:
    from infertrace.store.compaction import compact

    ingest_paths(store_dir, [SAMPLES / "engine_regression" / "traces.jsonl.gz"])
    with Store.open(store_dir) as store:
        materialize(store, names=())
        inputs = len(store.segments)
    compact(store_dir, grace_s=0)
    with Store.open(store_dir) as store:
        assert len(store.segments) < inputs
        views = {name: _relation_rows(store, name) for name in PER_SEGMENT}
        materialize(store, names=())
        batches = _batches(store_dir)
        live = _segment_names(store, store_dir)
        assert all(names <= live for names, _ in batches.values())  # a merged-away segment's batch is removed
        read = _read_batches(store, store_dir)
        assert frozenset().union(*(batches[folder][0] for folder in read)) == live  # every segment, once
        assert sum(len(batches[folder][0]) for folder in read) == len(live)
        assert attach(store)
        for name in PER_SEGMENT:
            assert _relation_rows(store, name).equals(views[name]), name
        shutil.rmtree(next(iter(read)))
    with Store.open(store_dir) as store:
        assert not attach(store)  # the views expand the spans again rather than read what is not there
        assert store.sql("SELECT count(*) FROM steps").fetchall()[0][0] > 0


def test_a_new_segment_is_a_new_snapshot_whose_results_include_it(store_dir: Path) -> None:
    with Store.open(store_dir) as store:
        before_key = snapshot_key(store)
        before = result(store, "slo")
    ingest_paths(store_dir, [SAMPLES / "engine_regression" / "traces.jsonl.gz"])
    with Store.open(store_dir) as store:
        assert snapshot_key(store) != before_key
        assert load(store, "slo") is None  # the older snapshot's result is not this one's
        after = result(store, "slo")
        live = ANALYSES["slo"](store)
    assert after == live
    assert sum(m.gateway_requests for m in after.models) > sum(m.gateway_requests for m in before.models)


def test_an_unreadable_result_is_computed_again_and_a_foreign_class_is_refused(store_dir: Path) -> None:
    with Store.open(store_dir) as store:
        live = result(store, "prefix_cache")
        folder = store_dir / RESULTS_DIR / "prefix_cache" / snapshot_key(store)
        (folder / "result.parquet").write_bytes(b"not parquet")
        assert load(store, "prefix_cache") is None
        assert result(store, "prefix_cache") == live
        meta = {"class": "os.system"}
        pq.write_table(pa.table({"meta": [json.dumps(meta)], "result": ["{}"]}), folder / "result.parquet")
        assert load(store, "prefix_cache") is None


def test_a_read_only_store_still_gets_its_results(store_dir: Path) -> None:
    with Store.open(store_dir) as store:
        expected = ANALYSES["ttft"](store)
    os.chmod(store_dir, stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(store_dir, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root)")
        with Store.open(store_dir) as store:
            assert result(store, "ttft") == expected
    finally:
        os.chmod(store_dir, stat.S_IRWXU)


@pytest.mark.slow
def test_report_reads_materialised_results_and_says_the_same_as_when_computed_live(store_dir: Path) -> None:
    def report(*env: tuple[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "infertrace", "report", "--store", str(store_dir), "--format",
                               "json", "--fail-on", "never"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                              env={**os.environ, **dict(env)})

    live = report(("INFERTRACE_RESULTS", "live"))
    assert live.returncode == 0, live.stderr
    assert not (store_dir / RESULTS_DIR).exists()  # the live path writes nothing
    first = report()  # computes and keeps them
    assert first.returncode == 0, first.stderr
    assert {p.name for p in (store_dir / RESULTS_DIR).iterdir()} == {"slo", "itl", "rca", "prefix_cache", "ttft",
                                                                     "roofline", "report"}
    second = report()  # reads the kept report document, opening no store
    assert json.loads(second.stdout) == json.loads(first.stdout) == json.loads(live.stdout)
    assert not (store_dir / RELATIONS_DIR).exists() or (store_dir / RELATIONS_DIR).is_dir()


@pytest.mark.slow
def test_a_collector_side_materializer_writes_the_results_once_new_segments_settle(tmp_path: Path) -> None:
    from infertrace.results.background import Materializer

    store_dir = tmp_path / "store"
    materializer = Materializer(store_dir, settle_s=0.5, poll_s=0.2).start()
    try:
        ingest_paths(store_dir, [SAMPLES / "prefill_storm" / "traces.jsonl.gz"])  # what the collector writes
        deadline = time.monotonic() + 300
        while materializer.runs < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        materializer.stop()
    assert materializer.runs == 1
    with Store.open(store_dir) as store:
        assert all(load(store, name) is not None for name in ANALYSES)


@pytest.mark.slow
def test_the_collector_side_materializer_keeps_up_with_a_stream_that_never_settles(tmp_path: Path) -> None:
    """Engines under steady load export every few seconds: the segment list never stays unchanged for the
    settling time, and the snapshot is materialised once its oldest change has waited `max_wait_s`."""
    import gzip

    from infertrace.results.background import Materializer
    from infertrace.results.materialized import is_materialised, latest

    with gzip.open(SAMPLES / "prefill_storm" / "traces.jsonl.gz", "rt") as lines:
        exports = [json.loads(line) for line in lines]

    def export(i: int, n: int) -> str:
        """Every n-th span from the i-th on, as an exporter's batches would hold them."""
        return "".join(json.dumps({"resourceSpans": [{"resource": rs.get("resource", {}),
                                                      "scopeSpans": [{**ss, "spans": ss["spans"][i::n]}]}]}) + "\n"
                       for doc in exports for rs in doc["resourceSpans"] for ss in rs["scopeSpans"]
                       if ss["spans"][i::n])

    store_dir = tmp_path / "store"
    materializer = Materializer(store_dir, settle_s=30.0, poll_s=0.1, max_wait_s=1.0).start()
    deadline = time.monotonic() + 240
    try:
        for i in range(1000):  # a new segment every ≈ 0.3 s (plus the ingest): never 30 s without one
            part = tmp_path / f"export-{i}.jsonl"
            part.write_text(export(i % 200, 200))
            ingest_paths(store_dir, [part])
            time.sleep(0.3)
            if materializer.runs or time.monotonic() > deadline:
                break
    finally:
        materializer.stop()
    assert materializer.runs >= 1, "nothing materialised while segments kept arriving"
    shown = latest(store_dir)
    assert shown is not None and is_materialised(store_dir, (Path(s).name for s in shown.segments))
    with Store.open(store_dir, segments=shown.segments) as store:
        assert all(load(store, name) is not None for name in ANALYSES)


def test_one_materialisation_per_store_at_a_time(tmp_path: Path) -> None:
    import fcntl

    from infertrace.results.background import BUSY, LOCK, busy

    store_dir = tmp_path / "store"
    ingest_paths(store_dir, [SAMPLES / "prefill_storm" / "traces.jsonl.gz"])
    assert not busy(store_dir)
    (store_dir / LOCK).parent.mkdir(parents=True, exist_ok=True)
    with open(store_dir / LOCK, "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another materialisation at work
        assert busy(store_dir)
        child = subprocess.run([sys.executable, "-m", "infertrace.results.background", str(store_dir)],
                               capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert child.returncode == BUSY, child.stderr
    assert not (store_dir / RESULTS_DIR).exists()
    assert not busy(store_dir)


def test_a_store_opened_on_an_earlier_snapshot_reads_it_until_compaction_removes_its_files(tmp_path: Path) -> None:
    from infertrace.store.compaction import compact

    store_dir = tmp_path / "store"
    ingest_paths(store_dir, [SAMPLES / "prefill_storm" / "traces.jsonl.gz"])
    with Store.open(store_dir) as store:
        first = store.segment_paths()
        (first_spans,), = store.sql("SELECT count(*) FROM spans").fetchall()
    ingest_paths(store_dir, [SAMPLES / "cache_busting" / "traces.jsonl.gz"])
    with Store.open(store_dir) as store:
        (all_spans,), = store.sql("SELECT count(*) FROM spans").fetchall()
    assert all_spans > first_spans
    with Store.open(store_dir, segments=first) as pinned:
        assert pinned.segment_paths() == first
        assert pinned.sql("SELECT count(*) FROM spans").fetchall() == [(first_spans,)]
        compact(store_dir, grace_s=0)  # merges the segments and removes its inputs at once
        assert pinned.sql("SELECT count(*) FROM spans").fetchall() == [(all_spans,)]  # the current snapshot now
        assert pinned.segment_paths() != first


def test_materialize_records_the_newest_materialised_snapshot(store_dir: Path) -> None:
    from infertrace.results.materialized import LATEST, is_materialised, latest

    assert latest(store_dir) is None
    with Store.open(store_dir) as store:
        materialize(store)
        snapshot = store.segment_paths()
    shown = latest(store_dir)
    assert shown is not None and shown.segments == snapshot
    assert shown.data_until == max((store_dir / s).stat().st_mtime for s in snapshot)
    assert is_materialised(store_dir, (Path(s).name for s in snapshot))
    ingest_paths(store_dir, [SAMPLES / "cache_busting" / "traces.jsonl.gz"])  # a newer snapshot, not materialised
    assert latest(store_dir) == shown
    (store_dir / LATEST).write_text("{not json")
    assert latest(store_dir) is None  # unreadable: nothing to show, not an error


def test_a_reader_shows_the_newest_materialised_snapshot_while_a_newer_one_is_materialised(tmp_path: Path) -> None:
    from infertrace.results.background import materialising
    from infertrace.results.live import current_segments, lag, shown_snapshot
    from infertrace.results.materialized import latest
    from infertrace.store.compaction import compact

    store_dir = tmp_path / "store"
    ingest_paths(store_dir, [SAMPLES / "prefill_storm" / "traces.jsonl.gz"])
    assert shown_snapshot(store_dir) == current_segments(store_dir)  # nothing materialised: computed by the reader
    with Store.open(store_dir) as store:
        materialize(store)
    materialised = current_segments(store_dir)
    assert shown_snapshot(store_dir) == materialised and lag(store_dir, materialised) is None
    ingest_paths(store_dir, [SAMPLES / "cache_busting" / "traces.jsonl.gz"])
    with materialising(store_dir, wait=True):  # another process materialises the new snapshot
        assert shown_snapshot(store_dir) == materialised
        behind = lag(store_dir, materialised)
        recorded = latest(store_dir)
        assert recorded is not None and behind is not None
        assert behind.newer_segments == len(set(current_segments(store_dir)) - set(materialised)) > 0
        assert behind.data_until == recorded.data_until
        compact(store_dir, grace_s=0)  # its segments merged and removed at once: it cannot be read any more
        assert shown_snapshot(store_dir) == current_segments(store_dir) != materialised


def test_report_materialized_answers_from_the_newest_materialised_snapshot_and_says_how_far_behind(
        tmp_path: Path) -> None:
    from infertrace.report import render
    from infertrace.results.materialized import load_report

    def report(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "infertrace", "report", "--store", str(store_dir), "--format",
                               "json", "--fail-on", "never", *extra], capture_output=True, text=True, cwd=ROOT,
                              timeout=300)

    store_dir = tmp_path / "store"
    ingest_paths(store_dir, [SAMPLES / "prefill_storm" / "traces.jsonl.gz"])
    none_yet = report("--materialized")  # nothing materialised: the current snapshot, computed
    assert none_yet.returncode == 0 and "No materialised snapshot in this store yet" in none_yet.stderr
    with Store.open(store_dir) as store:
        materialize(store)
        earlier = load_report(store_dir, [p.name for p in store.segments])
    assert earlier is not None
    ingest_paths(store_dir, [SAMPLES / "cache_busting" / "traces.jsonl.gz"])  # a collector wrote more since
    at_once = report("--materialized")
    assert at_once.returncode == 0, at_once.stderr
    assert at_once.stdout == render(earlier, "json")
    assert "newer segment(s) are not in this report" in at_once.stderr
    filtered = report("--materialized", "--model", "llama-3-8b")
    assert filtered.returncode == 2 and "--materialized reports the whole store as materialised" in filtered.stderr


def test_ingest_waits_for_a_materialisation_under_way_and_says_so(tmp_path: Path) -> None:
    import fcntl
    import threading

    from infertrace.results.background import LOCK
    from infertrace.results.live import current_segments
    from infertrace.results.materialized import is_materialised

    store_dir = tmp_path / "store"
    (store_dir / LOCK).parent.mkdir(parents=True)
    lines: list[str] = []
    with open(store_dir / LOCK, "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process materialising this store
        ingest = subprocess.Popen([sys.executable, "-m", "infertrace", "ingest", "--store", str(store_dir),
                                   "--no-progress", str(SAMPLES / "prefill_storm" / "traces.jsonl.gz")],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert ingest.stderr is not None
        reader = threading.Thread(target=lambda: lines.extend(ingest.stderr or ()), daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while not any(line.startswith("Waiting for the materialisation") for line in lines):
            assert time.monotonic() < deadline and ingest.poll() is None, lines
            time.sleep(0.2)
        assert not (store_dir / RESULTS_DIR).exists()  # it waits: nothing computed twice at once
    assert ingest.wait(timeout=300) == 0, lines
    reader.join(timeout=30)
    assert is_materialised(store_dir, (Path(s).name for s in current_segments(store_dir)))
