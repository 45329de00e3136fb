"""The store's derived relations (`request_legs`, `steps`, `step_membership`, `token_runs`, `component_calls`,
`requests`) materialised as Parquet for a snapshot, so readers scan files instead of expanding every step span
again:

    DIR/derived/relations/<key>/<relation>.parquet      (<key>: `snapshot_key`, as for results)

`attach(store)` points the store connection's relation views at those files when they exist for its snapshot
(the same rows the SQL views give: written from them); a store without them keeps its views.

`tokens` (a row per generated token: 16.8 M on an hour of four busy models) is not written: its view expands the
written `token_runs` over the written `steps`, which is cheap for what readers ask of it (one request's tokens,
one engine's), and every aggregate over all tokens (the SLO's ITL percentiles, the ITL distribution, token
counts, the ITL heatmap) reads the runs instead.

`steps` and `step_membership` are functions of each step span alone, so they are written once per segment and
a snapshot reads the union of its segments' files (listed in the snapshot's `segments.json`):

    DIR/derived/segment_relations/<version>/<segment path>/<relation>.parquet   (<version>: the relations' SQL)

A later snapshot (a collector's next segments) expands only its new segments' step spans. When a span is stored
twice (the `spans` view keeps one copy), the union would count it twice: such a snapshot writes whole-snapshot
files, as every relation has.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from infertrace.results.materialized import KEEP, code_version, is_live, snapshot_key

if TYPE_CHECKING:
    import duckdb

    from infertrace.store.store import Store

log = logging.getLogger(__name__)

RELATIONS_DIR = Path("derived") / "relations"
SEGMENT_RELATIONS_DIR = Path("derived") / "segment_relations"
# The relations that are functions of each span alone (row expansions of `engine_step` spans): written per segment.
PER_SEGMENT = ("steps", "step_membership")
MANIFEST = "segments.json"  # in a snapshot's folder: the per-segment files its PER_SEGMENT relations read
# Parquet 2's encodings (delta for the integer columns, byte-stream-split, …): on the 4-model hour the steps file
# is a fifth smaller than with Parquet 1's and costs a fifth less CPU to write and to read back.
WRITE_OPTIONS = "FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION v2"


def _relations() -> tuple[str, ...]:
    """The relations written, in dependency order: every derived relation but `tokens` (see above)."""
    from infertrace.store.store import RELATIONS

    return tuple(name for name in RELATIONS if name != "tokens")


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _segment_folder(store: Store, segment: Path, version: str) -> Path:
    return store.root / SEGMENT_RELATIONS_DIR / version / segment.relative_to(store.root).with_suffix("")


def _write_segment_relations(con: duckdb.DuckDBPyConnection, segment: Path, folder: Path) -> None:
    """Writes the PER_SEGMENT relations of one segment's spans into `folder` (atomically; one another process
    wrote meanwhile is kept)."""
    from infertrace.store.store import projection, read_footer, relation_sql

    info = read_footer(segment)
    if isinstance(info, str):  # removed or damaged since the snapshot was taken
        raise OSError(f"cannot read segment {segment}: {info}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    temporary = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    source = f"SELECT {projection(info.schema)} FROM read_parquet({_literal(segment)}, hive_partitioning = false)"
    for name in PER_SEGMENT:  # the relation's own SQL, its `spans` this segment's
        con.execute(f"COPY (WITH spans AS ({source}) SELECT * FROM ({relation_sql(name)}\n)) "
                    f"TO {_literal(temporary / f'{name}.parquet')} ({WRITE_OPTIONS})")
    (temporary / "done").write_text("")
    try:
        temporary.rename(folder)
    except OSError:  # written meanwhile by another process
        shutil.rmtree(temporary, ignore_errors=True)


def _write_segments_relations(store: Store, todo: list[tuple[Path, Path]]) -> None:
    """`_write_segment_relations` for each (segment, folder), as many at once as the connection has threads: a
    segment is often too small for one query to keep them busy (a collector writes one per export)."""
    workers = min(len(todo), int(store.con.execute("SELECT current_setting('threads')").fetchone()[0]))

    def write(item: tuple[Path, Path]) -> None:
        with store.con.cursor() as con:
            _write_segment_relations(con, *item)

    with ThreadPoolExecutor(max(1, workers)) as pool:
        list(pool.map(write, todo))


def _prune_segment_relations(store: Store, version: str) -> None:
    """Removes the per-segment files of other code versions and of segments no longer in the store (compacted
    away or removed by retention)."""
    parent = store.root / SEGMENT_RELATIONS_DIR
    for other in parent.iterdir():
        if other.is_dir() and other.name != version:
            shutil.rmtree(other, ignore_errors=True)
    current = parent / version
    for done in list(current.rglob("done")):
        folder = done.parent
        segment = store.root / folder.relative_to(current).with_suffix(".parquet")
        if not folder.name.startswith(".") and not segment.exists():
            shutil.rmtree(folder, ignore_errors=True)


def _union(root: Path, files: list[str]) -> str:
    listed = ", ".join(_literal(root / f) for f in files)
    return f"SELECT * FROM read_parquet([{listed}], hive_partitioning = false)"


def materialize_relations(store: Store) -> float:
    """Writes the snapshot's derived relations (all but `tokens`) as Parquet (unless already there); returns
    seconds. Each relation is computed once: those that read it (`token_runs` reads `step_membership`, `requests`
    reads `request_legs` and `component_calls`) read its written file instead of expanding the spans again.
    `steps` and `step_membership` are written per segment, for the segments that have none yet (see above)."""
    if not store.segments:
        return 0.0
    parent = store.root / RELATIONS_DIR
    final = parent / snapshot_key(store, "relations")
    if (final / "done").is_file():
        return 0.0
    started = time.perf_counter()
    parent.mkdir(parents=True, exist_ok=True)
    temporary = parent / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    per_segment: dict[str, list[str]] = {}
    version = code_version("relations")
    if not store.duplicate_rows:  # else the union of the segments' rows would hold a span's rows twice
        folders = [_segment_folder(store, segment, version) for segment in store.segments]
        todo = [(segment, folder) for segment, folder in zip(store.segments, folders, strict=True)
                if not (folder / "done").is_file()]
        _write_segments_relations(store, todo)
        log.info("expanded the step spans of %d of the snapshot's %d segments", len(todo), len(folders))
        per_segment = {name: [(f / f"{name}.parquet").relative_to(store.root).as_posix() for f in folders]
                       for name in PER_SEGMENT}
        (temporary / MANIFEST).write_text(json.dumps(per_segment))
    views = dict(store.con.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND view_name IN "
        "(SELECT unnest($names))", {"names": list(_relations())}).fetchall())
    try:
        for name in _relations():  # in dependency order: each later relation reads the files written before it
            if name in per_segment:
                store.con.execute(f"CREATE OR REPLACE VIEW {name} AS {_union(store.root, per_segment[name])}")
                continue
            path = _literal(temporary / f"{name}.parquet")
            store.con.execute(f"COPY (SELECT * FROM {name}) TO {path} ({WRITE_OPTIONS})")
            store.con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet({path})")
    finally:  # the views as they were (`attach` points them at the files once they are in place)
        for sql in views.values():
            store.con.execute(sql.replace("CREATE VIEW", "CREATE OR REPLACE VIEW", 1))
    (temporary / "done").write_text("")
    try:
        temporary.rename(final)
    except OSError:  # written meanwhile by another process
        shutil.rmtree(temporary, ignore_errors=True)
    for old in sorted((p for p in parent.iterdir() if p.is_dir() and not p.name.startswith(".")),
                      key=lambda p: p.stat().st_mtime, reverse=True)[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
    if per_segment:
        _prune_segment_relations(store, version)
    seconds = time.perf_counter() - started
    log.info("materialised the relations in %.2f s", seconds)
    return seconds


def attach(store: Store) -> bool:
    """Makes the store's relation views read the snapshot's materialised relations; False when there are none
    (or INFERTRACE_RESULTS=live, or some of the per-segment files it lists are gone)."""
    if is_live() or not store.segments:
        return False
    folder = store.root / RELATIONS_DIR / snapshot_key(store, "relations")
    if not (folder / "done").is_file():
        return False
    per_segment: dict[str, list[str]] = {}
    if (folder / MANIFEST).is_file():
        try:
            per_segment = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            log.warning("cannot read %s: %s", folder / MANIFEST, e)
            return False
        if not all((store.root / f).is_file() for files in per_segment.values() for f in files):
            return False
    for name in _relations():
        if name in per_segment:
            store.con.execute(f"CREATE OR REPLACE VIEW {name} AS {_union(store.root, per_segment[name])}")
        else:
            path = _literal(folder / f"{name}.parquet")
            store.con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet({path})")
    return True
