"""The stored spans as OTLP JSON lines: one `TracesData` per line, as the OpenTelemetry Collector's file exporter
writes them (hex ids, 64-bit integers as decimal strings), so `infertrace ingest`, a Collector's `otlpjsonfile`
receiver or another backend can read them.

Every stored column goes back: the span's fixed fields, each typed `res.<key>` / `attr.<key>` column as the
attribute of its type, and attribute map columns (values kept as text by the store) as string attributes.
Spans are grouped by resource and scope within each line. Re-ingesting the output into an empty store gives
the same span rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa

from infertrace.export import query_text
from infertrace.otlp_files import lines_out
from infertrace.store.values import encode_value

if TYPE_CHECKING:
    from infertrace.store.store import Store

RESOURCE_PREFIX = "res."
ATTRIBUTE_PREFIX = "attr."
MAP_COLUMNS = {"resource_attributes": "resource", "span_attributes": "span"}  # the store's attribute maps
_SKIPPED = {"segment", "source"}  # bookkeeping columns a store may add; not span data


def _encoder(arrow_type: pa.DataType) -> Callable[[Any], dict[str, Any]]:
    """The function that turns a stored value of this column type into an OTLP `AnyValue`."""
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        item = _encoder(arrow_type.value_type)
        return lambda value: {"arrayValue": {"values": [item(v) for v in value if v is not None]}}
    if pa.types.is_boolean(arrow_type):
        return lambda value: {"boolValue": value}
    if pa.types.is_integer(arrow_type):
        return lambda value: {"intValue": str(value)}
    if pa.types.is_floating(arrow_type):
        return lambda value: {"doubleValue": value}
    return lambda value: {"stringValue": str(value)}


class _Columns:
    """Which stored column becomes which part of an OTLP span."""

    def __init__(self, schema: pa.Schema) -> None:
        Typed = list[tuple[str, str, Callable[[Any], dict[str, Any]]]]  # (column, key, encoder)
        self.resource: Typed = []
        self.attributes: Typed = []
        self.maps: list[tuple[str, str]] = []  # (column, "resource" | "span")
        for f in schema:
            if f.name.startswith(RESOURCE_PREFIX):
                self.resource.append((f.name, f.name[len(RESOURCE_PREFIX):], _encoder(f.type)))
            elif f.name.startswith(ATTRIBUTE_PREFIX):
                self.attributes.append((f.name, f.name[len(ATTRIBUTE_PREFIX):], _encoder(f.type)))
            elif f.name in MAP_COLUMNS:
                self.maps.append((f.name, MAP_COLUMNS[f.name]))

    def attrs(self, row: dict[str, Any], typed: list[tuple[str, str, Callable[[Any], dict[str, Any]]]],
              side: str) -> list[dict[str, Any]]:
        out = [{"key": key, "value": encode(row[c])} for c, key, encode in typed if row[c] is not None]
        for column, which in self.maps:
            if which == side and row[column]:
                out += [{"key": k, "value": {"stringValue": v}} for k, v in row[column] if v is not None]
        return out


def _span(row: dict[str, Any], columns: _Columns) -> dict[str, Any]:
    span: dict[str, Any] = {"traceId": row["trace_id"], "spanId": row["span_id"], "name": row["name"],
                            "kind": int(row["kind"]), "startTimeUnixNano": str(row["start_ns"]),
                            "endTimeUnixNano": str(row["end_ns"])}
    if row["parent_span_id"]:
        span["parentSpanId"] = row["parent_span_id"]
    attributes = columns.attrs(row, columns.attributes, "span")
    if attributes:
        span["attributes"] = attributes
    if row.get("events"):
        span["events"] = [{"timeUnixNano": str(e["time_ns"]), "name": e["name"],
                           "attributes": [{"key": k, "value": encode_value(v)}
                                          for k, v in json.loads(e["attributes"] or "{}").items() if v is not None]}
                          for e in row["events"]]
    if row.get("links"):
        span["links"] = json.loads(row["links"])
    status: dict[str, Any] = {}
    if row["status_code"]:
        status["code"] = int(row["status_code"])
    if row.get("status_message"):
        status["message"] = row["status_message"]
    if status:
        span["status"] = status
    return span


def _traces_data(rows: list[dict[str, Any]], columns: _Columns) -> dict[str, Any]:
    resources: dict[str, dict[str, Any]] = {}
    for row in rows:
        resource = columns.attrs(row, columns.resource, "resource")
        key = json.dumps(resource, sort_keys=True)
        entry = resources.setdefault(key, {"resource": {"attributes": resource}, "scopes": {}})
        scope = (row.get("scope_name") or "", row.get("scope_version") or "")
        entry["scopes"].setdefault(scope, []).append(_span(row, columns))
    return {"resourceSpans": [{
        "resource": r["resource"],
        "scopeSpans": [{"scope": {k: v for k, v in (("name", name), ("version", version)) if v},
                        "spans": spans} for (name, version), spans in r["scopes"].items()],
    } for r in resources.values()]}


@contextmanager
def _open_text(out: Path | IO[str]) -> Iterator[IO[str]]:
    if isinstance(out, Path):
        with lines_out(out) as stream:
            yield stream
    else:
        yield out


def write_otlp(store: Store, out: Path | IO[str], since_ns: int | None = None, until_ns: int | None = None,
               spans_per_line: int = 2000, on_progress: Callable[[int], None] | None = None) -> int:
    """Writes the spans overlapping [since, until) (all when None) as OTLP JSON lines (gzip when `out` ends in
    .gz, zstd in .zst); returns the number of spans written."""
    reader = store.sql(query_text("otlp_spans"), params={"since": since_ns, "until": until_ns}) \
        .to_arrow_reader(spans_per_line)
    columns = _Columns(reader.schema)
    written = 0
    with _open_text(out) as stream:
        for batch in reader:
            rows = batch.to_pylist()
            if not rows:
                continue
            for skipped in _SKIPPED & set(rows[0]):
                for r in rows:
                    r.pop(skipped)
            stream.write(json.dumps(_traces_data(rows, columns), separators=(",", ":")) + "\n")
            written += len(rows)
            if on_progress is not None:
                on_progress(len(rows))
    return written
