"""From OTLP JSON (`TracesData` / `ExportTraceServiceRequest` as dicts) to columns of the raw span table.

A span that cannot be stored (a bad id, a missing or impossible time, an end before its start, text that is
not valid Unicode) is rejected on its own, with a reason; the other spans of the same line or request are
kept. A line that is not a `TracesData` at all is rejected whole by the caller. An attribute never rejects a
span: a value of a declared key in another type is converted when its meaning is clear, otherwise kept as
text in the attribute map, and values over the limits are truncated or dropped (`values`); `notes` counts
each of these per span row.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa

from infertrace.store.content import is_content, without_content
from infertrace.store.json_forms import SPAN_KINDS, STATUS_CODES, base64_id, enum_value, resource_spans
from infertrace.store.schema import (
    DECLARED_ATTRIBUTES,
    DECLARED_RESOURCE,
    MAP_TYPE,
    RESOURCE_MAP,
    SCHEMA,
    SPAN_FIELDS,
    SPAN_MAP,
    VALUE_TYPES,
    attribute_column,
    resource_column,
)
from infertrace.store.values import (
    CONVERTED,
    DROPPED,
    KEPT_AS_TEXT,
    MAX_ATTRIBUTES,
    MAX_EVENTS,
    MAX_KEY_CHARS,
    MAX_NAME_CHARS,
    MAX_VALUE_CHARS,
    REDACTED,
    TRUNCATED,
    BadRecord,
    NotConvertible,
    Notes,
    Unconverted,
    as_text,
    check_text,
    convert,
    decode_value,
    fast_value,
)

__all__ = ["MIN_START_NS", "BadRecord", "Rejection", "SpanBatch", "other_signal", "split_attributes"]

_HEX_TRACE = re.compile(r"[0-9a-fA-F]{32}")
_HEX_SPAN = re.compile(r"[0-9a-fA-F]{16}")
_INT64_MAX = (1 << 63) - 1
MIN_START_NS: Final = 946_684_800 * 10**9  # 2000-01-01T00:00:00Z: an earlier start is a clock never set
_MAX_PLAUSIBLE_NS: Final = 4_102_444_800 * 10**9  # 2100-01-01
_OTHER_UNITS: Final = (("microseconds", 10**3), ("milliseconds", 10**6), ("seconds", 10**9))
LONG_KEYS: Final = f"<keys over {MAX_KEY_CHARS} characters>"
EXTRA_KEYS: Final = f"<attributes past {MAX_ATTRIBUTES}>"
EXTRA_EVENTS: Final = f"<events past {MAX_EVENTS}>"
SPAN_NAME: Final = "<span name>"
STATUS_MESSAGE: Final = "<status message>"


@dataclass(frozen=True, slots=True)
class Rejection:
    source: str  # file path, or `http <peer>` / `grpc <peer>`
    line: int  # 1-based line of the file; 0 for a request body
    reason: str
    record: str  # the rejected line, or the rejected span as JSON


def _truncated(text: str, key: str, notes: list[tuple[str, str]]) -> str:
    if len(text) > MAX_VALUE_CHARS:
        notes.append((TRUNCATED, key))
        return text[:MAX_VALUE_CHARS]
    return text


def _decoded(kv: Any) -> tuple[str, str, Any] | None:
    """(key, kind, value) of one OTLP JSON `KeyValue`; None for an empty value."""
    try:
        key = kv["key"]
        kind, value = fast_value(kv["value"])
        if key.__class__ is str and key.isascii():
            return key, kind, value
    except (KeyError, TypeError, ValueError, AttributeError, StopIteration):
        pass
    if not isinstance(kv, dict) or not isinstance(key := kv.get("key"), str):
        raise BadRecord("an attribute has no string key")
    check_text(key, "an attribute key")
    decoded = decode_value(kv.get("value", {}), key)
    return None if decoded is None else (key, *decoded)


def split_attributes(attributes: Any, declared: dict[str, str]
                     ) -> tuple[dict[str, Any], dict[str, str], list[tuple[str, str]]]:
    """An OTLP JSON `KeyValue` list → (declared key → value of its declared type, other key → text for the
    attribute map, notes as (what, key)). Raises BadRecord only when the list itself is malformed."""
    if attributes is None:
        return {}, {}, []
    if not isinstance(attributes, list):
        raise BadRecord("attributes is not a list")
    typed: dict[str, Any] = {}
    other: dict[str, str] = {}
    notes: list[tuple[str, str]] = []
    for kv in attributes:
        decoded = _decoded(kv)
        if decoded is None:
            continue
        key, kind, value = decoded
        want = declared.get(key)
        if want is None and is_content(key):
            notes.append((REDACTED, key))
            continue
        if want is not None:
            if kind != want:
                try:
                    value = convert(kind, value, want)
                except NotConvertible:
                    other[key] = _truncated(as_text(kind, value), key, notes)
                    notes.append((KEPT_AS_TEXT, key))
                    continue
                if kind != "[]":
                    notes.append((CONVERTED, key))
            if want == "string":
                value = _truncated(value, key, notes)
            elif want == "string[]" and any(v is not None and len(v) > MAX_VALUE_CHARS for v in value):
                value = [v if v is None else v[:MAX_VALUE_CHARS] for v in value]
                notes.append((TRUNCATED, key))
            typed[key] = value
        elif len(key) > MAX_KEY_CHARS:
            notes.append((DROPPED, LONG_KEYS))
        elif key not in other and len(other) >= MAX_ATTRIBUTES:
            notes.append((DROPPED, EXTRA_KEYS))
        else:
            other[key] = _truncated(as_text(kind, value), key, notes)
    return typed, other, notes


def event_attributes(attributes: Any, notes: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """An event's attributes as {key: value} (kept whole, as JSON text in the `events` column), without prompt or
    completion text (each left out noted in `notes`)."""
    if attributes is None:
        return {}
    if not isinstance(attributes, list):
        raise BadRecord("attributes is not a list")
    out: dict[str, Any] = {}
    for kv in attributes:
        decoded = _decoded(kv)
        if decoded is None:
            continue
        if is_content(decoded[0]):
            if notes is not None:
                notes.append((REDACTED, decoded[0]))
            continue
        out[decoded[0]] = decoded[2]
    return out


def _hex_id(value: Any, pattern: re.Pattern[str], what: str, required: bool) -> str | None:
    if value is None or value == "":
        if required:
            raise BadRecord(f"{what} is missing")
        return None
    if isinstance(value, str) and pattern.fullmatch(value):
        value = value.lower()
    else:
        digits = int(pattern.pattern.split("{")[1][:-1])
        decoded = base64_id(value, digits // 2) if isinstance(value, str) else None
        if decoded is None:
            raise BadRecord(f"{what} {str(value)[:40]!r} is neither {digits} hex digits nor base64 of {digits // 2} "
                            "bytes")
        value = decoded
    if value.strip("0") == "":
        if required:
            raise BadRecord(f"{what} is all zeros")
        return None
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise BadRecord(f"{what}: expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            raise BadRecord(f"{what}: {value[:40]!r} is not an integer") from None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise BadRecord(f"{what}: expected an integer, got {type(value).__name__}")


def _time(value: Any, what: str) -> int:
    number = _int(value if value is not None else 0, what)
    if not 0 <= number <= _INT64_MAX:
        raise BadRecord(f"{what}: {number} is outside 0..2^63-1 ns")
    return number


def _span_times(span: dict[str, Any]) -> tuple[int, int]:
    start = _time(span.get("startTimeUnixNano"), "startTimeUnixNano")
    end = _time(span.get("endTimeUnixNano"), "endTimeUnixNano")
    if start < MIN_START_NS:
        unit = next((name for name, scale in _OTHER_UNITS if MIN_START_NS <= start * scale < _MAX_PLAUSIBLE_NS), None)
        if unit is not None:  # one reason for every such span: the summary counts them together
            raise BadRecord(f"startTimeUnixNano counts {unit}, not nanoseconds (read so, it falls between 2000 "
                            "and 2100): the exporter writes the wrong unit")
        raise BadRecord("startTimeUnixNano is before 2000-01-01 (missing, or a clock that was not set)")
    if end < start:
        raise BadRecord("endTimeUnixNano is before startTimeUnixNano")
    return start, end


def _events(events: Any, notes: list[tuple[str, str]]) -> list[dict[str, Any]] | None:
    if not events:
        return None
    if not isinstance(events, list):
        raise BadRecord("events is not a list")
    out = []
    for event in events[:MAX_EVENTS]:
        if not isinstance(event, dict):
            raise BadRecord("an event is not an object")
        attributes = event_attributes(event.get("attributes"), notes)
        name = event.get("name", "")
        if not isinstance(name, str):
            raise BadRecord("an event name is not a string")
        out.append({"time_ns": _time(event.get("timeUnixNano"), "event timeUnixNano"),
                    "name": check_text(name, "an event name"),
                    "attributes": json.dumps(attributes, separators=(",", ":"))})
    notes.extend([(DROPPED, EXTRA_EVENTS)] * max(0, len(events) - MAX_EVENTS))
    return out


@dataclass(slots=True)
class _Column:
    rows: list[int] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)


_OTHER_SIGNALS: Final = {"resourceMetrics": "metrics", "resource_metrics": "metrics", "resourceLogs": "logs",
                         "resource_logs": "logs", "resourceProfiles": "profiles", "resource_profiles": "profiles"}


def other_signal(data: Any) -> str | None:
    """'metrics', 'logs' or 'profiles' when `data` is OTLP JSON of that signal and holds no spans: not an error
    but not traces (a Collector's file exporter in several pipelines writes every signal into one file)."""
    if not isinstance(data, dict) or "resourceSpans" in data or "resource_spans" in data:
        return None
    return next((name for key, name in _OTHER_SIGNALS.items() if key in data), None)


class SpanBatch:
    """Accumulates spans as columns; `table()` turns them into one Arrow table with the store's schema."""

    def __init__(self) -> None:
        self.num_spans = 0
        self._fields: dict[str, list[Any]] = {f.name: [] for f in SPAN_FIELDS}
        self._attributes: dict[str, _Column] = {}
        self._maps: list[list[tuple[str, str]]] = []
        # (first row, row after the last, typed attributes, attribute map) per resource
        self._resources: list[tuple[int, int, dict[str, Any], dict[str, str]]] = []
        self.rejections: list[Rejection] = []
        self.notes = Notes()

    def __len__(self) -> int:
        return self.num_spans

    def add_traces_data(self, data: Any, source: str, line: int) -> None:
        """Adds every span of one `TracesData` (or `ExportTraceServiceRequest`, or any form `json_forms` reads),
        rejecting bad spans one by one. Raises BadRecord when `data` is not a trace at all."""
        mark = (self.num_spans, len(self._resources), len(self.rejections), len(self.notes))
        try:
            self._add_traces_data(data, source, line)
        except BadRecord:
            self._rollback(*mark)
            raise

    def _rollback(self, num_spans: int, num_resources: int, num_rejections: int, num_notes: int) -> None:
        for values in self._fields.values():
            del values[num_spans:]
        del self._maps[num_spans:]
        for column in self._attributes.values():
            keep = len(column.rows)
            while keep and column.rows[keep - 1] >= num_spans:
                keep -= 1
            del column.rows[keep:], column.values[keep:]
        del self._resources[num_resources:], self.rejections[num_rejections:]
        self.notes.rollback(num_notes)
        self.num_spans = num_spans

    def _add_traces_data(self, data: Any, source: str, line: int) -> None:
        for rs in resource_spans(data):
            if not isinstance(rs, dict):
                raise BadRecord("a resourceSpans entry is not an object")
            resource = rs.get("resource") or {}
            if not isinstance(resource, dict):
                raise BadRecord("resource is not an object")
            typed, other, resource_notes = split_attributes(resource.get("attributes"), DECLARED_RESOURCE)
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
                        self.rejections.append(Rejection(source, line, str(e), _dump(without_content(span))))
            if self.num_spans > first:
                self._resources.append((first, self.num_spans, typed, other))
                for what, key in resource_notes:
                    self.notes.add(range(first, self.num_spans), what, key)

    def _add_span(self, span: Any, scope_name: Any, scope_version: Any) -> None:
        if not isinstance(span, dict):
            raise BadRecord("a span is not an object")
        if isinstance(span, Unconverted):
            raise BadRecord(span.reason)
        trace_id = _hex_id(span.get("traceId"), _HEX_TRACE, "traceId", True)
        span_id = _hex_id(span.get("spanId"), _HEX_SPAN, "spanId", True)
        parent = _hex_id(span.get("parentSpanId"), _HEX_SPAN, "parentSpanId", False)
        notes: list[tuple[str, str]] = []
        name = span.get("name", "")
        if not isinstance(name, str):
            raise BadRecord("name is not a string")
        name = check_text(name, "name")
        if len(name) > MAX_NAME_CHARS:
            name = name[:MAX_NAME_CHARS]
            notes.append((TRUNCATED, SPAN_NAME))
        kind = _int(enum_value(span.get("kind", 0), SPAN_KINDS), "kind")
        if not 0 <= kind <= 5:
            raise BadRecord(f"kind {kind} is not a SpanKind")
        start, end = _span_times(span)
        status = span.get("status") or {}
        if not isinstance(status, dict):
            raise BadRecord("status is not an object")
        code = _int(enum_value(status.get("code", 0), STATUS_CODES), "status code")
        if not 0 <= code <= 2:
            raise BadRecord(f"status code {code} is not 0, 1 or 2")
        message = status.get("message") or None
        if message is not None:
            if not isinstance(message, str):
                raise BadRecord("status message is not a string")
            message = _truncated(check_text(message, "status message"), STATUS_MESSAGE, notes)
        typed, other, attribute_notes = split_attributes(span.get("attributes"), DECLARED_ATTRIBUTES)
        events = _events(span.get("events"), notes)
        links = span.get("links")
        links_json = _dump(links) if links else None
        if not isinstance(scope_name, str | None) or not isinstance(scope_version, str | None):
            raise BadRecord("scope name or version is not a string")
        for text in (scope_name, scope_version):
            if text is not None:
                check_text(text, "scope name or version")
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
        self._maps.append(list(other.items()))
        columns = self._attributes
        for key, value in typed.items():
            column = columns.get(key)
            if column is None:
                column = columns[key] = _Column()
            column.rows.append(row)
            column.values.append(value)
        for what, key in (*notes, *attribute_notes):
            self.notes.add((row,), what, key)
        self.num_spans = row + 1

    def table(self) -> pa.Table:
        """The spans so far, as a table with the store's schema (`schema.SCHEMA`)."""
        n = self.num_spans
        arrays: dict[str, pa.Array] = {}
        for f in SPAN_FIELDS:
            arrays[f.name] = pa.array(self._fields[f.name], type=f.type)
        per_resource = [last - first for first, last, _, _ in self._resources]
        resource_index = pa.array(np.repeat(np.arange(len(per_resource)), per_resource), type=pa.int64())
        arrays[RESOURCE_MAP] = pa.array([list(other.items()) for _, _, _, other in self._resources],
                                        type=MAP_TYPE).take(resource_index)
        arrays[SPAN_MAP] = pa.array(self._maps, type=MAP_TYPE)
        for key, declared in DECLARED_RESOURCE.items():
            values = pa.array([typed.get(key) for _, _, typed, _ in self._resources], type=VALUE_TYPES[declared])
            arrays[resource_column(key)] = values.take(resource_index)
        for key, declared in DECLARED_ATTRIBUTES.items():
            column = self._attributes.get(key)
            if column is None:
                arrays[attribute_column(key)] = pa.nulls(n, VALUE_TYPES[declared])
                continue
            index = np.full(n, -1, dtype=np.int64)
            index[np.asarray(column.rows, dtype=np.int64)] = np.arange(len(column.rows))
            values = pa.array(column.values, type=VALUE_TYPES[declared])
            arrays[attribute_column(key)] = values.take(pa.array(index, mask=index < 0))
        return pa.Table.from_arrays([arrays[f.name] for f in SCHEMA], schema=SCHEMA)


def _dump(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(value)
