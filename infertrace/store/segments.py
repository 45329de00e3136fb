"""Immutable Parquet segments, written atomically, named by their content.

Layout of a store directory:

    spans/date=YYYY-MM-DD/service=NAME/seg-<key>.parquet   raw spans (UTC date of the span start)
    quarantine/q-<key>.jsonl                                 rejected lines and spans, with file, line, reason

A segment is written to a hidden temporary file in its final directory, flushed to disk (fsync), renamed
into place (atomic on POSIX) and the directory fsynced. Readers list `*.parquet` only, so they never see a
half-written file, and never hold a lock the writer needs. The key is a hash of the span identities
(trace id, span id) in the segment: writing the same spans again (a re-ingested file, a client retrying a
request whose answer was lost) finds the segment already there and adds nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from infertrace.store.batch import Rejection
from infertrace.store.schema import resource_column

SPANS_DIR = "spans"
QUARANTINE_DIR = "quarantine"
SEGMENT_GLOB = "seg-*.parquet"
_SERVICE_COLUMN = resource_column("service.name")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_NS_PER_DAY = 86_400 * 10**9


def _partition_name(service: str | None) -> str:
    if not service:
        return "service=_unknown"
    return "service=" + _UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", service)[:100]


def content_key(table: pa.Table) -> str:
    """Hash of the sorted span identities in the table."""
    keys = pc.binary_join_element_wise(table["trace_id"], table["span_id"], "")
    ordered = pc.sort_indices(keys)
    digest = hashlib.sha256()
    for chunk in keys.take(ordered).chunks:
        digest.update("\n".join(chunk.to_pylist()).encode())
    return digest.hexdigest()[:40]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, write: object) -> None:
    """Calls `write(file_object)` on a temporary file beside `path`, fsyncs, renames into place."""
    # Per process and thread: two collector threads storing the same spans must not share a temporary.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        write(f)  # type: ignore[operator]
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def partitions(table: pa.Table) -> Iterable[tuple[str, pa.Table]]:
    """Splits a batch into (relative directory, rows) by UTC start date and service name."""
    days = np.asarray(table["start_ns"].to_numpy()) // _NS_PER_DAY
    services = table[_SERVICE_COLUMN].to_pylist()
    groups: dict[tuple[int, str | None], list[int]] = {}
    for i, (day, service) in enumerate(zip(days.tolist(), services, strict=True)):
        groups.setdefault((day, service), []).append(i)
    for (day, service), rows in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1] or "")):
        date = dt.date(1970, 1, 1) + dt.timedelta(days=day)
        part = table if len(rows) == table.num_rows else table.take(pa.array(rows, type=pa.int64()))
        yield f"{SPANS_DIR}/date={date.isoformat()}/{_partition_name(service)}", part


def write_segments(root: Path, table: pa.Table) -> tuple[list[Path], int]:
    """Writes a batch as one segment per partition. Returns (segment paths, spans newly written): spans of
    a segment that already existed count as not new."""
    written, new = [], 0
    for directory, part in partitions(table):
        folder = root / directory
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"seg-{content_key(part)}.parquet"
        written.append(path)
        if path.exists():
            continue
        write_atomically(path, lambda f, part=part: pq.write_table(part, f, compression="zstd"))
        new += part.num_rows
    return written, new


def write_quarantine(root: Path, rejections: list[Rejection]) -> Path | None:
    """Keeps rejected records (file, line, reason, the record itself) as one JSON-lines file."""
    if not rejections:
        return None
    text = "".join(json.dumps({"source": r.source, "line": r.line, "reason": r.reason, "record": r.record},
                              ) + "\n" for r in rejections).encode()  # ASCII: no Unicode line breaks
    folder = root / QUARANTINE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"q-{hashlib.sha256(text).hexdigest()[:40]}.jsonl"
    if not path.exists():
        write_atomically(path, lambda f: f.write(text))
    return path


def remove_stale_temporaries(root: Path) -> int:
    """Deletes temporary files left by a writer that died mid-write (never visible to readers)."""
    removed = 0
    for tmp in [*root.glob(f"{SPANS_DIR}/*/*/.*.tmp"), *root.glob(f"{QUARANTINE_DIR}/.*.tmp")]:
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


def list_segments(root: Path) -> list[Path]:
    spans = root / SPANS_DIR
    return sorted(spans.glob(f"*/*/{SEGMENT_GLOB}")) if spans.exists() else []
