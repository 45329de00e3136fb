"""From OTLP JSON (`TracesData` / `ExportTraceServiceRequest` as dicts) to columns of the raw span table.

A span that cannot be stored (bad id, bad time, an attribute of the wrong type for its declared key) is
rejected on its own, with a reason; the other spans of the same line or request are kept. A line that is
not a `TracesData` at all is rejected whole by the caller.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from infertrace.store.schema import (
    DECLARED_ATTRIBUTES,
    DECLARED_RESOURCE,
    SPAN_FIELDS,
    VALUE_TYPES,
    attribute_column,
    base_schema,
    resource_column,
)

_HEX_TRACE = re.compile(r"[0-9a-fA-F]{32}")
_HEX_SPAN = re.compile(r"[0-9a-fA-F]{16}")
_INT64_MAX = (1 << 63) - 1


class BadRecord(ValueError):
    """A span or line that cannot be stored; the message is the reason kept in quarantine."""


@dataclass(frozen=True, slots=True)
class Rejection:
    source: str  # file path, or `http <peer>`
    line: int  # 1-based line of the file; 0 for an HTTP body
    reason: str
    record: str  # the rejected line, or the rejected span as JSON


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise BadRecord(f"{what}: expected an integer, got a boolean")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            raise BadRecord(f"{what}: {value[:40]!r} is not an integer") from None
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        raise BadRecord(f"{what}: expected an integer, got {type(value).__name__}")
    return number


def _int64(value: Any, what: str) -> int:
    number = _int(value, what)
    if not -_INT64_MAX - 1 <= number <= _INT64_MAX:
        raise BadRecord(f"{what}: {number} does not fit in 64 bits")
    return number


def _double(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise BadRecord(f"{what}: expected a double, got a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    raise BadRecord(f"{what}: expected a double, got {type(value).__name__}")


def decode_value(value: Any, key: str) -> tuple[str, Any] | None:
    """An OTLP JSON `AnyValue` as (kind, Python value); kinds are those of `schema.VALUE_TYPES`.
    None for an empty value."""
    if not isinstance(value, dict):
        raise BadRecord(f"attribute {key!r}: value is not an object")
    if len(value) == 1:
        ((tag, raw),) = value.items()
    elif not value:
        return None
    else:
        known = [t for t in value if t.endswith("Value")]
        if len(known) != 1:
            raise BadRecord(f"attribute {key!r}: value must have exactly one of stringValue, intValue, ...")
        tag, raw = known[0], value[known[0]]
    if tag == "stringValue":
        if not isinstance(raw, str):
            raise BadRecord(f"attribute {key!r}: stringValue is not a string")
        return "string", raw
    if tag == "intValue":
        return "int", _int64(raw, f"attribute {key!r}")
    if tag == "doubleValue":
        return "double", _double(raw, f"attribute {key!r}")
    if tag == "boolValue":
        if not isinstance(raw, bool):
            raise BadRecord(f"attribute {key!r}: boolValue is not a boolean")
        return "bool", raw
    if tag == "arrayValue":
        values = raw.get("values", []) if isinstance(raw, dict) else None
        if not isinstance(values, list):
            raise BadRecord(f"attribute {key!r}: arrayValue has no values list")
        items = [decode_value(v, key) for v in values]
        kinds = {k for k, _ in filter(None, items)}
        if not kinds:
            return "[]", []
        if len(kinds) == 1 and (kind := kinds.pop()) in VALUE_TYPES and not kind.endswith("]") and kind != "json":
            return kind + "[]", [None if i is None else i[1] for i in items]
        return "json", json.dumps(values, separators=(",", ":"))
    if tag in ("kvlistValue", "bytesValue"):
        return "json", json.dumps({tag: raw}, separators=(",", ":"))
    raise BadRecord(f"attribute {key!r}: unknown value type {tag!r}")


def _coerce(kind: str, value: Any, declared: str, key: str) -> Any:
    """A decoded value converted to a declared column type, or BadRecord."""
    if kind == declared:
        return value
    if kind == "[]" and declared.endswith("[]"):
        return []
    if declared == "double" and kind == "int":
        return float(value)
    if declared == "double[]" and kind == "int[]":
        return [None if v is None else float(v) for v in value]
    raise BadRecord(f"attribute {key!r}: expected {declared}, got {kind}")


def _fast_value(value: dict[str, Any]) -> tuple[str, Any]:
    """The common shapes of `AnyValue`, without checks that `decode_value` makes; raises on anything else
    (the caller then takes the checked path)."""
    ((tag, raw),) = value.items()
    if tag == "stringValue":
        if raw.__class__ is str:
            return "string", raw
    elif tag == "intValue":
        number = int(raw)
        if -_INT64_MAX - 1 <= number <= _INT64_MAX and raw.__class__ is not bool:
            return "int", number
    elif tag == "arrayValue":
        values = raw["values"]
        if not values:
            return "[]", []
        first = next(iter(values[0]))
        if first == "intValue":
            numbers = [int(v["intValue"]) for v in values]
            if min(numbers) >= -_INT64_MAX - 1 and max(numbers) <= _INT64_MAX and all(
                    len(v) == 1 and v["intValue"].__class__ is not bool for v in values):
                return "int[]", numbers
        elif first == "stringValue":
            strings = [v["stringValue"] for v in values]
            if set(map(type, strings)) == {str} and all(len(v) == 1 for v in values):
                return "string[]", strings
        elif first == "boolValue":
            flags = [v["boolValue"] for v in values]
            if set(map(type, flags)) == {bool} and all(len(v) == 1 for v in values):
                return "bool[]", flags
    elif tag == "boolValue":
        if raw.__class__ is bool:
            return "bool", raw
    elif tag == "doubleValue" and raw.__class__ is float:
        return "double", raw
    raise ValueError("not a common shape")


def decode_attributes(attributes: Any, declared: dict[str, str]) -> dict[str, Any]:
    """OTLP JSON `KeyValue` list → {key: (kind, value)}; declared keys are converted to their type."""
    if attributes is None:
        return {}
    if not isinstance(attributes, list):
        raise BadRecord("attributes is not a list")
    out: dict[str, Any] = {}
    for kv in attributes:
        try:
            key = kv["key"]
            kind, value = _fast_value(kv["value"])
            want = declared.get(key)
            if (want is None or want == kind) and key.__class__ is str:
                out[key] = (kind, value)
                continue
        except (KeyError, TypeError, ValueError, AttributeError, StopIteration):
            pass
        if not isinstance(kv, dict) or not isinstance(key := kv.get("key"), str):
            raise BadRecord("an attribute has no string key")
        decoded = decode_value(kv.get("value", {}), key)
        if decoded is None:
            continue
        kind, value = decoded
        want = declared.get(key)
        if want is not None:
            out[key] = (want, _coerce(kind, value, want, key))
        else:
            out[key] = (kind, value)
    return out


def _hex_id(value: Any, pattern: re.Pattern[str], what: str, required: bool) -> str | None:
    if value is None or value == "":
        if required:
            raise BadRecord(f"{what} is missing")
        return None
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise BadRecord(f"{what} {str(value)[:40]!r} is not {pattern.pattern.split('{')[1][:-1]} hex digits")
    value = value.lower()
    if value.strip("0") == "":
        if required:
            raise BadRecord(f"{what} is all zeros")
        return None
    return value


def _time(value: Any, what: str) -> int:
    number = _int(value if value is not None else 0, what)
    if not 0 <= number <= _INT64_MAX:
        raise BadRecord(f"{what}: {number} is outside 0..2^63-1 ns")
    return number


def _events(events: Any) -> list[dict[str, Any]] | None:
    if not events:
        return None
    if not isinstance(events, list):
        raise BadRecord("events is not a list")
    out = []
    for event in events:
        if not isinstance(event, dict):
            raise BadRecord("an event is not an object")
        attributes = decode_attributes(event.get("attributes"), {})
        name = event.get("name", "")
        if not isinstance(name, str):
            raise BadRecord("an event name is not a string")
        out.append({"time_ns": _time(event.get("timeUnixNano"), "event timeUnixNano"), "name": name,
                    "attributes": json.dumps({k: v for k, (_, v) in attributes.items()}, separators=(",", ":"))})
    return out


@dataclass(slots=True)
class _Column:
    rows: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)


class SpanBatch:
    """Accumulates spans as columns; `table()` turns them into one Arrow table."""

    def __init__(self) -> None:
        self.num_spans = 0
        self._fields: dict[str, list[Any]] = {f.name: [] for f in SPAN_FIELDS}
        self._attributes: dict[str, _Column] = {}
        # (first row, row after the last, decoded resource attributes) per resource
        self._resources: list[tuple[int, int, dict[str, Any]]] = []
        self.rejections: list[Rejection] = []

    def __len__(self) -> int:
        return self.num_spans

    def add_traces_data(self, data: Any, source: str, line: int) -> None:
        """Adds every span of one `TracesData` (or `ExportTraceServiceRequest`), rejecting bad spans one by
        one. Raises BadRecord when `data` is not a `TracesData` at all."""
        mark = (self.num_spans, len(self._resources), len(self.rejections))
        try:
            self._add_traces_data(data, source, line)
        except BadRecord:
            self._rollback(*mark)
            raise

    def _rollback(self, num_spans: int, num_resources: int, num_rejections: int) -> None:
        for values in self._fields.values():
            del values[num_spans:]
        for column in self._attributes.values():
            keep = len(column.rows)
            while keep and column.rows[keep - 1] >= num_spans:
                keep -= 1
            del column.rows[keep:], column.kinds[keep:], column.values[keep:]
        del self._resources[num_resources:], self.rejections[num_rejections:]
        self.num_spans = num_spans

    def _add_traces_data(self, data: Any, source: str, line: int) -> None:
        if not isinstance(data, dict):
            raise BadRecord("not a JSON object")
        resource_spans = data.get("resourceSpans", data.get("resource_spans"))
        if resource_spans is None:
            raise BadRecord("no resourceSpans")
        if not isinstance(resource_spans, list):
            raise BadRecord("resourceSpans is not a list")
        for rs in resource_spans:
            if not isinstance(rs, dict):
                raise BadRecord("a resourceSpans entry is not an object")
            resource = rs.get("resource") or {}
            if not isinstance(resource, dict):
                raise BadRecord("resource is not an object")
            resource_attributes = decode_attributes(resource.get("attributes"), DECLARED_RESOURCE)
            first = self.num_spans
            scope_spans = rs.get("scopeSpans", rs.get("scope_spans")) or []
            if not isinstance(scope_spans, list):
                raise BadRecord("scopeSpans is not a list")
            for ss in scope_spans:
                if not isinstance(ss, dict):
                    raise BadRecord("a scopeSpans entry is not an object")
                scope = ss.get("scope") or {}
                if not isinstance(scope, dict):
                    raise BadRecord("scope is not an object")
                scope_name, scope_version = scope.get("name"), scope.get("version")
                spans = ss.get("spans") or []
                if not isinstance(spans, list):
                    raise BadRecord("spans is not a list")
                for span in spans:
                    try:
                        self._add_span(span, scope_name, scope_version)
                    except BadRecord as e:
                        self.rejections.append(Rejection(source, line, str(e), _dump(span)))
            if self.num_spans > first:
                self._resources.append((first, self.num_spans, resource_attributes))

    def _add_span(self, span: Any, scope_name: Any, scope_version: Any) -> None:
        if not isinstance(span, dict):
            raise BadRecord("a span is not an object")
        trace_id = _hex_id(span.get("traceId"), _HEX_TRACE, "traceId", True)
        span_id = _hex_id(span.get("spanId"), _HEX_SPAN, "spanId", True)
        parent = _hex_id(span.get("parentSpanId"), _HEX_SPAN, "parentSpanId", False)
        name = span.get("name", "")
        if not isinstance(name, str):
            raise BadRecord("name is not a string")
        kind = _int(span.get("kind", 0), "kind")
        if not 0 <= kind <= 5:
            raise BadRecord(f"kind {kind} is not a SpanKind")
        start = _time(span.get("startTimeUnixNano"), "startTimeUnixNano")
        end = _time(span.get("endTimeUnixNano"), "endTimeUnixNano")
        status = span.get("status") or {}
        if not isinstance(status, dict):
            raise BadRecord("status is not an object")
        code = _int(status.get("code", 0), "status code")
        if not 0 <= code <= 2:
            raise BadRecord(f"status code {code} is not 0, 1 or 2")
        message = status.get("message") or None
        if message is not None and not isinstance(message, str):
            raise BadRecord("status message is not a string")
        attributes = decode_attributes(span.get("attributes"), DECLARED_ATTRIBUTES)
        events = _events(span.get("events"))
        links = span.get("links")
        links_json = _dump(links) if links else None
        if not isinstance(scope_name, str | None) or not isinstance(scope_version, str | None):
            raise BadRecord("scope name or version is not a string")
        row = self.num_spans
        f = self._fields
        f["trace_id"].append(trace_id)
        f["span_id"].append(span_id)
        f["parent_span_id"].append(parent)
        f["name"].append(name)
        f["kind"].append(kind)
        f["start_ns"].append(start)
        f["end_ns"].append(end)
        f["status_code"].append(code)
        f["status_message"].append(message)
        f["scope_name"].append(scope_name)
        f["scope_version"].append(scope_version)
        f["events"].append(events)
        f["links"].append(links_json)
        columns = self._attributes
        for key, (kind_, value) in attributes.items():
            column = columns.get(key)
            if column is None:
                column = columns[key] = _Column()
            column.rows.append(row)
            column.kinds.append(kind_)
            column.values.append(value)
        self.num_spans = row + 1

    def table(self) -> pa.Table:
        """The spans so far, as a table with the base schema plus a column per undeclared key."""
        n = self.num_spans
        schema = base_schema()
        arrays: dict[str, pa.Array] = {}
        for f in SPAN_FIELDS:
            arrays[f.name] = pa.array(self._fields[f.name], type=f.type)
        resource_keys: dict[str, None] = dict.fromkeys(DECLARED_RESOURCE)
        for _, _, attrs in self._resources:
            resource_keys.update(dict.fromkeys(attrs))
        for key in resource_keys:
            kinds, values, counts = [], [], []
            for first, last, attrs in self._resources:
                kind, value = attrs.get(key, (None, None))
                kinds.append(kind)
                values.append(value)
                counts.append(last - first)
            declared = DECLARED_RESOURCE.get(key)
            array = _typed_array(kinds, values, declared)
            arrays[resource_column(key)] = array.take(pa.array(np.repeat(np.arange(len(values)), counts)))
        attribute_keys: dict[str, None] = dict.fromkeys(DECLARED_ATTRIBUTES)
        attribute_keys.update(dict.fromkeys(self._attributes))
        for key in attribute_keys:
            column = self._attributes.get(key, _Column())
            array = _typed_array(column.kinds, column.values, DECLARED_ATTRIBUTES.get(key))
            index = np.full(n, -1, dtype=np.int64)
            index[np.asarray(column.rows, dtype=np.int64)] = np.arange(len(column.rows))
            arrays[attribute_column(key)] = array.take(pa.array(index, mask=index < 0))
        fields = list(schema) + [pa.field(name, arrays[name].type) for name in arrays if name not in schema.names]
        return pa.Table.from_arrays([arrays[f.name] for f in fields], schema=pa.schema(fields))


def _typed_array(kinds: list[str | None], values: list[Any], declared: str | None) -> pa.Array:
    if declared is not None:
        return pa.array(values, type=VALUE_TYPES[declared])
    present = {k for k in kinds if k is not None and k != "[]"}
    empty_lists = "[]" in kinds
    if len(present) == 1 and (not empty_lists or next(iter(present)).endswith("[]")):
        kind = present.pop()
        return pa.array([[] if k == "[]" else v for k, v in zip(kinds, values, strict=True)], type=VALUE_TYPES[kind])
    if not present and any(k == "[]" for k in kinds):
        return pa.array(values, type=pa.list_(pa.string()))
    if not present:
        return pa.nulls(len(values), pa.string())
    return pa.array([None if k is None else v if k == "json" else json.dumps(v) for k, v in zip(kinds, values,
                                                                                                 strict=True)],
                    type=pa.string())


def _dump(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
