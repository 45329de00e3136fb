"""Compaction, retention, unreadable segments, and `infertrace store compact / check / repair`, on real stores."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from infertrace.store.compaction import compact
from infertrace.store.health import check, repair
from infertrace.store.ingest import ingest_paths
from infertrace.store.receiver import Receiver
from infertrace.store.schema import SCHEMA
from infertrace.store.segments import list_segments
from infertrace.store.store import Store

T0 = 1_767_225_600_000_000_000


def _export(first: int, n: int, name: str = "auth", attributes: list[dict[str, Any]] | None = None,
            start: int = T0, service: str = "gw") -> bytes:
    spans = [{"traceId": f"{first + i + 1:032x}", "spanId": f"{first + i + 1:016x}", "name": name,
              "startTimeUnixNano": str(start + i), "endTimeUnixNano": str(start + i + 1000),
              "attributes": attributes or [{"key": "gen_ai.request.id", "value": {"stringValue": f"r{first + i}"}}]}
             for i in range(n)]
    return json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": service}}]}, "scopeSpans": [{"spans": spans}]}]}).encode()


def _small_segments(root: Path, requests: int, spans: int = 5) -> Receiver:
    receiver = Receiver(root)
    for r in range(requests):
        receiver.store_json(_export(r * spans, spans), "test")
    return receiver


def _rows(root: Path) -> list[tuple]:
    with Store.open(root) as store:
        return store.sql("SELECT * EXCLUDE (scope_version) FROM spans_raw ORDER BY trace_id, span_id").fetchall()


def test_compaction_merges_small_segments_without_changing_a_row(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _small_segments(root, 60)
    before = _rows(root)
    assert len(list_segments(root)) == 60
    summary = compact(root, grace_s=0)
    assert (summary.inputs, summary.outputs, summary.rows_in, summary.rows_out) == (60, 1, 300, 300)
    assert len(list_segments(root)) == 1 and len(list(root.rglob("*.parquet"))) == 1
    assert not list(root.rglob("*.replaces")) and not list(root.rglob("*.tmp"))
    assert _rows(root) == before
    assert pq.read_schema(list_segments(root)[0]).remove_metadata() == SCHEMA


def test_a_reader_keeps_its_snapshot_through_a_compaction_and_moves_on_after_the_grace_period(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _small_segments(root, 20)
    with Store.open(root) as old:
        assert len(old.segments) == 20
        compact(root, grace_s=300)  # merged, inputs kept for open snapshots
        assert len(list_segments(root)) == 1
        assert old.sql("SELECT count(*) FROM spans").fetchall() == [(100,)]  # the snapshot still reads
        assert len(old.segments) == 20
        with Store.open(root) as new:
            assert len(new.segments) == 1 and new.sql("SELECT count(*) FROM spans_raw").fetchall() == [(100,)]
        compact(root, grace_s=0)  # the grace period is over: inputs removed
        assert len(list(root.rglob("seg-*.parquet"))) == 1
        assert old.sql("SELECT count(*) FROM spans_raw").fetchall() == [(100,)]  # took a new snapshot
        assert len(old.segments) == 1


def test_exact_duplicates_are_removed_and_conflicting_content_is_kept_and_counted(tmp_path: Path) -> None:
    root = tmp_path / "store"
    receiver = Receiver(root)
    receiver.store_json(_export(0, 10), "a")
    receiver.store_json(_export(0, 10) + b" ", "retry")  # the same content again: nothing added
    receiver.store_json(_export(0, 5), "b")  # five of the same spans, batched differently: stored, read once
    other = [{"key": "gen_ai.request.id", "value": {"stringValue": "changed"}}]
    receiver.store_json(_export(0, 3, attributes=other), "c")  # same ids, different content
    receiver.store_json(_export(0, 3, attributes=other), "c again")  # that conflict retried: nothing added
    with Store.open(root) as store:
        assert store.sql("SELECT count(*) FROM spans_raw").fetchall() == [(18,)]
        assert store.sql("SELECT count(*) FROM spans").fetchall() == [(10,)]
        assert (store.duplicate_rows, store.conflicting_spans) == (8, 3)
    summary = compact(root, grace_s=0)
    assert (summary.rows_in, summary.rows_out) == (18, 13)  # the five exact duplicates removed
    with Store.open(root) as store:
        assert store.sql("SELECT count(*) FROM spans_raw").fetchall() == [(13,)]
        assert (store.duplicate_rows, store.conflicting_spans) == (3, 3)
        kept = store.sql('SELECT DISTINCT "attr.gen_ai.request.id" FROM spans_raw WHERE span_id = $s',
                         {"s": f"{1:016x}"}).fetchall()
    assert sorted(kept) == [("changed",), ("r0",)]
    assert check(root).conflicting_spans == 3


def test_notes_survive_compaction(tmp_path: Path) -> None:
    root = tmp_path / "store"
    receiver = Receiver(root)
    reasons = [{"key": "gen_ai.response.finish_reasons", "value": {"stringValue": '["stop"]'}}]
    for r in range(3):
        receiver.store_json(_export(r * 4, 4, name="llm_request", attributes=reasons), "x")
    with Store.open(root) as store:
        assert store.notes == {"converted": {"gen_ai.response.finish_reasons": 12}}
    compact(root, grace_s=0)
    with Store.open(root) as store:
        assert store.notes == {"converted": {"gen_ai.response.finish_reasons": 12}}
        assert store.sql("SELECT DISTINCT finish_reason FROM requests").fetchall() == [("stop",)]


def test_retention_drops_partitions_older_than_it_and_keeps_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "store"
    receiver = Receiver(root)
    now_ns = int(dt.datetime.now(dt.UTC).timestamp()) * 10**9
    receiver.store_json(_export(0, 4, start=now_ns - 10 * 86_400 * 10**9), "old")
    receiver.store_json(_export(10, 4, start=now_ns), "new")
    summary = compact(root, grace_s=0, retain_s=7 * 86_400)
    assert len(summary.expired) == 1
    assert len(_rows(root)) == 4
    assert len(list((root / "spans").iterdir())) == 1


def test_a_truncated_or_empty_segment_is_skipped_by_readers_reported_by_check_and_set_aside_by_repair(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    _small_segments(root, 4)
    segments = list_segments(root)
    truncated = segments[0].read_bytes()
    segments[0].write_bytes(truncated[: len(truncated) // 2])
    (segments[1].parent / "seg-empty.parquet").write_bytes(b"")
    with Store.open(root) as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall() == [(15,)]  # 3 good segments of 5 spans
        assert sorted(p.name for p, _ in store.skipped) == sorted([segments[0].name, "seg-empty.parquet"])
    health = check(root)
    assert not health.healthy and len(health.corrupt) == 2
    assert any("UNREADABLE" in line and "seg-empty.parquet" in line for line in health.lines())
    fixed = repair(root)
    assert len(fixed.set_aside) == 2 and all("corrupt" in str(p) for p in fixed.set_aside)
    assert check(root).healthy
    with Store.open(root) as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall() == [(15,)] and not store.skipped


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "infertrace.cli", *args], capture_output=True, text=True,
                          timeout=120)
    done.stderr = " ".join(done.stderr.split())
    return done


@pytest.mark.slow
def test_store_commands_compact_check_and_repair(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _small_segments(root, 12)
    done = _cli("store", "compact", "--store", str(root), "--grace", "0")
    assert done.returncode == 0 and "Merged 12 segments into 1" in done.stderr, done.stderr
    ok = _cli("store", "check", "--store", str(root))
    assert ok.returncode == 0 and ok.stdout.strip().endswith("OK")
    (list_segments(root)[0].parent / "seg-zero.parquet").write_bytes(b"")
    bad = _cli("store", "check", "--store", str(root), "--format", "json")
    assert bad.returncode == 1 and json.loads(bad.stdout)["corrupt"][0][0].endswith("seg-zero.parquet")
    fixed = _cli("store", "repair", "--store", str(root))
    assert fixed.returncode == 0 and "Set aside 1 unreadable segments" in fixed.stderr
    assert _cli("store", "check", "--store", str(root)).returncode == 0
    missing = _cli("store", "check", "--store", str(tmp_path / "absent"))
    assert missing.returncode == 2 and "no such store directory" in missing.stderr
    assert _cli("store", "compact", "--store", str(root), "--retain", "soon").returncode == 2


def test_ingest_then_compact_then_ingest_again_reads_every_span_once(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(_export(i * 5, 5).decode() + "\n" for i in range(30)))
    root = tmp_path / "store"
    ingest_paths(root, [src], block_bytes=2000)
    assert len(list_segments(root)) > 5
    compact(root, grace_s=0)
    ingest_paths(root, [src], block_bytes=2000)  # segments are gone: written again, read once
    with Store.open(root) as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall() == [(150,)]
    compact(root, grace_s=0)
    with Store.open(root) as store:
        assert store.sql("SELECT count(*) FROM spans_raw").fetchall() == [(150,)]


@pytest.mark.slow
@pytest.mark.parametrize("text", ["inf", "9999-01-01"])
def test_a_time_that_is_not_finite_or_out_of_range_exits_2_with_a_message(tmp_path: Path, text: str) -> None:
    root = tmp_path / "store"
    _small_segments(root, 1)
    for args in (["query", "--store", str(root), "rate_limited_by_tenant", "--param", f"since={text}"],
                 ["report", "--store", str(root), "--since", text]):
        done = _cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert "error:" in done.stderr and text in done.stderr and "Traceback" not in done.stderr


def test_segments_written_before_a_new_declared_key_read_it_as_null(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _small_segments(root, 1)
    segment = list_segments(root)[0]
    table = pq.read_table(segment).drop_columns(["attr.gen_ai.request.model"])
    shutil.move(segment, tmp_path / "old.parquet")
    pq.write_table(table, segment)
    with Store.open(root) as store:
        assert store.sql('SELECT count(*), count("attr.gen_ai.request.model") FROM spans').fetchall() == [(5, 0)]


def test_background_compaction_merges_a_size_class_once_it_has_four_segments(tmp_path: Path) -> None:
    root = tmp_path / "store"
    receiver = _small_segments(root, 3)
    assert compact(root, grace_s=0, fanout=4).inputs == 0  # three small segments: left as they are
    receiver.store_json(_export(1000, 5), "fourth")
    assert compact(root, grace_s=0, fanout=4).inputs == 4
    assert len(list_segments(root)) == 1 and len(_rows(root)) == 20
