"""The store over ClickHouse's `otel_traces` (as the Collector's exporter writes it), and the two ways between a
local store and ClickHouse.

    with ClickHouseStore.open("clickhouse://reader@ch1:8123/otel", since_ns=t0, until_ns=t1) as store:
        store.sql("SELECT model, count(*) FROM requests GROUP BY model").fetchall()

`ClickHouseStore` is a `Store`: the same views (`spans_raw`, `spans`, the derived relations of `RELATIONS`,
the side relations) on a private DuckDB connection, so every analyzer, report section and runbook query runs
on it unchanged. What runs in ClickHouse: choosing the spans (the window, pushed down as bound parameters;
whole traces, so that a request that overlaps the window comes with all its spans) and turning the
exporter's rows into the store's typed columns (`rows.from_otel_traces_sql`). What comes back: the typed
span rows of the window, once per snapshot (`refresh()`); the relations then run on them in DuckDB from the
same `.sql` files as on a local store.

`export_rows` writes a local store's spans into `otel_traces` as the exporter writes them; `ingest --from`
(`infertrace.cli.store`) writes a window of ClickHouse's spans into a local store as segments.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from infertrace.store.clickhouse.connection import SETTINGS_CLAUSE, Connection, connect
from infertrace.store.clickhouse.pushdown import (
    DUPLICATES,
    TWINS,
    duplicate_keys_sql,
    plain_columns,
    relation_sql,
    relations_read,
    twin_sql,
)
from infertrace.store.clickhouse.rows import (
    EXPORT_MACROS,
    duckdb_casts,
    exporter_rows,
    from_otel_traces_sql,
    to_otel_traces_sql,
)
from infertrace.store.schema import DECLARED_ATTRIBUTES, DECLARED_RESOURCE, RESOURCE_MAP, SPAN_MAP
from infertrace.store.store import Store, sql_string
from infertrace.store.values import KEPT_AS_TEXT

EXPORT_BATCH_ROWS = 100_000
# The most spans read back at once (one batch of the streamed result; chdb cuts its stream at this many rows, a
# server sends its blocks): each batch is held in memory at once as Arrow. One million spans: about 1.5 GB.
READ_BACK_ROWS = 1_000_000


def otel_traces_ddl(database: str) -> str:
    """The exporter's CREATE TABLE for `otel_traces` in `database` (otel_traces.sql, pinned and cited there)."""
    text = resources.files("infertrace.store.clickhouse").joinpath("otel_traces.sql").read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    return body.replace("{database}", database)


def create_otel_traces(connection: Connection) -> None:
    """Creates the database and `otel_traces` as the exporter does, when missing."""
    connection.command(f"CREATE DATABASE IF NOT EXISTS {connection.target.database}")
    connection.command(otel_traces_ddl(connection.target.database))


def window_clause(table: str, since_ns: int | None, until_ns: int | None) -> tuple[str, dict[str, Any]]:
    """WHERE clause (bound parameters) choosing a window's spans with the context its analyses need: the traces
    with a span overlapping [since, until) give an extent (the earliest start and latest end of their spans);
    every trace with a span overlapping that extent is kept whole. So a request that overlaps the window comes
    with all its spans, and the engine steps (their own traces) of its whole life come too: its tokens and ITLs
    are those of the whole store. Empty for no window."""
    tests, params = [], {}
    if until_ns is not None:
        tests.append("Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})")
        params["until_ns"] = until_ns
    if since_ns is not None:
        tests.append("toUnixTimestamp64Nano(Timestamp) + toInt64(Duration) >= {since_ns:Int64}")
        params["since_ns"] = since_ns
    if not tests:
        return "", {}
    end = "toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)"
    in_window = f"SELECT TraceId FROM {table} WHERE {' AND '.join(tests)}"
    lo = f"(SELECT min(Timestamp) FROM {table} WHERE TraceId IN ({in_window}))"
    hi = f"(SELECT max({end}) FROM {table} WHERE TraceId IN ({in_window}))"
    extended = (f"SELECT TraceId FROM {table} WHERE Timestamp < fromUnixTimestamp64Nano({hi}) "
                f"AND {end} >= toUnixTimestamp64Nano({lo})")
    return f"WHERE TraceId IN ({extended})", params


def span_rows_sql(table: str, since_ns: int | None = None, until_ns: int | None = None) -> tuple[str, dict[str, Any]]:
    """(query, parameters) of the spans of a window (whole traces) in the store's columns, typed in ClickHouse
    (lists as JSON text: `rows.duckdb_casts` finishes them)."""
    where, params = window_clause(table, since_ns, until_ns)
    return from_otel_traces_sql(table, where), params


def span_rows(connection: Connection, since_ns: int | None = None, until_ns: int | None = None) -> pa.Table:
    """The spans of a window (whole traces) in the store's columns, as one table (`span_rows_sql`)."""
    return connection.query_arrow(*span_rows_sql(connection.target.table, since_ns, until_ns))


def _snapshot_attribute(name: str) -> property:
    """An attribute of `ClickHouseStore` that reads the spans back before it is read (kept in `_snapshot`)."""

    def get(self: ClickHouseStore) -> Any:
        self._pull()
        return self._snapshot[name]

    def put(self: ClickHouseStore, value: Any) -> None:
        self._snapshot[name] = value

    return property(get, put)


class ClickHouseStore(Store):
    """A `Store` whose spans are those of ClickHouse's `otel_traces` in a window (all of them without one)."""

    def __init__(self, connection: Connection, con: duckdb.DuckDBPyConnection, since_ns: int | None,
                 until_ns: int | None, side_inputs: Path | None = None) -> None:
        self.connection = connection
        self.side_inputs = side_inputs
        self.since_ns, self.until_ns = since_ns, until_ns
        self.url = str(connection.target)
        # The DuckDB connection itself, without reading the spans back (`con` reads them back first).
        self.duckdb = con
        self._snapshot: dict[str, Any] = {}
        # The relations the twins read, made in ClickHouse as temporary tables of this store's window (once per
        # snapshot): relation name → table. Named for this store: chdb's one session is shared within a process.
        self._tables: dict[str, str] = {}
        self._token = secrets.token_hex(4)
        # Results kept per snapshot (infertrace.results) go into a private directory removed on close, and so
        # does what DuckDB spills of the spans read back.
        root = Path(tempfile.mkdtemp(prefix="infertrace-clickhouse-"))
        con.execute("SET temp_directory = $dir", {"dir": str(root / "spill")})
        super().__init__(root, con)

    @classmethod
    def open(cls, url: str, since_ns: int | None = None, until_ns: int | None = None,  # type: ignore[override]
             threads: int | None = None, side_inputs: Path | None = None) -> ClickHouseStore:
        """Raises ValueError for a bad URL, and ClickHouse's own error when the table cannot be read.
        `side_inputs`: a local store directory whose client token times and iteration logs (not spans, so not
        in otel_traces) the store reads as well."""
        connection = connect(url)
        con = duckdb.connect(":memory:")
        con.execute("SET enable_progress_bar = false")
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        try:
            return cls(connection, con, since_ns, until_ns, side_inputs)
        except BaseException:
            connection.close()
            con.close()
            raise

    # The spans are read back on first use of the views, not on open: aggregations that run in ClickHouse
    # (`aggregate`) never need them. Everything that reads the snapshot (the connection, its segments and
    # counts) reads it through these properties.
    _pulled = True  # until the first refresh()

    def refresh(self) -> None:
        """Takes a new snapshot, read back from ClickHouse when the views are first used."""
        self._pulled = False
        self._drop_tables()

    def _pull(self) -> None:
        if self._pulled:
            return
        self._pulled = True
        try:
            Store.refresh(self)
        except BaseException:
            self._pulled = False
            raise

    con = _snapshot_attribute("con")
    segments = _snapshot_attribute("segments")
    skipped = _snapshot_attribute("skipped")
    notes = _snapshot_attribute("notes")
    duplicate_rows = _snapshot_attribute("duplicate_rows")
    conflicting_spans = _snapshot_attribute("conflicting_spans")

    @property
    def spans_read(self) -> bool:
        """Whether this snapshot's spans have been read back from ClickHouse (a view was used)."""
        return self._pulled

    def pushes_down(self, name: str) -> bool:
        """Whether aggregation `name` runs in ClickHouse: when it has a ClickHouse form and this snapshot's spans
        have not been read back. Once they have (a report's coverage reads every relation), the same DuckDB text
        runs on the copy already here: a second computation in ClickHouse, with the relation tables it needs,
        would bring back nothing that is not here already."""
        return name in TWINS and not self._pulled

    def aggregate(self, name: str, query: str, params: dict[str, Any] | None = None) -> duckdb.DuckDBPyRelation:
        """Aggregation `name` in ClickHouse over the window's spans when it pushes down (`pushes_down`), only its
        rows coming back; otherwise `query` on the spans read back."""
        if not self.pushes_down(name):
            return super().aggregate(name, query, params)
        table = self.connection.target.table
        where, bound = window_clause(table, self.since_ns, self.until_ns)
        sql = twin_sql(name, table, where, self.clickhouse_tables(relations_read("{" + name + "}")))
        rows = plain_columns(self.connection.query_arrow(sql, {**bound, **(params or {})}))
        return self.duckdb.from_arrow(rows)

    def clickhouse_tables(self, names: list[str]) -> dict[str, str]:
        """The ClickHouse forms of the named relations (pushdown.CLICKHOUSE_RELATIONS, each after those it reads)
        made over this snapshot's window as temporary tables in ClickHouse, once per snapshot: name → table, with
        the table of the window's duplicated span keys (pushdown.DUPLICATES), which every read of the spans uses.
        Each is planned and computed once, not again inside every query that reads it (ClickHouse inlines a
        subquery or CTE at each place it is used). They are MergeTree tables: compressed on disk, not held in
        memory (at 10M spans the `steps` relation alone took 5 GB in a Memory table)."""
        table = self.connection.target.table
        where, bound = window_clause(table, self.since_ns, self.until_ns)
        if DUPLICATES not in self._tables:
            self._make_table(DUPLICATES, duplicate_keys_sql(table, where), bound)
        for name in names:
            if name not in self._tables:
                self._make_table(name, relation_sql(name, table, where, self._tables), bound)
        return {name: self._tables[name] for name in [DUPLICATES, *names]}

    def _make_table(self, name: str, sql: str, bound: dict[str, Any]) -> None:
        made = f"infertrace_{name.strip('_')}_{self._token}"
        self.connection.command(f"CREATE TEMPORARY TABLE {made} ENGINE = MergeTree ORDER BY tuple() "
                                f"AS SELECT * FROM ({sql})" + SETTINGS_CLAUSE, bound)
        self._tables[name] = made

    def _drop_tables(self) -> None:
        for made in self._tables.values():
            self.connection.command(f"DROP TEMPORARY TABLE IF EXISTS {made}")
        self._tables = {}

    def _load_spans_raw(self) -> None:
        """Reads the window's spans back, in one query whose result is streamed in batches of about
        `READ_BACK_ROWS` spans, each written as one compressed Parquet file of the store's private directory
        (typed by `rows.duckdb_casts`); `spans_raw` reads those files as a local store reads its segments. So
        ClickHouse's result is never held whole in memory, and the spans take on disk about what a local store's
        segments take, not their uncompressed width in DuckDB's memory (or its spill)."""
        con = self.duckdb
        sql, params = span_rows_sql(self.connection.target.table, self.since_ns, self.until_ns)
        parts = self.root / "read-back"
        shutil.rmtree(parts, ignore_errors=True)
        parts.mkdir(parents=True)
        files: list[Path] = []
        for rows in self.connection.query_arrow_batches(sql, params, READ_BACK_ROWS):
            files.append(self._write_part(rows, parts / f"part-{len(files):05d}.parquet"))
            del rows
        if not files:  # an empty window: a file typed from an empty result
            files.append(self._write_part(self.connection.query_arrow(f"SELECT * FROM ({sql}) LIMIT 0", params),
                                          parts / "part-00000.parquet"))
        listed = ", ".join(sql_string(str(f)) for f in files)
        con.execute(f"CREATE OR REPLACE VIEW spans_raw AS SELECT * FROM read_parquet([{listed}])")
        self.skipped, self.notes = [], self._kept_as_text()
        # One pseudo-segment names the snapshot, so that results kept per snapshot are keyed on what was read.
        (count, last), = con.execute("SELECT count(*), max(end_ns) FROM spans_raw").fetchall()
        key = hashlib.sha256(f"{self.url} {self.since_ns} {self.until_ns} {count} {last}".encode()).hexdigest()[:16]
        self.segments = [Path(f"clickhouse-{key}")] if count else []

    def _kept_as_text(self) -> dict[str, dict[str, int]]:
        """The notes the read-back can give: values of a declared key whose text does not read as the key's type,
        kept as text in the attribute map (per key, a count per span, as ingest counts them). The exporter writes
        every value as text, so which values the source sent in another type than the declared one (what a local
        ingest notes as converted) cannot be told from ClickHouse, and is not noted."""
        parts = []
        for map_column, declared in ((SPAN_MAP, DECLARED_ATTRIBUTES), (RESOURCE_MAP, DECLARED_RESOURCE)):
            typed = sorted(k for k, kind in declared.items() if kind != "string")
            if typed:
                listed = ", ".join(sql_string(k) for k in typed)
                parts.append(f"SELECT key FROM (SELECT unnest(map_keys({map_column})) AS key FROM spans_raw "
                             f"WHERE cardinality({map_column}) > 0) WHERE key IN ({listed})")
        if not parts:
            return {}
        rows = self.duckdb.execute(f"SELECT key, count(*) FROM ({' UNION ALL '.join(parts)}) GROUP BY key").fetchall()
        return {KEPT_AS_TEXT: {key: int(n) for key, n in rows}} if rows else {}

    def _write_part(self, rows: pa.Table, path: Path) -> Path:
        """One batch of the read-back rows, typed as the store's schema, written to `path` (Parquet, ZSTD)."""
        con = self.duckdb
        con.register("_clickhouse_rows", rows)
        try:
            con.execute(f"COPY ({duckdb_casts('_clickhouse_rows')}) TO {sql_string(str(path))} "
                        "(FORMAT parquet, COMPRESSION zstd)")
        finally:
            con.unregister("_clickhouse_rows")
        return path

    def side_inputs_root(self) -> Path:
        return self.side_inputs if self.side_inputs is not None else self.root

    def _ensure_snapshot(self) -> None:
        """The snapshot is a table of this connection: nothing to re-list."""

    def close(self) -> None:
        self._drop_tables()
        self.duckdb.close()
        self.connection.close()
        shutil.rmtree(self.root, ignore_errors=True)


def exporter_batches(store: Store, rows_per_batch: int = EXPORT_BATCH_ROWS) -> Iterator[pa.Table]:
    """A local store's spans (each once) as the exporter's `otel_traces` rows, in batches."""
    for macro in EXPORT_MACROS:
        store.con.execute(macro)
    reader = store.con.sql(to_otel_traces_sql("spans")).to_arrow_reader(rows_per_batch)
    for batch in reader:
        if batch.num_rows:
            yield exporter_rows(pa.Table.from_batches([batch]))


def export_rows(store: Store, url: str) -> int:
    """Writes a local store's spans into ClickHouse's `otel_traces` (created when missing) as the Collector's
    exporter writes them; returns the number of spans written. Exporting the same store twice writes its spans
    twice, as an exporter's retry does: readers read each (trace id, span id) once."""
    connection = connect(url)
    try:
        create_otel_traces(connection)
        written = 0
        for batch in exporter_batches(store):
            connection.insert_arrow(connection.target.table, batch)
            written += batch.num_rows
        return written
    finally:
        connection.close()


def has_otel_traces(url: str) -> bool:
    """True when the database a URL names has an `otel_traces` table."""
    connection = connect(url)
    try:
        found = connection.query_arrow("SELECT count() AS n FROM system.tables WHERE database = {db:String} AND "
                                       "name = 'otel_traces'", {"db": connection.target.database})
        return bool(found.column("n")[0].as_py())
    finally:
        connection.close()


def drop_otel_traces(url: str) -> None:
    """Drops the `otel_traces` table of the database a URL names (when there is one)."""
    connection = connect(url)
    try:
        connection.command(f"DROP TABLE IF EXISTS {connection.target.table}")
    finally:
        connection.close()


def mirrored_store(store_dir: Path, url: str) -> ClickHouseStore:
    """A local store's spans read back through ClickHouse: written into `otel_traces` at `url` as the exporter
    writes them, unless the table already holds as many spans (a previous call), then opened as a
    `ClickHouseStore` reading the local store's side inputs. A table holding another count is replaced."""
    with Store.open(store_dir) as local:
        spans = local.sql("SELECT count(*) FROM spans").fetchall()[0][0]
        if has_otel_traces(url):
            store = ClickHouseStore.open(url, side_inputs=store_dir)
            if store.sql("SELECT count(*) FROM spans_raw").fetchall()[0][0] == spans:
                return store
            store.close()
        drop_otel_traces(url)
        export_rows(local, url)
    return ClickHouseStore.open(url, side_inputs=store_dir)


def ingest_window(root: Path, url: str, since_ns: int | None, until_ns: int | None,
                  rows_per_segment: int = EXPORT_BATCH_ROWS) -> tuple[int, int]:
    """Writes a window of ClickHouse's spans (chosen as `ClickHouseStore` chooses them) into a local store
    directory as segments; returns (spans read, spans new to the store). The rows are cut into segments in a
    fixed order, so pulling the same window again adds nothing."""
    from infertrace.store.schema import SCHEMA
    from infertrace.store.segments import write_segments

    connection = connect(url)
    con = duckdb.connect(":memory:")
    try:
        rows = span_rows(connection, since_ns, until_ns)
        con.register("_clickhouse_rows", rows)
        reader = con.sql(duckdb_casts("_clickhouse_rows") + " ORDER BY start_ns, trace_id, span_id"
                         ).to_arrow_reader(rows_per_segment)
        read = new = 0
        for batch in reader:
            table = pa.Table.from_batches([batch]).cast(SCHEMA)
            read += table.num_rows
            new += write_segments(root, table).spans_new
        return read, new
    finally:
        con.close()
        connection.close()
