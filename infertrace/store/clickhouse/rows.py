"""The two shapes of a span: the store's span table (`infertrace.store.schema.SCHEMA`) and a row of the
Collector's ClickHouse exporter (`otel_traces.sql`), and the SELECTs that turn one into the other.

Both are generated from the schema, as `store.projection` is: one typed column per declared key on our side,
one text value per key in a `Map(String, String)` on the exporter's side.

- `to_otel_traces_sql()` (DuckDB, over `spans`) then `exporter_rows()`: every typed column back into the
  attribute maps as the text the exporter writes (`pcommon.Value.AsString`: integers in decimal, booleans
  `true`/`false`, lists as JSON), SpanKind and StatusCode as pdata names them, events and links as the
  exporter's Nested columns.
- `from_otel_traces_sql()` (ClickHouse, over `otel_traces`): the reverse, run inside ClickHouse so that only
  the spans asked for come back, already typed. A declared key whose text does not read as its type keeps
  its text in the map and leaves the typed column NULL, as ingest does. ClickHouse has no nullable arrays,
  so list keys come back as their JSON text and `duckdb_casts` reads them into lists (NULL when absent).

What the exporter's format cannot carry, and so does not come back: the JSON types of event attribute
values (the exporter keeps text; an event's `attributes` reads back as a JSON object of strings) and the
exact text of `links` (read back as `[{"traceId", "spanId", "traceState", "attributes"}]`; a local store's link
attributes are written as an empty map). No derived relation or analysis reads either.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Final

import numpy as np
import pyarrow as pa

from infertrace.store.schema import (
    DECLARED_ATTRIBUTES,
    DECLARED_RESOURCE,
    RESOURCE_MAP,
    SCHEMA,
    SPAN_MAP,
    attribute_column,
    resource_column,
)

# pdata's names (ptrace.SpanKind.String(), ptrace.StatusCode.String()), in OTLP enum order; older exporter
# versions wrote the proto names (SPAN_KIND_SERVER, STATUS_CODE_ERROR), read as well.
SPAN_KINDS: Final = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
STATUS_CODES: Final = ("Unset", "Ok", "Error")
_PROTO_KINDS: Final = ("SPAN_KIND_UNSPECIFIED", "SPAN_KIND_INTERNAL", "SPAN_KIND_SERVER", "SPAN_KIND_CLIENT",
                       "SPAN_KIND_PRODUCER", "SPAN_KIND_CONSUMER")
_PROTO_STATUS: Final = ("STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR")

# ClickHouse type of a list key's items, for the validity check of its JSON text.
_LIST_ITEM: Final = {"string[]": "String", "int[]": "Int64", "double[]": "Float64", "bool[]": "Bool"}


def _literal(text: str) -> str:
    """A constant of the schema (an attribute key, a kind name) as a SQL string literal, the same in DuckDB and
    ClickHouse; never a value from the input (those are bound)."""
    if "'" in text or "\\" in text:
        raise ValueError(f"{text!r}: not a plain name")
    return "'" + text + "'"


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _ch_quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# ------------------------------------------------------------------------------------------- store → exporter
def _as_text(column: str, kind: str) -> str:
    """DuckDB: a typed column's value as the exporter's map text (NULL stays NULL: no entry)."""
    c = _quoted(column)
    if kind == "string":
        return c
    if kind == "bool":
        return f"CASE WHEN {c} THEN 'true' WHEN NOT {c} THEN 'false' END"
    if kind.endswith("[]"):
        return f"CAST(to_json({c}) AS VARCHAR)"
    return f"CAST({c} AS VARCHAR)"


def _text_columns(declared: dict[str, str], column_of: Callable[[str], str], prefix: str) -> str:
    return ",\n    ".join(f"{_as_text(column_of(k), t)} AS {_quoted(prefix + k)}" for k, t in declared.items())


def to_otel_traces_sql(source: str = "spans") -> str:
    """DuckDB SELECT over the store's span table giving the exporter's columns (`otel_traces`), one row per
    span. Events' and links' JSON attributes become text maps; the exporter's column order."""
    kinds = " ".join(f"WHEN {i} THEN {_literal(k)}" for i, k in enumerate(SPAN_KINDS))
    status = " ".join(f"WHEN {i} THEN {_literal(k)}" for i, k in enumerate(STATUS_CODES))
    service = _quoted(resource_column("service.name"))
    return f"""
SELECT
    make_timestamp_ns(start_ns) AS "Timestamp",
    trace_id AS "TraceId",
    span_id AS "SpanId",
    coalesce(parent_span_id, '') AS "ParentSpanId",
    '' AS "TraceState",
    name AS "SpanName",
    CASE kind {kinds} ELSE 'Unspecified' END AS "SpanKind",
    coalesce({service}, '') AS "ServiceName",
    {RESOURCE_MAP} AS "ResourceAttributes",
    coalesce(scope_name, '') AS "ScopeName",
    coalesce(scope_version, '') AS "ScopeVersion",
    {SPAN_MAP} AS "SpanAttributes",
    CAST(end_ns - start_ns AS UBIGINT) AS "Duration",
    CASE status_code {status} ELSE 'Unset' END AS "StatusCode",
    coalesce(status_message, '') AS "StatusMessage",
    list_transform(coalesce(events, []), lambda e: make_timestamp_ns(e.time_ns)) AS "Events.Timestamp",
    list_transform(coalesce(events, []), lambda e: e.name) AS "Events.Name",
    list_transform(coalesce(events, []), lambda e: json_text_map(e.attributes)) AS "Events.Attributes",
    list_transform(link_list(links), lambda l: l.traceId) AS "Links.TraceId",
    list_transform(link_list(links), lambda l: l.spanId) AS "Links.SpanId",
    list_transform(link_list(links), lambda l: coalesce(l.traceState, '')) AS "Links.TraceState",
    list_transform(link_list(links), lambda l: MAP {{}}::MAP(VARCHAR, VARCHAR)) AS "Links.Attributes",
    {_text_columns(DECLARED_RESOURCE, resource_column, _RESOURCE_TEXT)},
    {_text_columns(DECLARED_ATTRIBUTES, attribute_column, _SPAN_TEXT)}
FROM {source}"""


# Columns of `to_otel_traces_sql` holding a declared key's text, before `exporter_rows` moves them into the maps.
_RESOURCE_TEXT: Final = "resource:"
_SPAN_TEXT: Final = "span:"


def exporter_rows(batch: pa.Table) -> pa.Table:
    """The exporter's rows from a batch of `to_otel_traces_sql`: each declared key's text (where not NULL) added
    to its map, after the keys already there, and the text columns dropped. Vectorised (numpy over the map's
    offsets): building the maps in SQL, a list of ~120 entries per span, ran at ≈ 5.5k spans/s."""
    out = {}
    for name in batch.column_names:
        if name == "ResourceAttributes":
            out[name] = _merged_map(batch, name, _RESOURCE_TEXT)
        elif name == "SpanAttributes":
            out[name] = _merged_map(batch, name, _SPAN_TEXT)
        elif not name.startswith((_RESOURCE_TEXT, _SPAN_TEXT)):
            out[name] = batch.column(name)
    return pa.table(out)


def _merged_map(batch: pa.Table, map_name: str, prefix: str) -> pa.Array:
    n = batch.num_rows
    existing = batch.column(map_name).combine_chunks()
    existing = existing.fill_null(pa.scalar([], existing.type)) if existing.null_count else existing
    offsets = np.asarray(existing.offsets)
    rows = [np.repeat(np.arange(n), np.diff(offsets))]
    first, last = offsets[0], offsets[-1]
    keys: list[pa.Array] = [existing.keys.slice(first, last - first).cast(pa.string())]
    values: list[pa.Array] = [existing.items.slice(first, last - first)]
    for name in batch.column_names:
        if not name.startswith(prefix):
            continue
        text = batch.column(name).combine_chunks()
        present = np.flatnonzero(np.asarray(text.is_valid()))
        if present.size:
            rows.append(present)
            keys.append(pa.array(np.full(present.size, name[len(prefix):], dtype=object), pa.string()))
            values.append(text.take(pa.array(present)))
    row = np.concatenate(rows)
    order = pa.array(np.argsort(row, kind="stable"))
    counts = np.bincount(row, minlength=n)
    new_offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    return pa.MapArray.from_arrays(new_offsets, pa.concat_arrays(keys).take(order),
                                   pa.concat_arrays(values).take(order))


# DuckDB macros the export SELECT uses: a JSON object's values as text (strings unquoted, as the exporter
# writes them), and OTLP JSON links as a list of structs.
EXPORT_MACROS: Final = (
    """CREATE OR REPLACE TEMP MACRO json_text_map(j) AS
       map_from_entries(list_transform(map_entries(CAST(CAST(j AS JSON) AS MAP(VARCHAR, JSON))), lambda e: {
           'key': e.key, 'value': CASE WHEN json_type(e.value) = 'VARCHAR' THEN json_extract_string(e.value, '$')
                                       ELSE CAST(e.value AS VARCHAR) END}))""",
    """CREATE OR REPLACE TEMP MACRO link_list(j) AS
       coalesce(from_json(j, '[{"traceId": "VARCHAR", "spanId": "VARCHAR", "traceState": "VARCHAR"}]'), [])""",
)


# ------------------------------------------------------------------------------------------- exporter → store
def _ch_value(map_column: str, key: str, kind: str) -> str:
    """ClickHouse: the typed value of a declared key from its map text; NULL when absent or not of its type
    (list keys: their JSON text when it is a JSON array, read into a list by `duckdb_casts`)."""
    v = f"{map_column}[{_literal(key)}]"
    present = f"mapContains({map_column}, {_literal(key)})"
    if kind == "string":
        return f"if({present}, {v}, NULL)"
    if kind == "int":
        return f"toInt64OrNull({v})"
    if kind == "double":
        return f"toFloat64OrNull({v})"
    if kind == "bool":
        return f"multiIf({v} = 'true', true, {v} = 'false', false, NULL)"
    return f"if({present} AND {_valid_list(v, kind)}, {v}, NULL)"


def _valid_list(v: str, kind: str) -> str:
    item = _LIST_ITEM[kind]
    return (f"isValidJSON({v}) AND JSONType({v}) = 'Array' "
            f"AND length(JSONExtract({v}, 'Array(Nullable({item}))')) = JSONLength({v})")


def _ch_keep(map_column: str, declared: dict[str, str]) -> str:
    """ClickHouse: the map without the declared keys whose text read as their type (those are in typed
    columns); undeclared keys, and declared ones that did not convert, stay as text."""
    by_kind: dict[str, list[str]] = {}
    for k, t in declared.items():
        by_kind.setdefault(t, []).append(k)
    tests = []
    for kind, keys in by_kind.items():
        listed = "[" + ", ".join(_literal(k) for k in keys) + "]"
        if kind == "string":
            continue
        if kind == "int":
            ok = "toInt64OrNull(v) IS NOT NULL"
        elif kind == "double":
            ok = "toFloat64OrNull(v) IS NOT NULL"
        elif kind == "bool":
            ok = "v IN ('true', 'false')"
        else:
            ok = _valid_list("v", kind)
        tests.append(f"(has({listed}, k) AND NOT ({ok}))")
    every = "[" + ", ".join(_literal(k) for k in declared) + "]"
    keep = " OR ".join([f"NOT has({every}, k)", *tests])
    return f"mapFilter((k, v) -> {keep}, {map_column})"


def _ch_case(column: str, names: tuple[str, ...], proto: tuple[str, ...]) -> str:
    arms = ", ".join(f"{column} IN ({_literal(a)}, {_literal(b)}), {i}" for i, (a, b) in enumerate(zip(names, proto,
                                                                                                     strict=True)))
    return f"toInt8(multiIf({arms}, 0))"


def from_otel_traces_sql(table: str, where: str = "", columns: Collection[str] | None = None) -> str:
    """ClickHouse SELECT over the exporter's table giving the store's span columns (lists as JSON text);
    `where` is a WHERE clause with bound parameters, or empty. `columns`: only these (and the ones they are
    computed from), for a query that reads a few: ClickHouse plans every column a subquery names, read or not."""
    items = [
        "TraceId AS trace_id", "SpanId AS span_id", "nullIf(ParentSpanId, '') AS parent_span_id",
        "toString(SpanName) AS name", f"{_ch_case('SpanKind', SPAN_KINDS, _PROTO_KINDS)} AS kind",
        "toUnixTimestamp64Nano(Timestamp) AS start_ns", "start_ns + toInt64(Duration) AS end_ns",
        f"{_ch_case('StatusCode', STATUS_CODES, _PROTO_STATUS)} AS status_code",
        "nullIf(StatusMessage, '') AS status_message", "nullIf(ScopeName, '') AS scope_name",
        "nullIf(ScopeVersion, '') AS scope_version",
        "arrayMap((t, n, a) -> CAST(tuple(toUnixTimestamp64Nano(t), toString(n), toJSONString(a)), "
        "'Tuple(time_ns Int64, name String, attributes String)'), `Events.Timestamp`, `Events.Name`, "
        "`Events.Attributes`) AS events",
        "if(empty(`Links.TraceId`), NULL, toJSONString(arrayMap((t, s, st, a) -> map('traceId', t, 'spanId', s, "
        "'traceState', st, 'attributes', toJSONString(a)), `Links.TraceId`, `Links.SpanId`, `Links.TraceState`, "
        "`Links.Attributes`))) AS links",
        f"CAST({_ch_keep('ResourceAttributes', DECLARED_RESOURCE)}, 'Map(String, String)') AS {RESOURCE_MAP}",
        f"CAST({_ch_keep('SpanAttributes', DECLARED_ATTRIBUTES)}, 'Map(String, String)') AS {SPAN_MAP}",
    ]
    items += [f"{_ch_value('ResourceAttributes', k, t)} AS {_ch_quoted(resource_column(k))}"
              for k, t in DECLARED_RESOURCE.items() if columns is None or resource_column(k) in columns]
    items += [f"{_ch_value('SpanAttributes', k, t)} AS {_ch_quoted(attribute_column(k))}"
              for k, t in DECLARED_ATTRIBUTES.items() if columns is None or attribute_column(k) in columns]
    if columns is not None:
        wanted = {*columns, "start_ns"}  # end_ns is computed from start_ns
        items = [i for i in items if i.rsplit(" AS ", 1)[1].strip("`") in wanted]
    return "SELECT\n    " + ",\n    ".join(items) + f"\nFROM {table}\n{where}"


def _duckdb_type(t: pa.DataType) -> str:
    from infertrace.store.store import duckdb_type

    return duckdb_type(t)


def duckdb_casts(source: str) -> str:
    """DuckDB SELECT over what `from_otel_traces_sql` returned giving exactly the store's schema: list keys'
    JSON text read into lists, no events as NULL (as ingest stores it), every column cast to its type."""
    items = []
    for f in SCHEMA:
        c = _quoted(f.name)
        if f.name == "events":
            expr = f"CASE WHEN len({c}) > 0 THEN {c} END"
        elif pa.types.is_list(f.type):
            expr = f"CAST(CAST({c} AS JSON) AS {_duckdb_type(f.type)})"
        else:
            expr = c
        items.append(f"CAST({expr} AS {_duckdb_type(f.type)}) AS {c}")
    return "SELECT " + ", ".join(items) + f" FROM {source}"
