"""Compaction and retention: many small segments (one per OTLP request) merged into few large ones, and old
partitions dropped.

Per partition directory, segments under `target_bytes` and older than `min_age_s` are grouped (oldest first,
up to `target_bytes` of input per group) and each group of two or more is merged into one segment, exact
duplicate rows removed. In the background (the collector) only segments of one size class merge, once there
are `fanout` of them, so a span is rewritten a few times on its way into a large segment, not at every run.
The steps, each safe to be killed after:

1. `seg-<key>.replaces` (the input names) is written atomically: fsync, rename, directory fsync;
2. the merged rows are written to a temporary, fsynced and renamed to `seg-<key>.parquet` (key: a hash of
   the input names), directory fsynced. From this rename on, readers list the output and skip the inputs
   (`segments.list_partition`): one listing shows either the inputs or the output, never both;
3. after `grace_s` (so that a reader's snapshot taken before the merge stays readable), the inputs are
   removed, then the sidecar.

A run killed at any point leaves either the inputs (step 1 done, an orphan sidecar that the next run
removes) or the output with inputs to remove: nothing is lost or counted twice, and the next run finishes
the work. One compaction runs at a time per store (an exclusive `flock` on `.compaction.lock`; it goes with
the process that held it).

Retention (`retain_s`) drops whole `date=` partitions older than that: the directory is renamed to a hidden
name first (readers stop seeing it at once), then deleted.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import duckdb
import pyarrow.parquet as pq

from infertrace.store.schema import SCHEMA
from infertrace.store.segments import (
    PARQUET_OPTIONS,
    REPLACES_SUFFIX,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    SPANS_DIR,
    fsync_dir,
    list_partition,
    notes_metadata,
    partition_dirs,
    remove_stale_temporaries,
    write_atomically,
)
from infertrace.store.store import projection, read_footer, sql_string
from infertrace.store.values import merge_counts

LOCK_NAME = ".compaction.lock"
DEFAULT_TARGET_BYTES = 128 << 20
DEFAULT_GRACE_S = 300.0
TIER_BASE_BYTES = 64 << 10
_EXPIRED_PREFIX = ".expired-"


@dataclass
class CompactionSummary:
    partitions: int = 0  # partitions that had segments merged
    inputs: int = 0  # segments merged
    outputs: int = 0  # segments written
    rows_in: int = 0
    rows_out: int = 0  # rows_in minus exact duplicates
    removed: int = 0  # superseded inputs deleted (now or from an earlier run)
    expired: list[str] = field(default_factory=list)  # partitions dropped by retention
    busy: bool = False  # another compaction held the lock: nothing done
    seconds: float = 0.0

    def paragraph(self) -> str:
        if self.busy:
            return "Another compaction is running on this store; nothing done."
        text = (f"Merged {self.inputs} segments into {self.outputs} in {self.partitions} partitions "
                f"({self.rows_in} rows, {self.rows_in - self.rows_out} exact duplicates removed); "
                f"removed {self.removed} superseded segments in {self.seconds:.1f} s.")
        if self.expired:
            text += f" Dropped {len(self.expired)} partitions older than the retention: {', '.join(self.expired)}."
        return text


@contextmanager
def compaction_lock(root: Path) -> Iterator[bool]:
    """Yields True when this process holds the store's compaction lock, False when another one does."""
    with open(root / LOCK_NAME, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def compact(root: str | Path, target_bytes: int = DEFAULT_TARGET_BYTES, min_age_s: float = 0.0,
            grace_s: float = DEFAULT_GRACE_S, retain_s: float | None = None, fanout: int | None = None,
            memory_limit: str = "512MB") -> CompactionSummary:
    """Merges small segments of every partition (all of them, or with a `fanout` only size classes that
    have that many), finishes earlier runs' removals, applies retention."""
    root = Path(root)
    started = time.perf_counter()
    summary = CompactionSummary()
    if not (root / SPANS_DIR).is_dir():
        return summary
    with compaction_lock(root) as held:
        if not held:
            summary.busy = True
            return summary
        remove_stale_temporaries(root)
        if retain_s is not None:
            summary.expired = expire(root, retain_s)
        con = duckdb.connect(":memory:")
        con.execute("SET enable_progress_bar = false")
        con.execute(f"SET memory_limit = {sql_string(memory_limit)}")
        con.execute("SET preserve_insertion_order = false")
        try:
            for folder in partition_dirs(root):
                summary.removed += finish(folder, grace_s)
                groups = _groups(folder, target_bytes, min_age_s, fanout)
                for group in groups:
                    rows_in, rows_out = merge(con, folder, group)
                    summary.inputs += len(group)
                    summary.outputs += 1
                    summary.rows_in += rows_in
                    summary.rows_out += rows_out
                    if grace_s <= 0:
                        summary.removed += finish(folder, 0.0)
                summary.partitions += bool(groups)
        finally:
            con.close()
    summary.seconds = time.perf_counter() - started
    return summary


def _tier(size: int) -> int:
    """Size class of a segment: 0 below 64 KiB, then one per factor of 4."""
    return ((size // TIER_BASE_BYTES).bit_length() + 1) // 2


def _groups(folder: Path, target_bytes: int, min_age_s: float, fanout: int | None) -> list[list[Path]]:
    """Groups of segments to merge, oldest first, each up to `target_bytes` of input. With a `fanout`
    (background compaction), only segments of the same size class merge, and only once `fanout` of them
    are there: each span is rewritten about log4(size) times instead of at every run."""
    now = time.time()
    small = []
    for path in list_partition(folder).segments:
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if stat.st_size < target_bytes and now - stat.st_mtime >= min_age_s and not isinstance(read_footer(path), str):
            small.append((stat.st_mtime, path.name, stat.st_size, path))
    small.sort()
    classes: dict[int, list[tuple[float, str, int, Path]]] = {}
    for entry in small:
        classes.setdefault(_tier(entry[2]) if fanout else 0, []).append(entry)
    groups: list[list[Path]] = []
    for members in classes.values():
        if fanout and len(members) < fanout:
            continue
        current: list[Path] = []
        size = 0
        for _, _, bytes_, path in members:
            if current and size + bytes_ > target_bytes:
                groups.append(current)
                current, size = [], 0
            current.append(path)
            size += bytes_
        groups.append(current)
    return [g for g in groups if len(g) >= 2]


def output_name(inputs: list[Path]) -> str:
    digest = hashlib.sha256("\n".join(sorted(p.name for p in inputs)).encode()).hexdigest()[:40]
    return f"{SEGMENT_PREFIX}{digest}"


def merge(con: duckdb.DuckDBPyConnection, folder: Path, inputs: list[Path]) -> tuple[int, int]:
    """Writes the distinct rows of `inputs` as one segment (steps 1 and 2); returns (rows in, rows out)."""
    name = output_name(inputs)
    output = folder / (name + SEGMENT_SUFFIX)
    sidecar = folder / (name + REPLACES_SUFFIX)
    infos = [read_footer(p) for p in inputs]
    rows_in = sum(i.rows for i in infos if not isinstance(i, str))
    if output.exists():  # renamed by a run that died before removing the inputs
        if not sidecar.exists():
            write_atomically(sidecar, lambda f: f.write(json.dumps(sorted(p.name for p in inputs)).encode()))
        return rows_in, rows_in
    write_atomically(sidecar, lambda f: f.write(json.dumps(sorted(p.name for p in inputs)).encode()))
    notes: dict[str, dict[str, int]] = {}
    by_schema: dict[str, list[Path]] = {}
    schemas = {}
    for path, info in zip(inputs, infos, strict=True):
        if isinstance(info, str):
            continue
        merge_counts(notes, info.notes)
        by_schema.setdefault(info.schema_key, []).append(path)
        schemas[info.schema_key] = info.schema
    union = " UNION ALL ".join(
        f"SELECT {projection(schemas[k])} FROM read_parquet([{', '.join(sql_string(str(p)) for p in paths)}])"
        for k, paths in by_schema.items())
    reader = con.sql(f"SELECT DISTINCT * FROM ({union}) ORDER BY start_ns").to_arrow_reader(64 * 1024)
    schema = SCHEMA.with_metadata(notes_metadata(notes))
    rows_out = 0

    def write(f: IO[bytes]) -> None:
        nonlocal rows_out
        with pq.ParquetWriter(f, schema, **PARQUET_OPTIONS) as writer:
            for batch in reader:
                writer.write_batch(batch.cast(schema))
                rows_out += batch.num_rows

    write_atomically(output, write)
    return rows_in, rows_out


def finish(folder: Path, grace_s: float) -> int:
    """Step 3 for every compaction of the partition: removes inputs older than the grace period (counted
    from the output's rename), then the sidecar once they are gone; removes orphan sidecars. Returns how
    many inputs were removed."""
    listing = list_partition(folder)
    now = time.time()
    removed = 0
    for sidecar, inputs in listing.replaces.items():
        output = sidecar.with_name(sidecar.name[: -len(REPLACES_SUFFIX)] + SEGMENT_SUFFIX)
        try:
            renamed_at = output.stat().st_mtime
        except FileNotFoundError:
            continue
        if now - renamed_at < grace_s:
            continue
        for path in inputs:
            if path.exists():
                path.unlink(missing_ok=True)
                removed += 1
        fsync_dir(folder)
        sidecar.unlink(missing_ok=True)  # after the inputs: a listing never shows inputs and output alone
    for orphan in listing.orphans:  # a run that died before its output was renamed (we hold the lock)
        orphan.unlink(missing_ok=True)
    return removed


def expire(root: Path, retain_s: float) -> list[str]:
    """Drops `date=` partitions whose whole day is older than `retain_s`; returns their names."""
    spans = root / SPANS_DIR
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=retain_s)
    dropped = []
    for d in sorted(spans.iterdir()):
        if d.name.startswith(_EXPIRED_PREFIX):
            shutil.rmtree(d, ignore_errors=True)  # a run that died mid-delete
            continue
        if not d.name.startswith("date="):
            continue
        try:
            day = dt.date.fromisoformat(d.name[len("date="):])
        except ValueError:
            continue
        day_end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
        if day_end <= cutoff:
            hidden = spans / f"{_EXPIRED_PREFIX}{d.name}-{os.getpid()}"
            os.replace(d, hidden)
            fsync_dir(spans)
            shutil.rmtree(hidden, ignore_errors=True)
            dropped.append(d.name)
    return dropped


def parse_duration(text: str) -> float:
    """`7d`, `12h`, `30m`, `45s` or plain seconds → seconds. ValueError otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    raw = text.strip().lower()
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in units else (raw, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise ValueError(f"{text!r} is not a duration like 7d, 12h, 30m or 45s") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{text!r} is not a positive, finite duration")
    return value
