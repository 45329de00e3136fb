"""Immutable Parquet segments, written atomically, named by their content.

Layout of a store directory:

    spans/date=YYYY-MM-DD/service=NAME/seg-<key>.parquet   raw spans (UTC date of the span start)
    spans/date=YYYY-MM-DD/service=NAME/seg-<key>.replaces  a compacted segment's inputs (`compaction`)
    quarantine/q-<key>.jsonl                                 rejected lines and spans, with file, line, reason
    corrupt/…                                                segments `infertrace store repair` set aside

A segment is written to a hidden temporary file in its final directory, flushed to disk (fsync), renamed
into place (atomic on POSIX) and the directory fsynced; a new directory is fsynced in its parent. If any
step fails (a full disk), the temporary is removed and the error raised: nothing half-written stays. Readers
list `seg-*.parquet` only, so they never see a half-written file, and never hold a lock a writer needs.

The key hashes the span identities (trace id, span id) of the segment: the same request retried, or the
same file ingested again, finds a segment of that name holding exactly its rows and adds nothing. Other
content under the same ids (a conflict) is written beside it, under a key that adds a digest of the
content: kept (and counted by readers), never dropped. Only a name collision costs a read of the segment.
"""

from __future__ import annotations

import datetime as dt
import errno
import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from infertrace.store.batch import Rejection
from infertrace.store.schema import RESOURCE_MAP, SCHEMA, resource_column
from infertrace.store.values import Notes

SPANS_DIR = "spans"
QUARANTINE_DIR = "quarantine"
CORRUPT_DIR = "corrupt"
SEGMENT_PREFIX = "seg-"
SEGMENT_SUFFIX = ".parquet"
REPLACES_SUFFIX = ".replaces"
NOTES_KEY = b"infertrace.notes"
_SERVICE_COLUMN = resource_column("service.name")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_NS_PER_DAY = 86_400 * 10**9
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EMFILE, errno.ENFILE})


def _partition_name(service: str | None) -> str:
    if not service:
        return "service=_unknown"
    return "service=" + _UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", service)[:100]


def content_key(table: pa.Table, salt: bytes = b"") -> str:
    """Hash of the sorted span identities in the table (and of `salt`, for a conflicting version)."""
    keys = pc.binary_join_element_wise(table["trace_id"], table["span_id"], "")
    ordered = pc.sort_indices(keys)
    digest = hashlib.sha256(salt)
    for chunk in keys.take(ordered).chunks:  # each chunk's keys joined by newlines, joined in Arrow
        if len(chunk):
            one_list = pa.ListArray.from_arrays(pa.array([0, len(chunk)], pa.int32()), chunk)
            digest.update(pc.binary_join(one_list, "\n")[0].as_buffer())
    return digest.hexdigest()[:40]


def content_digest(table: pa.Table) -> bytes:
    """A hash of every value of the table (its Arrow IPC stream)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema.remove_metadata()) as writer:
        writer.write_table(table.replace_schema_metadata(None).combine_chunks())
    return hashlib.sha256(sink.getvalue()).digest()


def holds(path: Path, table: pa.Table) -> bool:
    """Whether the segment at `path` exists and holds exactly these rows."""
    if not path.exists():
        return False
    try:
        existing = pq.read_table(path)
    except (OSError, pa.ArrowException, ValueError):
        return False  # unreadable: write the rows again beside it
    return existing.schema.remove_metadata() == table.schema.remove_metadata() and existing.equals(table)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: Path) -> None:
    """Creates `path` and any missing parents, fsyncing each new directory's parent (a crash cannot lose
    a directory whose files were acknowledged)."""
    if path.is_dir():
        return
    ensure_dir(path.parent)
    try:
        path.mkdir()
    except FileExistsError:
        return
    fsync_dir(path.parent)


def temporary_name(path: Path) -> Path:
    # Per process and thread: two writer threads storing the same content must not share a temporary.
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")


def write_atomically(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Calls `write(file_object)` on a temporary file beside `path`, fsyncs, renames into place, fsyncs the
    directory. On any failure the temporary is removed and the error raised."""
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def partitions(table: pa.Table) -> Iterable[tuple[str, np.ndarray, pa.Table]]:
    """Splits a batch into (relative directory, row indices, rows) by UTC start date and service name."""
    days = np.asarray(table["start_ns"].to_numpy()) // _NS_PER_DAY
    services = table[_SERVICE_COLUMN].combine_chunks().dictionary_encode()
    names = services.dictionary.to_pylist()
    codes = pc.fill_null(services.indices, len(names)).to_numpy().astype(np.int64)  # null: no service
    first_day = int(days.min()) if len(days) else 0
    group = (days - first_day) * (len(names) + 1) + codes
    keys, inverse = np.unique(group, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=len(keys)))])
    run_starts = np.flatnonzero(np.diff(inverse, prepend=-1))  # rows where a run of one partition starts
    run_ends = np.append(run_starts[1:], len(inverse))
    runs_of = np.argsort(inverse[run_starts], kind="stable")
    run_bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse[run_starts], minlength=len(keys)))])
    groups = []
    for i, key in enumerate(keys.tolist()):
        day, code = divmod(key, len(names) + 1)
        runs = runs_of[run_bounds[i]:run_bounds[i + 1]]
        groups.append((first_day + day, names[code] if code < len(names) else None, order[bounds[i]:bounds[i + 1]],
                       list(zip(run_starts[runs].tolist(), run_ends[runs].tolist(), strict=True))))
    for day, service, rows, runs in sorted(groups, key=lambda g: (g[0], g[1] or "")):
        date = dt.date(1970, 1, 1) + dt.timedelta(days=day)
        yield f"{SPANS_DIR}/date={date.isoformat()}/{_partition_name(service)}", rows, _rows(table, rows, runs)


_MAX_RUNS = 64  # a partition in more runs of rows than this is copied out with one `take`


def _rows(table: pa.Table, rows: np.ndarray, runs: list[tuple[int, int]]) -> pa.Table:
    """The table's `rows` (ascending), which lie in `runs` [start, end): slices of the table, not copies,
    when they are few (a file's lines usually hold one service's spans each)."""
    if len(rows) == table.num_rows:
        return table
    if len(runs) > _MAX_RUNS:
        return table.take(pa.array(rows))
    return pa.concat_tables([table.slice(start, end - start) for start, end in runs])


def notes_metadata(counts: dict[str, dict[str, int]]) -> dict[bytes, bytes]:
    return {NOTES_KEY: json.dumps(counts, sort_keys=True).encode()} if counts else {}


# Dictionary encoding for the flat columns other than ids and times: those are unique per span, where a
# dictionary only costs time (measured: ≈ 25% less writing time, ≈ 14% smaller segments of engine spans).
_UNIQUE_PER_SPAN = frozenset({"trace_id", "span_id", "parent_span_id", "start_ns", "end_ns"})
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "use_dictionary": [
    f.name for f in SCHEMA if f.name not in _UNIQUE_PER_SPAN and not pa.types.is_nested(f.type)]}


def write_parquet(table: pa.Table, f: IO[bytes]) -> None:
    pq.write_table(table, f, **PARQUET_OPTIONS)


@dataclass
class Written:
    segments: list[Path]
    spans_new: int  # spans in segments that did not exist before


def write_segments(root: Path, table: pa.Table, notes: Notes | None = None) -> Written:
    """Writes a batch as one segment per partition, each with its notes in the Parquet metadata. A segment
    that already holds exactly these rows is not written again (its spans count as not new); one that holds
    the same spans with other content is kept, and this content written beside it under a key that adds its
    digest (a conflict: both are stored, and readers count it)."""
    written, new = [], 0
    for directory, rows, part in partitions(table):
        folder = root / directory
        ensure_dir(folder)
        path = folder / f"{SEGMENT_PREFIX}{content_key(part)}{SEGMENT_SUFFIX}"
        if path.exists():
            if holds(path, part):
                written.append(path)
                continue
            path = folder / f"{SEGMENT_PREFIX}{content_key(part, content_digest(part))}{SEGMENT_SUFFIX}"
            if holds(path, part):
                written.append(path)
                continue
        counts = notes.counts(rows) if notes is not None and len(notes) else {}
        if counts:
            part = part.replace_schema_metadata(notes_metadata(counts))
        write_atomically(path, lambda f, part=part: write_parquet(part, f))
        written.append(path)
        new += part.num_rows
    return Written(written, new)


def write_quarantine(root: Path, rejections: list[Rejection]) -> Path | None:
    """Keeps rejected records (file, line, reason, the record itself) as one JSON-lines file."""
    if not rejections:
        return None
    text = "".join(json.dumps({"source": r.source, "line": r.line, "reason": r.reason, "record": r.record},
                              ) + "\n" for r in rejections).encode()  # ASCII: no Unicode line breaks
    folder = root / QUARANTINE_DIR
    ensure_dir(folder)
    path = folder / f"q-{hashlib.sha256(text).hexdigest()[:40]}.jsonl"
    if not path.exists():
        write_atomically(path, lambda f: f.write(text))
    return path


def temporaries(root: Path) -> Iterator[Path]:
    yield from root.glob(f"{SPANS_DIR}/*/*/.*.tmp")
    yield from root.glob(f"{QUARANTINE_DIR}/.*.tmp")


def remove_stale_temporaries(root: Path) -> int:
    """Deletes temporary files left by a writer that died mid-write (never visible to readers)."""
    removed = 0
    for tmp in temporaries(root):
        pid = tmp.name.rsplit(".", 2)[-2].split("-")[0]
        if pid.isdigit() and _alive(int(pid)):
            continue
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ------------------------------------------------------------------------------------------- listing
def partition_dirs(root: Path) -> list[Path]:
    """Every `spans/date=…/service=…` directory (not the hidden ones retention is removing)."""
    spans = root / SPANS_DIR
    if not spans.is_dir():
        return []
    return sorted(p for d in spans.iterdir() if d.is_dir() and d.name.startswith("date=")
                  for p in d.iterdir() if p.is_dir() and p.name.startswith("service="))


@dataclass
class Listing:
    """One directory listing of a partition: live segments, and compactions (output → its inputs)."""

    segments: list[Path]
    superseded: list[Path]  # inputs of a compacted segment, not yet removed: readers skip them
    replaces: dict[Path, list[Path]]  # sidecar → inputs, for sidecars whose segment exists
    orphans: list[Path]  # sidecars whose segment was never renamed into place (a compaction that died)


def read_replaces(sidecar: Path) -> list[str]:
    try:
        names = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def list_partition(folder: Path) -> Listing:
    # One readdir: a sidecar exists whenever both a compacted segment and its inputs do (it is written
    # before the segment and removed after the inputs), so one listing never shows both without it.
    names = {e.name for e in os.scandir(folder)}
    parquet = {n for n in names if n.startswith(SEGMENT_PREFIX) and n.endswith(SEGMENT_SUFFIX)}
    superseded: set[str] = set()
    replaces: dict[Path, list[Path]] = {}
    orphans = []
    for name in sorted(n for n in names if n.endswith(REPLACES_SUFFIX)):
        output = name[: -len(REPLACES_SUFFIX)] + SEGMENT_SUFFIX
        sidecar = folder / name
        if output not in parquet:
            orphans.append(sidecar)
            continue
        inputs = [n for n in read_replaces(sidecar) if n != output]
        replaces[sidecar] = [folder / n for n in inputs]
        superseded.update(n for n in inputs if n in parquet)
    return Listing([folder / n for n in sorted(parquet - superseded)], [folder / n for n in sorted(superseded)],
                   replaces, orphans)


def list_segments(root: Path) -> list[Path]:
    """The live segments of a store: every `seg-*.parquet` not superseded by a compacted segment."""
    return [p for folder in partition_dirs(root) for p in list_partition(folder).segments]


def is_storage_error(error: BaseException) -> bool:
    """An error of the disk rather than of the data: the write may succeed later (503 + Retry-After)."""
    return isinstance(error, OSError) and (error.errno in STORAGE_ERRNOS or error.errno is None)


def keep_resource(table: pa.Table, notes: Notes, resource: Iterable[tuple[str, str]]) -> tuple[pa.Table, Notes, int]:
    """The spans of `table` whose resource has every (key, value) of `resource` (values compared as text: a declared
    attribute's column cast, any other from the resource map), their notes renumbered with them, and how many were
    left out: `ingest --resource` and `collect --resource` keep one deployment environment of a mixed stream."""
    keep = pa.array(np.ones(table.num_rows, dtype=bool))
    for key, value in resource:
        column = resource_column(key)
        values = (pc.cast(table.column(column), pa.string()) if column in table.column_names else
                  pc.map_lookup(table.column(RESOURCE_MAP), key, "first"))
        keep = pc.and_(keep, pc.fill_null(pc.equal(values, value), False))
    kept = np.flatnonzero(keep.to_numpy(zero_copy_only=False))
    return table.take(kept), notes.take(kept), table.num_rows - len(kept)

