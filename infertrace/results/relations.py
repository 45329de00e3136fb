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

`steps` and `step_membership` are functions of each step span alone, so they are written once per batch of
segments and a snapshot reads the union of its batches' files (listed in the snapshot's `segments.json`):

    DIR/derived/segment_relations/<version>/<batch>/<relation>.parquet    (<version>: the relations' SQL)
    DIR/derived/segment_relations/<version>/<batch>/segments.json        the batch's segments

A batch is what one materialisation found new in one partition (a segment of `OWN_BATCH_BYTES` or more is a batch
of its own); a later snapshot reuses every batch whose segments it all holds and expands only the rest (a
collector's new segments, what compaction merged, and the rest of a batch an analysis window has partly left: cut
finer, per stretch of the window, such batches cost as much in files opened by every scan as they saved in
re-expansion; BENCHMARKS.md, "An analysis window"). A one-shot ingest makes one batch per partition: as few files
as the whole-snapshot form, since every scan of an analysis opens each file again. When a span is stored twice
(the `spans` view keeps one copy), a union would count it twice: such a snapshot writes whole-snapshot files, as
every relation has. A batch holding a segment the snapshot does not (a window has left it) is removed once no kept
snapshot's relations read it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from infertrace.results.materialized import KEEP, code_version, is_live, segments_key, snapshot_key

if TYPE_CHECKING:
    from infertrace.store.store import Store

log = logging.getLogger(__name__)

RELATIONS_DIR = Path("derived") / "relations"
SEGMENT_RELATIONS_DIR = Path("derived") / "segment_relations"
# The relations that are functions of each span alone (row expansions of `engine_step` spans): written per batch.
PER_SEGMENT = ("steps", "step_membership")
# In a snapshot's folder: the batch files its PER_SEGMENT relations read; in a batch's: its segments.
MANIFEST = "segments.json"
# A batch is reused only while the snapshot holds all its segments, and compaction merges small segments: a large
# one (a merge's output) is a batch of its own, so that merging its small batch-mates does not expand it again.
OWN_BATCH_BYTES = 16 << 20
# Parquet 2's encodings (delta for the integer columns, byte-stream-split, …): on the 4-model hour the steps file
# is a fifth smaller than with Parquet 1's and costs a fifth less CPU to write and to read back.
WRITE_OPTIONS = "FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION v2"


def _relations() -> tuple[str, ...]:
    """The relations written, in dependency order: every derived relation but `tokens` (see above)."""
    from infertrace.store.store import RELATIONS

    return tuple(name for name in RELATIONS if name != "tokens")


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _batches(store: Store, version: str) -> dict[Path, frozenset[str] | None]:
    """The batches written with this code version: folder -> its segments (relative paths; None when its list
    cannot be read: such a batch is never read, and removed)."""
    batches: dict[Path, frozenset[str] | None] = {}
    for done in (store.root / SEGMENT_RELATIONS_DIR / version).glob("*/done"):
        if done.parent.name.startswith("."):  # another process's batch being written
            continue
        try:
            batches[done.parent] = frozenset(json.loads((done.parent / MANIFEST).read_text()))
        except (OSError, ValueError, TypeError) as e:
            log.warning("cannot read %s: %s", done.parent / MANIFEST, e)
            batches[done.parent] = None
    return batches


def _new_batches(store: Store, names: list[str]) -> list[list[str]]:
    """The segments (relative paths) a materialisation found without a batch, grouped into new batches: one per
    partition, a segment of OWN_BATCH_BYTES or more alone."""
    groups: dict[str, list[str]] = {}
    alone = []
    for name in names:
        if (store.root / name).stat().st_size >= OWN_BATCH_BYTES:
            alone.append([name])
        else:
            groups.setdefault(name.rsplit("/", 1)[0], []).append(name)
    return [*groups.values(), *alone]


def _write_batch(store: Store, names: list[str], version: str) -> Path:
    """Writes the PER_SEGMENT relations of these segments' spans (relative paths) as one batch (atomically: a
    batch another process wrote meanwhile is kept); returns its folder."""
    from infertrace.store.store import read_footer, relation_sql, segments_sql

    folder = store.root / SEGMENT_RELATIONS_DIR / version / segments_key(names, "relations")
    if (folder / "done").is_file():
        return folder
    footers = []
    for segment in (store.root / name for name in names):
        info = read_footer(segment)
        if isinstance(info, str):  # removed or damaged since the snapshot was taken
            raise OSError(f"cannot read segment {segment}: {info}")
        footers.append((segment, info))
    folder.parent.mkdir(parents=True, exist_ok=True)
    temporary = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    source = segments_sql(footers)
    for name in PER_SEGMENT:  # the relation's own SQL, its `spans` these segments'
        store.con.execute(f"COPY (WITH spans AS ({source}) SELECT * FROM ({relation_sql(name)}\n)) "
                          f"TO {_literal(temporary / f'{name}.parquet')} ({WRITE_OPTIONS})")
    (temporary / MANIFEST).write_text(json.dumps(names))
    (temporary / "done").write_text("")
    try:
        temporary.rename(folder)
    except OSError:  # written meanwhile by another process
        shutil.rmtree(temporary, ignore_errors=True)
    return folder


def _segment_batches(store: Store, version: str) -> list[Path]:
    """The batches the snapshot's PER_SEGMENT relations read: every written batch whose segments the snapshot
    all holds (disjoint ones, the largest first), and new batches of the segments none of them covers."""
    held = store.segment_paths()  # sorted
    chosen: list[Path] = []
    covered: set[str] = set()
    readable = {folder: names for folder, names in _batches(store, version).items() if names is not None}
    for folder, names in sorted(readable.items(), key=lambda b: (-len(b[1]), b[0].name)):
        if names.issubset(held) and not covered & names:
            chosen.append(folder)
            covered |= names
    todo = [name for name in held if name not in covered]
    chosen += [_write_batch(store, group, version) for group in _new_batches(store, todo)]
    log.info("expanded the step spans of %d of the snapshot's %d segments", len(todo), len(held))
    return chosen


def _prune_segment_relations(store: Store, version: str) -> None:
    """Removes the batches of other code versions, those holding a segment no longer in the store (compacted
    away or removed by retention), those whose list of segments cannot be read, and those holding a segment this
    snapshot does not (an analysis window has left it) that no kept snapshot's relations read."""
    parent = store.root / SEGMENT_RELATIONS_DIR
    for other in parent.iterdir():
        if other.is_dir() and other.name != version:
            shutil.rmtree(other, ignore_errors=True)
    held = set(store.segment_paths())
    read = _read_batches(store)
    for folder, names in _batches(store, version).items():
        if names is None or not all((store.root / name).exists() for name in names) or \
                (not names <= held and folder.name not in read):
            shutil.rmtree(folder, ignore_errors=True)


def _read_batches(store: Store) -> set[str]:
    """The batch folders' names that the kept snapshots' relations read (their manifests)."""
    read: set[str] = set()
    for manifest in (store.root / RELATIONS_DIR).glob(f"*/{MANIFEST}"):
        try:
            listed = json.loads(manifest.read_text())
            read |= {Path(f).parent.name for files in listed.values() for f in files}
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.warning("cannot read %s: %s", manifest, e)
    return read


def _read_union(store: Store, name: str, files: list[str]) -> None:
    """Points view `name` at the union of the batches' `files` (relative to the store)."""
    listed = ", ".join(_literal(store.root / f) for f in files)
    store.con.execute(f"CREATE OR REPLACE VIEW {name} AS "
                      f"SELECT * FROM read_parquet([{listed}], hive_partitioning = false)")


def materialize_relations(store: Store) -> float:
    """Writes the snapshot's derived relations (all but `tokens`) as Parquet (unless already there); returns
    seconds. Each relation is computed once: those that read it (`token_runs` reads `step_membership`, `requests`
    reads `request_legs` and `component_calls`) read its written file instead of expanding the spans again.
    `steps` and `step_membership` are read from the batches of segments written before, and written for the
    segments no batch covers (see above)."""
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
    if not store.duplicate_rows:  # else the union of the batches' rows would hold a span's rows twice
        folders = _segment_batches(store, version)
        per_segment = {name: [(f / f"{name}.parquet").relative_to(store.root).as_posix() for f in folders]
                       for name in PER_SEGMENT}
        (temporary / MANIFEST).write_text(json.dumps(per_segment))
    views = dict(store.con.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND view_name IN "
        "(SELECT unnest($names))", {"names": list(_relations())}).fetchall())
    try:
        for name in _relations():  # in dependency order: each later relation reads the files written before it
            if name in per_segment:
                _read_union(store, name, per_segment[name])
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
            _read_union(store, name, per_segment[name])
        else:
            path = _literal(folder / f"{name}.parquet")
            store.con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet({path})")
    return True


def open_reader(spec: str | Path, since_ns: int | None = None, until_ns: int | None = None,
                window_s: float | None = None) -> Store:
    """`open_store`, with a store directory's materialised relations attached when its snapshot (of the analysis
    window, with `window_s`) has them: a runbook query, a replay's workload or an export then reads the written
    files instead of expanding every span again (a store whose snapshot is not materialised, or a ClickHouse one,
    reads its views as before)."""
    from infertrace.store.clickhouse.connection import is_clickhouse_url
    from infertrace.store.store import open_store

    store = open_store(spec, since_ns, until_ns, window_s)
    if not is_clickhouse_url(spec):
        attach(store)
    return store
