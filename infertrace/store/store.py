"""A store directory opened for queries: DuckDB views over the Parquet segments and the derived relations.

    store = Store.open("traces/")
    store.sql("SELECT model, quantile_cont(ttft_ns, 0.99) FROM requests GROUP BY model").fetchall()
    store.relation("tokens").df()

The connection is in memory and private to the reader: it holds no lock on the store, so any number of
readers work while a collector, `infertrace ingest` or a compaction writes. A reader sees the segments that
existed when it opened (or last called `refresh()`): one consistent snapshot for all its queries. Compaction
keeps the segments it merged for a grace period, so a snapshot stays readable; a query on a snapshot whose
files are gone takes a new snapshot first.

A segment that cannot be read (truncated, empty, not Parquet) is reported in `skipped` and left out: one bad
file never makes the store unreadable. `infertrace store check` and `repair` deal with it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from infertrace.store import not_a_store
from infertrace.store.schema import SCHEMA
from infertrace.store.segments import NOTES_KEY, list_segments
from infertrace.store.side_inputs import (
    CLIENT_TOKENS_DIR,
    CLIENT_TOKENS_SCHEMA,
    ITERATION_LOG_DIR,
    ITERATION_SCHEMA,
    readable_files,
    side_files,
)
from infertrace.store.values import merge_counts

# Derived relations, in dependency order; each is `relations/<name>.sql`.
RELATIONS: tuple[str, ...] = ("request_legs", "steps", "step_membership", "token_runs", "tokens", "component_calls",
                              "requests")
# The costly relations each one reads (materialized first, so that it reads them instead of recomputing them)
READS: dict[str, tuple[str, ...]] = {"component_calls": ("request_legs",),
                                     "requests": ("request_legs", "component_calls")}
# Relations of inputs that are not spans (infertrace/store/side_inputs.py): name → (directory, schema)
SIDE_RELATIONS: dict[str, tuple[str, pa.Schema]] = {
    "client_tokens": (CLIENT_TOKENS_DIR, CLIENT_TOKENS_SCHEMA),
    "iteration_log": (ITERATION_LOG_DIR, ITERATION_SCHEMA),
}


def relation_sql(name: str) -> str:
    """The SELECT (with its header comment) that defines a derived relation."""
    if name not in RELATIONS:
        raise KeyError(f"unknown relation {name!r}; known: {', '.join(RELATIONS)}")
    return resources.files("infertrace.store").joinpath("relations", f"{name}.sql").read_text(encoding="utf-8")


def sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def duckdb_type(t: pa.DataType) -> str:
    """The DuckDB type of an Arrow type of the store's schema."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "VARCHAR"
    if pa.types.is_map(t):
        return f"MAP({duckdb_type(t.key_type)}, {duckdb_type(t.item_type)})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return duckdb_type(t.value_type) + "[]"
    if pa.types.is_struct(t):
        return "STRUCT(" + ", ".join(f"{_identifier(f.name)} {duckdb_type(f.type)}" for f in t) + ")"
    simple = {pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
              pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN"}
    if t in simple:
        return simple[t]
    raise TypeError(f"no DuckDB type for {t}")


@dataclass(frozen=True)
class SegmentInfo:
    """What a segment's footer says (read once per file and cached): its schema, rows and notes, and the times
    its spans cover (the least `start_ns` and the greatest `end_ns`, from the column statistics; None when the
    footer has none, or for a segment without rows)."""

    schema_key: str
    schema: pa.Schema
    rows: int
    notes: dict[str, dict[str, int]] = field(default_factory=dict)
    first_start_ns: int | None = None
    last_end_ns: int | None = None


_FOOTERS: dict[tuple[str, int, int], SegmentInfo | str] = {}
_FOOTERS_LOCK = threading.Lock()


def read_footer(path: Path) -> SegmentInfo | str:
    """The segment's footer, or the reason it cannot be read (cached by path, size and mtime)."""
    try:
        stat = path.stat()
    except OSError as e:
        return f"cannot stat: {e.strerror or e}"
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _FOOTERS_LOCK:
        cached = _FOOTERS.get(key)
    if cached is not None:
        return cached
    try:
        metadata = pq.read_metadata(path)
        schema = metadata.schema.to_arrow_schema().remove_metadata()
        notes = json.loads((metadata.metadata or {}).get(NOTES_KEY, b"{}"))
        info: SegmentInfo | str = SegmentInfo(schema.to_string(show_schema_metadata=False), schema,
                                              metadata.num_rows, notes if isinstance(notes, dict) else {},
                                              _bound(metadata, "start_ns", False), _bound(metadata, "end_ns", True))
    except (OSError, pa.ArrowException, ValueError) as e:
        info = f"not a readable Parquet file: {e}"
    with _FOOTERS_LOCK:
        if len(_FOOTERS) > 100_000:
            _FOOTERS.clear()
        _FOOTERS[key] = info
    return info


def _bound(metadata: pq.FileMetaData, column: str, greatest: bool) -> int | None:
    """The least (or `greatest`) value of an integer column over the row groups' statistics; None when the column
    or any row group's statistics are missing."""
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    if column not in names or not metadata.num_row_groups:
        return None
    index, values = names.index(column), []
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        values.append(int(stats.max if greatest else stats.min))
    return max(values) if greatest else min(values)


# How far ahead of the writer's clock a span's end may be before `window_segments` reads it as the writer's time.
CLOCK_AHEAD_S = 300.0


def window_segments(root: str | Path, window_s: float) -> tuple[str, ...]:
    """An analysis window's segments: those holding spans that end within `window_s` seconds of the newest span
    end the store holds (from each segment's footer statistics: no span is read), as paths relative to the store.
    A segment whose footer cannot be read or gives no times is kept (nothing says it is outside the window; a
    reader reports an unreadable one). Taken or left whole, the segments cover at least the window.

    A span is exported after it ends, so no span ends after the segment holding it was written, nor after now: a
    later time is a clock running ahead (a host set to next year; `CLOCK_AHEAD_S` allowed for hosts' clocks), which
    must not move the window past every other span. So the newest end is found with each segment's end taken at
    most as its write time, and without the segments whose spans all start after now (a span is stored in the
    partition of its start's date, so a span years ahead is in a segment of its own); those segments are in the
    window, as nothing says they are not."""
    if window_s <= 0:
        raise ValueError(f"an analysis window must be positive, got {window_s} s")
    root = Path(root)
    ahead_ns = int(CLOCK_AHEAD_S * 1e9)
    future = time.time_ns() + ahead_ns
    ends: dict[Path, int | None] = {}  # None: kept, and not the newest
    for path in list_segments(root):
        info = read_footer(path)
        if isinstance(info, str) or info.last_end_ns is None or (info.first_start_ns or 0) > future:
            ends[path] = None
            continue
        try:
            written = path.stat().st_mtime_ns + ahead_ns
        except OSError:  # removed since the listing (compaction): not in the window
            continue
        ends[path] = min(info.last_end_ns, written)
    newest = max((end for end in ends.values() if end is not None), default=None)
    since = None if newest is None else newest - int(window_s * 1e9)
    return tuple(sorted(path.relative_to(root).as_posix() for path, end in ends.items()
                        if since is None or end is None or end >= since))


def window_phrase(window_s: float) -> str:
    """How every output names an analysis window: "the segments holding the store's last 6 h of spans"."""
    return f"the segments holding the store's last {duration_text(window_s)} of spans"


def utc_text(ns: int) -> str:
    """Unix nanoseconds as outputs write a time to the second: 2026-01-01 12:00:00 UTC."""
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration_text(seconds: float) -> str:
    """A duration as people write it: 6 h, 90 min, 2 d, 45 s."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"


def projection(schema: pa.Schema) -> str:
    """SELECT list that maps a segment schema onto the store's schema: a column missing from older segments
    reads as NULL, one whose type changed is cast; columns the schema no longer has are left out."""
    items = []
    for f in SCHEMA:
        name = _identifier(f.name)
        if f.name not in schema.names:
            items.append(f"CAST(NULL AS {duckdb_type(f.type)}) AS {name}")
        elif schema.field(f.name).type != f.type:
            items.append(f"TRY_CAST({name} AS {duckdb_type(f.type)}) AS {name}")
        else:
            items.append(name)
    return ", ".join(items)


def segments_sql(segments: Sequence[tuple[Path, SegmentInfo]]) -> str:
    """A SELECT of every row of the given segments (with their footers, `read_footer`) in the store's schema:
    one scan per segment schema, each mapped by `projection`."""
    readable: dict[str, list[Path]] = {}
    schemas: dict[str, pa.Schema] = {}
    for path, info in segments:
        readable.setdefault(info.schema_key, []).append(path)
        schemas[info.schema_key] = info.schema
    return " UNION ALL ".join(
        f"SELECT {projection(schemas[key])} FROM read_parquet([{', '.join(sql_string(str(p)) for p in files)}], "
        f"hive_partitioning = false)" for key, files in readable.items())


class Store:
    """Read side of a store directory. Views: `spans_raw` (every stored span row), `spans` (each span once),
    and the derived relations in `RELATIONS`."""

    def __init__(self, root: Path, con: duckdb.DuckDBPyConnection, pinned: Sequence[Path] | None = None,
                 window_s: float | None = None) -> None:
        self.root = root
        self.con = con
        # The segments of an earlier snapshot to read instead of the store's current ones (`open(segments=…)`)
        self.pinned: list[Path] | None = list(pinned) if pinned is not None else None
        # An analysis window: each snapshot is the segments holding the store's last `window_s` s of spans
        self.window_s = window_s
        self.segments: list[Path] = []
        self.skipped: list[tuple[Path, str]] = []  # segments left out of the snapshot, with the reason
        self.notes: dict[str, dict[str, int]] = {}  # what was converted, truncated or dropped, per key
        self.duplicate_rows = 0  # rows of spans stored more than once (same ids)
        self.conflicting_spans = 0  # of those, span ids stored with different content
        self.refresh()

    @classmethod
    def open(cls, root: str | Path, threads: int | None = None, segments: Sequence[str] | None = None,
             window_s: float | None = None) -> Store:
        """Opens a store directory for reading. Raises FileNotFoundError when it does not exist.

        `segments` (paths relative to the directory, as `segment_paths` gives them) reads an earlier snapshot
        instead of the current one: what a materialised result was computed from. While compaction's grace
        period keeps them, those files are read; once one is gone the store reads its current segments.
        `window_s` (an analysis window) makes every snapshot the segments holding the store's last `window_s`
        seconds of spans (`window_segments`)."""
        if window_s is not None and window_s <= 0:
            raise ValueError(f"an analysis window must be positive, got {window_s} s")
        path = Path(root)
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: {not_a_store(path)}")
        con = duckdb.connect(":memory:")
        con.execute("SET enable_progress_bar = false")
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        return cls(path, con, None if segments is None else [path / s for s in segments], window_s)

    def refresh(self) -> None:
        """Takes a new snapshot: the segments written since are included from now on (a store opened on given
        segments keeps them while they all exist)."""
        if self.pinned is not None and not all(p.exists() for p in self.pinned):
            self.pinned = None
        self._load_spans_raw()
        self._define_views()

    def written_until(self) -> float:
        """When the snapshot's newest segment was written (Unix seconds; 0.0 without one): it holds the spans
        stored until then."""
        return max((p.stat().st_mtime for p in self.segments if p.exists()), default=0.0)

    def segments_left_out(self) -> int:
        """How many of the store's current segments this snapshot does not hold (an analysis window's older ones)."""
        held = set(self.segment_paths())
        return sum(1 for p in list_segments(self.root) if p.relative_to(self.root).as_posix() not in held)

    def segment_paths(self) -> tuple[str, ...]:
        """The snapshot's segments as paths relative to the store directory (for `open(segments=…)`)."""
        return tuple(sorted(p.relative_to(self.root).as_posix() for p in self.segments))

    def _load_spans_raw(self) -> None:
        """Defines `spans_raw` over the store's readable segments (and lists them, skipped ones, notes)."""
        self.segments, self.skipped, self.notes = [], [], {}
        readable = []
        if self.pinned is not None:
            listed = self.pinned
        elif self.window_s is not None:
            listed = [self.root / s for s in window_segments(self.root, self.window_s)]
        else:
            listed = list_segments(self.root)
        for path in listed:
            info = read_footer(path)
            if isinstance(info, str):
                if path.exists():  # a segment removed since the listing (compaction) is not a problem
                    self.skipped.append((path, info))
                continue
            self.segments.append(path)
            readable.append((path, info))
            merge_counts(self.notes, info.notes)
        con = self.con
        if readable:
            con.execute("CREATE OR REPLACE VIEW spans_raw AS " + segments_sql(readable))
        else:
            empty = pa.table({f.name: pa.array([], type=f.type) for f in SCHEMA})
            con.register("_empty_spans", empty)
            con.execute("CREATE OR REPLACE VIEW spans_raw AS SELECT * FROM _empty_spans")

    def _define_views(self) -> None:
        """Defines `spans` (each span once) over `spans_raw`, the derived relations and the side relations."""
        con = self.con
        total, distinct = con.execute(
            "SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans_raw").fetchone() or (0, 0)
        self.duplicate_rows = total - distinct
        self.conflicting_spans = 0
        if self.duplicate_rows:
            # The same span written twice in different batches (e.g. a file ingested and also received by
            # the collector): keep one copy. Copies with different content are conflicts: counted, and all
            # kept in `spans_raw`.
            content = ", ".join(_identifier(f.name) for f in SCHEMA)
            self.conflicting_spans = con.execute(
                f"SELECT count(*) FROM (SELECT trace_id, span_id FROM spans_raw GROUP BY ALL "
                f"HAVING count(DISTINCT hash({content})) > 1)").fetchone()[0]
            con.execute("CREATE OR REPLACE VIEW spans AS SELECT * FROM spans_raw "
                        "QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY start_ns, end_ns) = 1")
        else:
            con.execute("CREATE OR REPLACE VIEW spans AS SELECT * FROM spans_raw")
        for name in RELATIONS:
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {relation_sql(name)}")
        for name, (directory, schema) in SIDE_RELATIONS.items():
            files = readable_files(side_files(self.side_inputs_root(), directory))
            if files:
                listed = ", ".join(sql_string(str(p)) for p in files)
                con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet([{listed}])")
            else:
                con.register(f"_empty_{name}", pa.table({f.name: pa.array([], type=f.type) for f in schema}))
                con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM _empty_{name}")

    def side_inputs_root(self) -> Path:
        """The store directory whose side inputs (client token times, iteration logs) this store reads."""
        return self.root

    def _ensure_snapshot(self) -> None:
        """A snapshot older than compaction's grace period may name files that are gone: take a new one."""
        if any(not p.exists() for p in self.segments):
            self.refresh()

    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> duckdb.DuckDBPyRelation:
        """Runs a query over the views; values are bound as parameters, never formatted into the SQL."""
        self._ensure_snapshot()
        if params is None:
            return self.con.sql(query)
        return self.con.sql(query, params=params)

    def aggregate(self, name: str, query: str, params: dict[str, Any] | None = None) -> duckdb.DuckDBPyRelation:
        """An analyzer's named aggregation, `query` being its DuckDB text over the views. Run here; a backend whose
        spans live elsewhere runs its own form of `name` there when it has one, and only the reduced rows come
        back (`ClickHouseStore`; `pushes_down`)."""
        return self.sql(query, params)

    def pushes_down(self, name: str) -> bool:
        """Whether `aggregate(name, …)` runs where the spans are rather than on this connection's views."""
        return False

    def relation(self, name: str) -> duckdb.DuckDBPyRelation:
        """A derived relation (or `spans`, `spans_raw`) as a DuckDB relation."""
        if name not in (*RELATIONS, *SIDE_RELATIONS, "spans", "spans_raw"):
            raise KeyError(f"unknown relation {name!r}; known: spans, spans_raw, "
                           f"{', '.join((*RELATIONS, *SIDE_RELATIONS))}")
        self._ensure_snapshot()
        return self.con.table(name)

    def materialize(self, names: Sequence[str] = RELATIONS) -> None:
        """Computes relations once into temporary tables of this connection (faster repeated queries on a
        fixed snapshot; `refresh()` turns them back into views), in dependency order."""
        for name in sorted(names, key=lambda n: RELATIONS.index(n) if n in RELATIONS else len(RELATIONS)):
            self.relation(name)
            self.con.execute(f"CREATE OR REPLACE TEMP TABLE {name}_m AS SELECT * FROM {name}")
            self.con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {name}_m")

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def open_store(spec: str | Path, since_ns: int | None = None, until_ns: int | None = None,
               window_s: float | None = None) -> Store:
    """The store a `--store` value names: a store directory (the whole store, or the segments of an analysis
    window, `window_s`; the since/until window is applied by each analysis), or a ClickHouse URL
    (`clickhouse://USER@HOST:8123/DB`, `chdb://PATH`: the window's traces, chosen in ClickHouse). Raises
    FileNotFoundError for a missing directory, ValueError for a bad URL or an analysis window on ClickHouse."""
    from infertrace.store.clickhouse.connection import is_clickhouse_url

    if is_clickhouse_url(spec):
        from infertrace.store.clickhouse.store import ClickHouseStore

        if window_s is not None:
            raise ValueError("an analysis window chooses a store directory's segments; on ClickHouse give "
                             "--since/--until")
        return ClickHouseStore.open(str(spec), since_ns, until_ns)
    return Store.open(spec, window_s=window_s)
