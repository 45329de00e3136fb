"""Aggregations that run inside ClickHouse, over `otel_traces`, so that only their reduced rows come back.

    rows = store.aggregate("itl_distribution", duckdb_text)   # any Store; ClickHouseStore runs the twin below

An analyzer names an aggregation and gives its DuckDB text (over the store's views); a local store runs that
text. `ClickHouseStore` runs the aggregation's ClickHouse form, `sql/<name>.sql` here, when there is one: the
same rows computed from the exporter's rows in ClickHouse (the window's spans only), never the spans
themselves. Each twin is tested to return exactly the DuckDB text's rows on the same spans
(tests/test_store_clickhouse.py). Aggregations without a twin run in DuckDB on the spans read back.

The twins read the window's spans through `spans_sql` (`{spans}`: the store's typed columns, as
`rows.from_otel_traces_sql` types them for the local relations) or `step_spans_sql` (`{step_spans}`: the engine
step spans, a few attributes typed), and the relations of `relations/<name>.sql` (`{requests}`, …: ClickHouse
forms of the DuckDB relations, each held to its DuckDB definition by the tests), which `ClickHouseStore` makes
once per snapshot as temporary tables (`relations_read` says which, in order), after a table of the window's
duplicated span keys (`duplicate_keys_sql`) through which every read of the spans takes each span once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from infertrace.store.clickhouse.rows import _ch_value, from_otel_traces_sql
from infertrace.store.schema import SCHEMA


def _names(folder: str) -> tuple[str, ...]:
    return tuple(sorted(p.name.removesuffix(".sql") for p in resources.files(
        "infertrace.store.clickhouse").joinpath(folder).iterdir() if p.name.endswith(".sql")))


# Aggregations with a ClickHouse form (sql/<name>.sql), and the relations the twins read (relations/<name>.sql).
TWINS: Final = _names("sql")
CLICKHOUSE_RELATIONS: Final = _names("relations")


def _list(key: str, item: str) -> tuple[str, str]:
    """(the list as a ClickHouse array, empty when absent or not a list of its type; whether it is present)."""
    text = _ch_value("SpanAttributes", key, {"Int64": "int[]", "String": "string[]", "Bool": "bool[]"}[item])
    return f"JSONExtract(coalesce({text}, '[]'), 'Array({item})')", f"({text}) IS NOT NULL"


# The key under which `ClickHouseStore` passes its table of duplicated span keys to the composition (`tables`).
DUPLICATES: Final = "_duplicates"
_SPAN_KEY: Final = "sipHash128({}, {})"


def duplicate_keys_sql(table: str, where: str) -> str:
    """ClickHouse SELECT of the keys (`_SPAN_KEY` of trace and span id) that more than one row of the window
    carries: the exporter writes at least once, so a retried batch leaves a span twice. Usually none or a few."""
    key = _SPAN_KEY.format("TraceId", "SpanId")
    return f"SELECT {key} AS span_key FROM {table} {where} GROUP BY span_key HAVING count() > 1"


def _each_once(select: str, trace_id: str, span_id: str, duplicates: str) -> str:
    """`select`'s rows with each span once, `duplicates` being a table of `duplicate_keys_sql`'s keys: only the
    rows of a duplicated key go through `LIMIT 1 BY`; the others pass as they are. `LIMIT 1 BY` over the whole
    window keeps a hash table of every key (at 10M spans 768 MiB, in each place a relation reads the spans),
    the table of duplicates only those few keys."""
    key = _SPAN_KEY.format(trace_id, span_id)
    return (f"SELECT * FROM ({select}) WHERE {key} NOT IN {duplicates}\nUNION ALL\n"
            f"SELECT * FROM (SELECT * FROM ({select}) WHERE {key} IN {duplicates} LIMIT 1 BY {key})")


def step_spans_sql(table: str, where: str, duplicates: str) -> str:
    """ClickHouse SELECT of the engine step spans among the rows `where` chooses (each span once: `_each_once`),
    with the columns the twins read, typed as the local store types them."""
    durations, has_durations = _list("infertrace.step.durations_ns", "Int64")
    decode_ids, _ = _list("infertrace.step.decode.request_ids", "String")
    prefill_ids, _ = _list("infertrace.step.prefill.request_ids", "String")
    samples, _ = _list("infertrace.step.prefill.samples_token", "Bool")
    preempted, _ = _list("infertrace.step.preempted.request_ids", "String")
    select = f"""SELECT
        toUnixTimestamp64Nano(Timestamp) AS start_ns,
        {_ch_value("ResourceAttributes", "service.instance.id", "string")} AS instance,
        {_ch_value("SpanAttributes", "infertrace.step.index", "int")} AS first_step_index,
        {durations} AS durations,
        if({has_durations}, length(durations), {_ch_value("SpanAttributes", "infertrace.step.count", "int")})
            AS run_steps,
        if(length(durations) > 0, start_ns + durations[1], NULL) AS first_step_end_ns,
        if(length(durations) > 0, start_ns + arraySum(durations), NULL) AS last_step_end_ns,
        {decode_ids} AS decode_ids,
        {prefill_ids} AS prefill_ids,
        {samples} AS samples_token,
        toInt64(length(decode_ids)) AS num_decodes,
        toInt64(length(prefill_ids)) AS num_prefills,
        toInt64(length({preempted})) AS num_preempted,
        {_ch_value("SpanAttributes", "infertrace.step.decode.context_tokens", "int")} AS context_tokens,
        coalesce({_ch_value("SpanAttributes", "infertrace.step.pause_ns", "int")}, 0) AS pause_ns,
        TraceId, SpanId
    FROM (SELECT * FROM {table} {where})
    WHERE SpanName = 'engine_step'"""
    return _each_once(select, "TraceId", "SpanId", duplicates)


_TYPED_COLUMN = re.compile(r'"((?:attr|res)\.[^"]+)"')
_PLAIN_COLUMNS: Final = tuple(f.name for f in SCHEMA if not f.name.startswith(("attr.", "res.")))


def spans_sql(table: str, where: str, reader: str, duplicates: str) -> str:
    """ClickHouse SELECT of the spans `where` chooses (each span once) in the store's columns
    (`rows.from_otel_traces_sql`; list keys as JSON text), with the typed columns (`"attr.…"`, `"res.…"`) that
    the query text `reader` names: what a relation's ClickHouse form reads as `{spans}`. Naming only those keeps
    the composed query small: ClickHouse plans each column of a subquery at each place it is used."""
    named = {"trace_id", "span_id", *_TYPED_COLUMN.findall(reader),
             *(c for c in _PLAIN_COLUMNS if re.search(rf"\b{c}\b", reader))}
    return _each_once(from_otel_traces_sql(table, where, named), "trace_id", "span_id", duplicates)


def _text(folder: str, name: str) -> str:
    text = resources.files("infertrace.store.clickhouse").joinpath(folder, f"{name}.sql").read_text(encoding="utf-8")
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))


_BLOCK = re.compile(r"\{([a-z_]+)\}")


def _composed(text: str, table: str, where: str, tables: Mapping[str, str]) -> str:
    """`text` with each `{relation}` it names replaced by that relation's table in ClickHouse (`tables`, made by
    `ClickHouseStore`), each `{twin}` by that aggregation's form (itself composed), and `{spans}` /
    `{step_spans}` by the window's spans, each once (`tables[DUPLICATES]`: the window's duplicated keys). Bound
    parameters (`{name:Type}`) are left as they are."""
    def block(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "spans":
            return spans_sql(table, where, text, tables[DUPLICATES])
        if name == "step_spans":
            return step_spans_sql(table, where, tables[DUPLICATES])
        if name in tables:
            return f"SELECT * FROM {tables[name]}"
        if name in TWINS:  # a twin that reads another's rows (its parameters bound alike)
            return _composed(_text("sql", name), table, where, tables)
        raise KeyError(f"{{{name}}}: no ClickHouse table for it")

    return _BLOCK.sub(block, text)


def relations_read(text: str) -> list[str]:
    """The relations (relations/<name>.sql) that a ClickHouse query text reads, directly or through what it reads,
    each after the ones it reads itself: the order to make them in."""
    out: list[str] = []
    for name in _BLOCK.findall(text):
        inner = _text("relations", name) if name in CLICKHOUSE_RELATIONS else _text("sql", name) if name in TWINS \
            else ""
        for needed in [*relations_read(inner), *([name] if name in CLICKHOUSE_RELATIONS else [])]:
            if needed not in out:
                out.append(needed)
    return out


def relation_sql(name: str, table: str, where: str, tables: Mapping[str, str]) -> str:
    """The ClickHouse form of relation `name` (relations/<name>.sql) over the spans `where` chooses in `table`, the
    relations it reads being the tables `tables` names."""
    return _composed(_text("relations", name), table, where, tables)


def twin_sql(name: str, table: str, where: str, tables: Mapping[str, str]) -> str:
    """The ClickHouse form of aggregation `name` over the spans `where` chooses in `table`, the relations it reads
    being the tables `tables` names. Its parameters are bound (`{name:Type}`)."""
    return _composed(_text("sql", name), table, where, tables)


def plain_columns(rows: pa.Table) -> pa.Table:
    """ClickHouse's Arrow output with its text as strings (chdb returns String columns as binary)."""
    columns = []
    for column in rows.columns:
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            column = pc.cast(column, pa.string())
        elif pa.types.is_list(column.type) and pa.types.is_binary(column.type.value_type):
            column = pc.cast(column, pa.list_(pa.string()))
        columns.append(column)
    return pa.table(columns, names=rows.column_names)
