"""The fast path of file ingest: a block of OTLP JSON lines parsed by Arrow's C++ JSON reader into nested
columns, then flattened and pivoted into the raw span table with vectorised compute.

It handles well-formed data in the shape the Collector's file exporter writes. Anything else in a block
(a line that is not JSON, a value of an unexpected type, an id that is not hex, an attribute value with
two or no fields, bytes or key-value lists, span links, a key repeated in one span) makes `decode_block`
return None, and the caller parses that block with `batch.SpanBatch`, which rejects bad records one by one
with a reason. Both produce the same table for the same spans (a test checks it).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from infertrace.store.batch import MIN_START_NS, BadRecord, event_attributes, split_attributes
from infertrace.store.content import is_content
from infertrace.store.schema import (
    DECLARED_ATTRIBUTES,
    DECLARED_RESOURCE,
    EVENT_TYPE,
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
    MAX_ATTRIBUTES,
    MAX_EVENTS,
    MAX_KEY_CHARS,
    MAX_NAME_CHARS,
    MAX_VALUE_CHARS,
    REDACTED,
    NotConvertible,
    Notes,
    as_text,
    convert,
)

_SCALARS = [pa.field("stringValue", pa.string()), pa.field("intValue", pa.string()),
            pa.field("doubleValue", pa.float64()), pa.field("boolValue", pa.bool_())]
_ANY = pa.struct([*_SCALARS, pa.field("arrayValue", pa.struct([pa.field("values", pa.list_(pa.struct(_SCALARS)))])),
                  pa.field("kvlistValue", pa.struct([])), pa.field("bytesValue", pa.string())])
_KEY_VALUES = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", _ANY)]))
_SPAN = pa.struct([
    ("traceId", pa.string()), ("spanId", pa.string()), ("parentSpanId", pa.string()), ("name", pa.string()),
    ("kind", pa.int64()), ("startTimeUnixNano", pa.string()), ("endTimeUnixNano", pa.string()),
    ("attributes", _KEY_VALUES),
    ("events", pa.list_(pa.struct([("timeUnixNano", pa.string()), ("name", pa.string()),
                                   ("attributes", _KEY_VALUES)]))),
    ("links", pa.list_(pa.struct([("traceId", pa.string())]))),
    ("status", pa.struct([("code", pa.int64()), ("message", pa.string())])),
])
OTLP_SCHEMA = pa.schema([("resourceSpans", pa.list_(pa.struct([
    ("resource", pa.struct([("attributes", _KEY_VALUES)])),
    ("scopeSpans", pa.list_(pa.struct([("scope", pa.struct([("name", pa.string()), ("version", pa.string())])),
                                       ("spans", pa.list_(_SPAN))]))),
])))])
_PARSE = pj.ParseOptions(explicit_schema=OTLP_SCHEMA, unexpected_field_behavior="ignore")
_KIND_OF_FIELD = {"stringValue": "string", "intValue": "int", "doubleValue": "double", "boolValue": "bool"}


class _Fallback(Exception):
    """The block needs the record-by-record path."""


def decode_block(data: bytes, longest_line: int) -> tuple[pa.Table, Notes] | None:
    """A block of complete, non-blank OTLP JSON lines → (the raw span table, its notes), or None when the
    block needs the slower record-by-record path. Arrow parses the block in chunks of whole lines on its
    threads."""
    parsed = parse_block(data, longest_line)
    return None if parsed is None else spans_table(parsed)


_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError, OverflowError)


def parse_block(data: bytes, longest_line: int) -> pa.Table | None:
    """The first half of `decode_block`: Arrow's JSON reader (C++, on its own threads, without the GIL)
    → one row per line with the nested OTLP columns; None when Arrow cannot read the block as OTLP, or when a
    line does not start with `{` (no such line is an OTLP object, and Arrow 26's reader crashes the process on a
    line that is a bare `null` instead of raising: the record path rejects those lines one by one)."""
    return _read_full(data, longest_line) if _every_line_an_object(data) else None


def _read_full(data: bytes | memoryview, longest_line: int) -> pa.Table | None:
    try:
        return _read(data, longest_line, _PARSE)
    except _ARROW_ERRORS:
        return None


def _read(data: bytes | memoryview, longest_line: int, parse: pj.ParseOptions) -> pa.Table:
    options = pj.ReadOptions(block_size=max(longest_line + 1, 4 << 20), use_threads=True)
    return pj.read_json(pa.BufferReader(data), read_options=options, parse_options=parse)  # zero copy


class BlockParser:
    """`parse_block` for the blocks of one ingest, in order: after the first block, a block is first read with
    the OTLP schema less the fields that no value of an earlier block set.

    Nearly all of Arrow's cost is building the nested columns, much of it for fields nothing sets (every
    attribute value is a struct of seven AnyValue fields, of which it sets one). The narrow read refuses any
    field it does not declare (`unexpected_field_behavior="error"`), so when it succeeds no line of the block
    has a field it left out, and its table cast to the full schema is the one the full schema gives. A block it
    refuses (a new field, a value of another type, a field the full schema ignores) is read again with the full
    schema, and the fields it sets are added to the narrow schema. When they add none, the narrow schema also
    declares the OTLP fields ingest does not read (`_UNREAD`: the Collector writes `flags` on every span), which
    the cast drops again; when a block is refused after that, the narrow read is dropped for the rest of the
    ingest (it would be refused again)."""

    def __init__(self) -> None:
        self._set: set[tuple[str, ...]] | None = None  # the fields set so far, as paths of field names
        self._unread = False  # whether the narrow schema declares `_UNREAD`
        self._narrow: pj.ParseOptions | None = None

    def parse(self, data: bytes | memoryview, longest_line: int, objects: bool | None = None) -> pa.Table | None:
        """`objects`: whether every line starts with `{`, when the caller knows (`ingest._Lines` notes it
        while it finds the lines); None: checked here."""
        if not (_every_line_an_object(bytes(data)) if objects is None else objects):
            return None
        refused = False
        if self._narrow is not None:
            try:
                return _read(data, longest_line, self._narrow).cast(OTLP_SCHEMA)
            except _ARROW_ERRORS:
                refused = True
        table = _read_full(data, longest_line)
        if table is None:
            return None
        if self._set is None or self._narrow is not None:
            lines = table.column("resourceSpans")
            paths = set(self._set or ())
            for chunk in lines.chunks:
                paths |= _set_paths(chunk, lines.type, ("resourceSpans",))
            if refused and paths == self._set and self._unread:
                self._narrow = None
                return table
            self._unread |= refused and paths == self._set
            self._set = paths
            narrow = _narrowed(lines.type, paths, ("resourceSpans",), _UNREAD if self._unread else {})
            self._narrow = pj.ParseOptions(explicit_schema=pa.schema([("resourceSpans", narrow)]),
                                           unexpected_field_behavior="error")
        return table


_SPAN_PATH = ("resourceSpans", "scopeSpans", "spans")
_UNREAD: dict[tuple[str, ...], list[tuple[str, pa.DataType]]] = {  # by the path of their struct
    ("resourceSpans",): [("schemaUrl", pa.string())],
    ("resourceSpans", "resource"): [("droppedAttributesCount", pa.int64())],
    ("resourceSpans", "scopeSpans"): [("schemaUrl", pa.string())],
    ("resourceSpans", "scopeSpans", "scope"): [("droppedAttributesCount", pa.int64())],
    _SPAN_PATH: [("traceState", pa.string()), ("flags", pa.int64()), ("droppedAttributesCount", pa.int64()),
                 ("droppedEventsCount", pa.int64()), ("droppedLinksCount", pa.int64())],
    (*_SPAN_PATH, "events"): [("droppedAttributesCount", pa.int64())],
}


def _set_paths(values: pa.Array, type_: pa.DataType, path: tuple[str, ...]) -> set[tuple[str, ...]]:
    """The paths of the struct fields under `path` (of type `type_`, the type of `values`) that at least one of
    `values` may set (a child's values are read whole, without its parent's nulls: zero-copy, and never fewer
    than the set ones); every field under a type of no values counts as set."""
    paths: set[tuple[str, ...]] = set()
    if pa.types.is_struct(type_):
        for i, f in enumerate(type_):
            child = values.field(i)
            if not len(values) or child.null_count < len(child):
                paths.add((*path, f.name))
                paths |= _set_paths(child, f.type, (*path, f.name))
    elif pa.types.is_list(type_):
        paths |= _set_paths(values.values, type_.value_type, path)
    return paths


def _narrowed(type_: pa.DataType, paths: set[tuple[str, ...]], path: tuple[str, ...],
              unread: dict[tuple[str, ...], list[tuple[str, pa.DataType]]]) -> pa.DataType:
    """`type_` (at `path`) with only the struct fields in `paths`, and the `unread` ones of its structs."""
    if pa.types.is_struct(type_):
        return pa.struct([pa.field(f.name, _narrowed(f.type, paths, (*path, f.name), unread)) for f in type_
                          if (*path, f.name) in paths] + [pa.field(*f) for f in unread.get(path, [])])
    if pa.types.is_list(type_):
        return pa.list_(_narrowed(type_.value_type, paths, path, unread))
    return type_


def _every_line_an_object(data: bytes) -> bool:
    """Whether every line of the block starts with `{`: the first byte is one and so is the byte after every
    newline but a final one. Two searches of the bytes, ≈ 4.5% of an ingest as was the byte mask before them,
    so ingest does not call this: its line reader notes the answer while it finds the lines (`ingest._Lines`)."""
    if not data:
        return True
    return data[:1] == b"{" and data.count(b"\n{") == data.count(b"\n") - data.endswith(b"\n")


def spans_table(parsed: pa.Table) -> tuple[pa.Table, Notes] | None:
    """The second half of `decode_block`: parsed lines → (the raw span table, its notes), or None
    (record-by-record)."""
    try:
        return _spans_table(parsed)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, _Fallback, BadRecord, ValueError,
            OverflowError):
        return None


def _flatten(lists: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(the items of a list column, for each item the index of its list)."""
    array = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    return array.flatten(), pc.list_parent_indices(array).to_numpy()


_HEX_DIGIT = np.zeros(256, dtype=bool)
_HEX_DIGIT[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = True


def _all_lower_hex(ids: pa.Array, digits: int) -> bool:
    """Whether every id (no nulls) is exactly `digits` lowercase hex digits."""
    if not len(ids):
        return True
    lengths = pc.binary_length(ids)
    if pc.min(lengths).as_py() != digits or pc.max(lengths).as_py() != digits:
        return False
    offsets, data = ids.buffers()[1:3]
    first = int(np.frombuffer(offsets, dtype=np.int32, count=1, offset=4 * ids.offset)[0])
    return bool(_HEX_DIGIT[np.frombuffer(data, dtype=np.uint8, count=digits * len(ids), offset=first)].all())


def _hex(ids: pa.Array, digits: int, required: bool) -> pa.Array:
    zero = "0" * digits
    if required:
        if ids.null_count or not _all_lower_hex(ids, digits) or pc.any(pc.equal(ids, zero)).as_py():
            raise _Fallback
        return ids
    empty = pc.fill_null(pc.equal(ids, ""), False)
    ids = pc.if_else(empty, pa.scalar(None, pa.string()), ids)  # proto3 JSON: "" is no parent
    present = ids.drop_null() if ids.null_count else ids
    if not _all_lower_hex(present, digits) or pc.any(pc.equal(present, zero)).as_py():
        raise _Fallback
    return ids


def _decimal(strings: pa.Array) -> pa.Array:
    """Decimal integer strings as int64 (null stays null); _Fallback (or ArrowInvalid: not an integer, or
    beyond 64 bits) for any string Python's int() reads otherwise: Arrow's cast also reads `0x10`."""
    if _has_x(strings):
        raise _Fallback
    return pc.cast(strings, pa.int64())


def _has_x(strings: pa.Array) -> bool:
    """Whether any string holds an `x` or `X` (read from the data buffer: a case-insensitive substring search
    costs more than the cast it guards)."""
    if not len(strings):
        return False
    offsets, data = strings.buffers()[1:3]
    if data is None:
        return False
    bounds = np.frombuffer(offsets, dtype=np.int32, count=len(strings) + 1, offset=4 * strings.offset)
    text = np.frombuffer(data, dtype=np.uint8)[bounds[0]:bounds[-1]]
    return bool(np.any((text | 0x20) == ord("x")))  # 0x20 folds "X" onto "x" and no other byte


def _nanos(values: pa.Array) -> pa.Array:
    """Nanosecond times (a missing one is 0); _Fallback for a negative one (quarantined by the record path)."""
    nanos = _decimal(values)
    if nanos.null_count:
        nanos = pc.fill_null(nanos, 0)
    if len(nanos) and pc.min(nanos).as_py() < 0:
        raise _Fallback
    return nanos


def _longest(strings: pa.Array) -> int:
    return int(pc.max(pc.utf8_length(strings)).as_py() or 0) if len(strings) else 0


def _spans_table(lines: pa.Table) -> tuple[pa.Table, Notes]:
    if lines.column("resourceSpans").null_count:
        raise _Fallback  # a line without resourceSpans is rejected by the record-by-record path
    resource_spans, _ = _flatten(lines.column("resourceSpans"))
    if resource_spans.null_count or resource_spans.field("scopeSpans").null_count:
        raise _Fallback  # no scopeSpans: OTLP before 0.15 named them instrumentationLibrarySpans (json_forms)
    scope_spans, scope_owner = _flatten(resource_spans.field("scopeSpans"))
    spans, span_scope = _flatten(scope_spans.field("spans"))
    if scope_spans.null_count or spans.null_count:
        raise _Fallback
    n = len(spans)
    span_resource = scope_owner[span_scope] if n else np.zeros(0, dtype=np.int64)
    if n and spans.field("links").drop_null().to_pylist() and any(spans.field("links").drop_null().to_pylist()):
        raise _Fallback
    columns: dict[str, pa.Array] = {}
    columns["trace_id"] = _hex(spans.field("traceId"), 32, True)
    columns["span_id"] = _hex(spans.field("spanId"), 16, True)
    columns["parent_span_id"] = _hex(spans.field("parentSpanId"), 16, False)
    columns["name"] = pc.fill_null(spans.field("name"), "")
    if _longest(columns["name"]) > MAX_NAME_CHARS:
        raise _Fallback  # truncated and counted by the record-by-record path
    kind = pc.fill_null(spans.field("kind"), 0)
    status = spans.field("status")
    code = pc.fill_null(status.field("code"), 0)
    if n and (pc.min(kind).as_py() < 0 or pc.max(kind).as_py() > 5 or pc.min(code).as_py() < 0
              or pc.max(code).as_py() > 2):
        raise _Fallback
    columns["kind"] = pc.cast(kind, pa.int8())
    columns["start_ns"] = _nanos(spans.field("startTimeUnixNano"))
    columns["end_ns"] = _nanos(spans.field("endTimeUnixNano"))
    if n and (pc.min(columns["start_ns"]).as_py() < MIN_START_NS
              or pc.any(pc.less(columns["end_ns"], columns["start_ns"])).as_py()):
        raise _Fallback  # quarantined, with the reason, by the record-by-record path
    columns["status_code"] = pc.cast(code, pa.int8())
    message = status.field("message")
    if _longest(message.drop_null()) > MAX_VALUE_CHARS:
        raise _Fallback
    columns["status_message"] = pc.if_else(pc.equal(pc.fill_null(message, ""), ""), pa.scalar(None, pa.string()),
                                           message)
    scope = scope_spans.field("scope")
    span_scope_index = pa.array(span_scope)
    columns["scope_name"] = scope.field("name").take(span_scope_index)
    columns["scope_version"] = scope.field("version").take(span_scope_index)
    if n and (pc.max(pc.list_value_length(spans.field("events"))).as_py() or 0) > MAX_EVENTS:
        raise _Fallback
    columns["events"] = _events(spans.field("events"))
    columns["links"] = pa.nulls(n, pa.string())
    for f in SPAN_FIELDS:
        columns[f.name] = columns[f.name].cast(f.type)

    notes = Notes()
    resources = [split_attributes(_strip_nulls(r), DECLARED_RESOURCE)
                 for r in resource_spans.field("resource").field("attributes").to_pylist()]
    span_resource_index = pa.array(span_resource, type=pa.int64())
    for key, declared in DECLARED_RESOURCE.items():
        values = [typed.get(key) for typed, _, _ in resources]
        columns[resource_column(key)] = pa.nulls(n, VALUE_TYPES[declared]) if all(v is None for v in values) \
            else pa.array(values, type=VALUE_TYPES[declared]).take(span_resource_index)
    columns[RESOURCE_MAP] = pa.array([list(other.items()) for _, other, _ in resources],
                                     type=MAP_TYPE).take(span_resource_index)
    for r, (_, _, resource_notes) in enumerate(resources):
        if resource_notes:
            rows = np.flatnonzero(span_resource == r)
            for what, key in resource_notes:
                notes.add(rows, what, key)

    columns.update(_attribute_columns(spans.field("attributes"), n, notes))
    table = pa.Table.from_arrays([columns[f.name] for f in SCHEMA], schema=SCHEMA)
    table.validate(full=True)
    return table, notes


def _strip_nulls(value: Any) -> Any:
    """An attribute list as Arrow returns it (every field, unset ones None) → as the JSON had it."""
    if isinstance(value, dict):
        if value.get("kvlistValue") is not None:
            raise _Fallback  # its content was not parsed
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


_JSON_KEYS: dict[str, str] = {}


def _event_attributes(attributes: list[dict[str, Any]] | None) -> str:
    """An event's attributes as a JSON object (as `batch` writes them, byte for byte)."""
    if not attributes:
        return "{}"
    if any(is_content(kv["key"]) for kv in attributes):
        raise _Fallback  # left out and counted by the record-by-record path
    if all(kv["value"]["intValue"] is not None and kv["value"]["stringValue"] is None
           and kv["value"]["arrayValue"] is None and kv["value"]["doubleValue"] is None
           and kv["value"]["boolValue"] is None for kv in attributes):  # prefill chunks: integers only
        numbers = {kv["key"]: int(kv["value"]["intValue"]) for kv in attributes}
        if all(-(1 << 63) <= v < (1 << 63) for v in numbers.values()):
            parts = []
            for key, number in numbers.items():
                encoded = _JSON_KEYS.get(key)
                if encoded is None:
                    encoded = json.dumps(key)
                    if len(_JSON_KEYS) < 1024:
                        _JSON_KEYS[key] = encoded
                parts.append(f"{encoded}:{number}")
            return "{" + ",".join(parts) + "}"
    out: dict[str, Any] = {}
    for kv in attributes:
        value = kv["value"]
        number = int(value["intValue"]) if value["intValue"] is not None else None
        if number is not None and -(1 << 63) <= number < (1 << 63) and value["stringValue"] is None \
                and value["arrayValue"] is None:
            out[kv["key"]] = number
        elif value["stringValue"] is not None and value["intValue"] is None and value["arrayValue"] is None:
            out[kv["key"]] = value["stringValue"]
        else:  # anything less common: the general decoder
            out.update(event_attributes(_strip_nulls([kv])))
    return json.dumps(out, separators=(",", ":"))


_PLAIN_KEY = r"^[ !#-\[\]-~]*$"  # printable ASCII without quote or backslash: JSON-encodes as itself
_CANONICAL_INT = r"^(0|-?[1-9][0-9]{0,18})$"  # as Python's int() then str() writes it back


def _events(events: pa.Array) -> pa.Array:
    """The events column: vectorised when every event attribute is an integer under a plain key (the
    engine's `first_token` and `prefill_chunk` events), else per event in Python. Both write each event's
    attributes as the same JSON text as the record-by-record path."""
    fast = _integer_events(events)
    return fast if fast is not None else _events_in_python(events)


def _integer_events(events: pa.Array) -> pa.Array | None:
    lengths = pc.fill_null(pc.list_value_length(events), 0)
    flat = events.flatten()  # the events of every span, in order (a null list contributes none)
    if flat.null_count:
        return None
    times = flat.field("timeUnixNano")
    attributes = flat.field("attributes")
    if attributes.null_count:
        attributes = pc.fill_null(attributes, pa.scalar([], type=attributes.type))
    kv = attributes.flatten()
    if kv.null_count or kv.field("key").null_count:
        return None
    values = kv.field("value")
    if len(kv):
        try:
            if _value_kind(values) != "intValue":
                return None  # not integers only
        except _Fallback:
            return None  # mixed kinds or empty values: the per-event path decides
    ints = values.field("intValue")
    keys = kv.field("key")
    if any(is_content(key) for key in pc.unique(keys).to_pylist()):
        return None  # message text: left out and counted by the record-by-record path
    if len(kv) and not (pc.all(pc.match_substring_regex(keys, _PLAIN_KEY)).as_py()
                        and pc.all(pc.match_substring_regex(ints, _CANONICAL_INT)).as_py()):
        return None
    owner = pc.list_parent_indices(attributes).to_numpy()
    pair = owner.astype(np.int64) * (len(kv) + 1) + pc.dictionary_encode(keys).indices.to_numpy()
    if len(np.unique(pair)) != len(pair):
        return None  # a key repeated within one event
    try:
        pc.cast(ints, pa.int64())
    except pa.ArrowInvalid:  # beyond int64
        return None
    texts = pc.binary_join_element_wise('"', keys, '":', ints, "")
    offsets = pc.subtract(attributes.offsets, attributes.offsets[0])
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, texts), ",")
    objects = pc.binary_join_element_wise("{", joined, "}", "")
    built = pa.StructArray.from_arrays([_nanos(times), pc.fill_null(flat.field("name"), ""), objects],
                                       fields=list(EVENT_TYPE.value_type))
    span_offsets = np.concatenate([[0], np.cumsum(lengths.to_numpy())]).astype(np.int32)
    result = pa.ListArray.from_arrays(pa.array(span_offsets), built, mask=pc.equal(lengths, 0))
    return result.cast(EVENT_TYPE)


def _events_in_python(events: pa.Array) -> pa.Array:
    """Events built per event in Python, for the spans that have any."""
    lengths = pc.fill_null(pc.list_value_length(events), 0).to_numpy()
    with_events = np.flatnonzero(lengths)
    out: list[list[dict[str, Any]] | None] = [None] * len(events)
    for row, span_events in zip(with_events.tolist(), events.take(pa.array(with_events)).to_pylist(), strict=True):
        built = []
        for event in span_events:
            time = "0" if event["timeUnixNano"] is None else event["timeUnixNano"]
            if not time.isdigit() or not time.isascii() or int(time) > (1 << 63) - 1:
                raise _Fallback
            built.append({"time_ns": int(time), "name": event["name"] or "",
                          "attributes": _event_attributes(event["attributes"])})
        out[row] = built
    return pa.array(out, type=SPAN_FIELDS[11].type)


_VALUE_FIELDS = ("stringValue", "intValue", "doubleValue", "boolValue", "arrayValue", "kvlistValue", "bytesValue")
_SCALAR_FIELDS = _VALUE_FIELDS[:4]
_ARRAY = 4  # index of arrayValue in _VALUE_FIELDS


def _value_kind(values: pa.StructArray, fields: tuple[str, ...] = _VALUE_FIELDS) -> str:
    """The one kind every AnyValue in `values` has, or _Fallback."""
    present = {name: len(values) - values.field(name).null_count for name in fields}
    kinds = [name for name, count in present.items() if count]
    if len(kinds) != 1 or present[kinds[0]] != len(values) or values.null_count:
        raise _Fallback  # mixed kinds, empty values, or bytes/kvlist: the record-by-record path decides
    return kinds[0]


def _kinds(values: pa.StructArray, fields: tuple[str, ...], refused: tuple[str, ...] = ()) -> np.ndarray:
    """For each AnyValue, the index in `fields` of the one field it sets; _Fallback when one sets none or
    several, or a `refused` field."""
    if values.null_count or any(values.field(name).null_count != len(values) for name in refused):
        raise _Fallback  # bytes or a key-value list: kept as JSON text by the record-by-record path
    kind = np.zeros(len(values), dtype=np.int8)
    count = np.zeros(len(values), dtype=np.int8)
    for i, name in enumerate(fields):
        child = values.field(name)
        if child.null_count == len(child):
            continue
        present = np.ones(len(child), dtype=bool) if not child.null_count else \
            child.is_valid().to_numpy(zero_copy_only=False)
        kind[present] = i
        count += present
    if len(count) and (count.min() != 1 or count.max() != 1):
        raise _Fallback  # an empty value, or one with two fields: the record-by-record path decides
    return kind


def _integers(strings: pa.Array) -> np.ndarray:
    """Integer strings (nulls allowed) as int64, 0 where null."""
    return pc.fill_null(_decimal(strings), 0).to_numpy()


class _Values:
    """Every attribute value of a block (`AnyValue`s), each kind decoded once for all keys; `column()` picks
    the values of one key."""

    def __init__(self, values: pa.StructArray) -> None:
        self.kind = _kinds(values, _VALUE_FIELDS[:_ARRAY + 1], _VALUE_FIELDS[_ARRAY + 1:])
        self.strings: pa.Array = values.field("stringValue")
        self._fields = values
        self._numbers: dict[str, np.ndarray] = {}
        lists = values.field("arrayValue").field("values")
        offsets = lists.offsets.to_numpy()
        self.starts = offsets[:-1].astype(np.int64)
        ends = offsets[1:] if not lists.null_count else np.where(  # `"arrayValue": {}` is an empty list
            lists.is_valid().to_numpy(zero_copy_only=False), offsets[1:], offsets[:-1])
        self.ends = ends.astype(np.int64)
        self.items: pa.StructArray = lists.values
        self._item_kind: np.ndarray | None = None

    def numbers(self, field: str, of_items: bool = False) -> np.ndarray:
        """intValue, doubleValue or boolValue of every value (or list item) as numpy, 0 where absent."""
        name = ("items." if of_items else "") + field
        if name not in self._numbers:
            column = (self.items if of_items else self._fields).field(field)
            if field == "intValue":
                self._numbers[name] = _integers(column)
            else:
                self._numbers[name] = pc.fill_null(column, False if field == "boolValue" else 0.0).to_numpy(
                    zero_copy_only=False)
        return self._numbers[name]

    def item_kind(self, positions: np.ndarray) -> str:
        """The one scalar kind of every list item of the values at `positions`: `int[]`, ..., or `[]` when
        they hold no item; _Fallback when they mix kinds."""
        if self._item_kind is None:
            self._item_kind = _kinds(self.items, _SCALAR_FIELDS)
        lengths = self.ends[positions] - self.starts[positions]
        kinds = np.unique(self._item_kind[_ranges(self.starts[positions], lengths)])
        if len(kinds) == 0:
            return "[]"
        if len(kinds) > 1:
            raise _Fallback  # a list of mixed kinds (JSON text, by the record-by-record path)
        return _KIND_OF_FIELD[_SCALAR_FIELDS[kinds[0]]] + "[]"

    def column(self, kind: str, index: np.ndarray) -> pa.Array:
        """The values at positions `index` (-1: null) as an Arrow array of `kind`."""
        absent = index < 0
        mask = absent if absent.any() else None
        safe = np.where(absent, 0, index) if mask is not None else index
        if kind == "string":
            return self.strings.take(pa.array(index, mask=mask))
        if kind in ("int", "double", "bool"):
            return pa.array(self.numbers(_FIELD_OF_KIND[kind])[safe], mask=mask)
        lengths = self.ends[safe] - self.starts[safe]
        if mask is not None:
            lengths[mask] = 0
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        picked = _ranges(self.starts[safe], lengths)
        item = kind[:-2]
        if item == "":  # only empty lists
            items: pa.Array = pa.array([], pa.string())
        elif item == "string":
            items = self.items.field("stringValue").take(pa.array(picked))
        else:
            items = pa.array(self.numbers(_FIELD_OF_KIND[item], of_items=True)[picked])
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), items,
                                        mask=None if mask is None else pa.array(mask))


_FIELD_OF_KIND = {kind: field for field, kind in _KIND_OF_FIELD.items()}


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenated ranges [start, start + length)."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.arange(total, dtype=np.int64) - np.repeat(ends - lengths - starts, lengths)


def _texts(kind: str, typed: pa.Array) -> pa.Array:
    """Values of one kind as the text kept in an attribute map (`values.as_text`)."""
    if kind == "string":
        return typed
    if kind == "int":
        return pc.cast(typed, pa.string())
    if kind == "bool":
        return pc.if_else(typed, "true", "false")
    return pa.array([as_text(kind, v) for v in typed.to_pylist()], type=pa.string())


def _converted(kind: str, typed: pa.Array, declared: str) -> pa.Array:
    """Values of one kind converted to a declared type, as the record-by-record path converts them."""
    if kind == "[]":
        return typed.cast(VALUE_TYPES[declared])
    if declared == "double" and kind == "int":
        return typed.cast(pa.float64())
    if declared == "double[]" and kind == "int[]":
        return typed.cast(pa.list_(pa.float64()))
    try:
        return pa.array([convert(kind, v, declared) for v in typed.to_pylist()], type=VALUE_TYPES[declared])
    except NotConvertible:
        raise _Fallback from None  # kept as text in the map, by the record-by-record path


def _too_long(strings: pa.Array) -> bool:
    """Whether a string is over MAX_VALUE_CHARS characters (bytes first: a UTF-8 character is ≥ 1 byte)."""
    if not len(strings) or (pc.max(pc.binary_length(strings)).as_py() or 0) <= MAX_VALUE_CHARS:
        return False
    return _longest(strings) > MAX_VALUE_CHARS


def _attribute_columns(attributes: pa.Array, n: int, notes: Notes) -> dict[str, pa.Array]:
    """The typed columns of declared keys and the span attribute map; conversions noted in `notes`.

    Every value is decoded once per block (`_Values`); a key's values are then picked by position."""
    key_values, owner = _flatten(attributes)
    if key_values.null_count or key_values.field("key").null_count:
        raise _Fallback
    if len(owner) and int(np.bincount(owner).max()) > MAX_ATTRIBUTES:
        raise _Fallback
    encoded = key_values.field("key").dictionary_encode()
    codes = encoded.indices.to_numpy()
    keys = encoded.dictionary.to_pylist()
    if any(len(key) > MAX_KEY_CHARS for key in keys):
        raise _Fallback
    values = _Values(key_values.field("value"))
    order = np.argsort(codes.astype(np.int16) if len(keys) < 1 << 15 else codes, kind="stable")  # int16: radix
    sorted_codes, sorted_owner = codes[order], owner[order]
    if bool(np.any((sorted_codes[1:] == sorted_codes[:-1]) & (sorted_owner[1:] == sorted_owner[:-1]))):
        raise _Fallback  # a key repeated within one span
    bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(keys)))])
    kinds_of_key = np.zeros((len(keys), _ARRAY + 1), dtype=bool)
    for k in range(_ARRAY + 1):
        kinds_of_key[:, k] = np.bincount(codes[values.kind == k], minlength=len(keys)) > 0
    if len(keys) and kinds_of_key.sum(axis=1).max() > 1:
        raise _Fallback  # one key with values of different kinds: the record-by-record path decides
    long_strings = _too_long(values.strings)
    out: dict[str, pa.Array] = {}
    in_map: list[tuple[np.ndarray, pa.Array]] = []  # (flat positions, texts) of undeclared keys
    strings_in_map = np.zeros(len(keys), dtype=bool)  # undeclared keys of string values
    for code, key in enumerate(keys):
        picked = order[bounds[code]:bounds[code + 1]]
        rows = owner[picked]
        field = _VALUE_FIELDS[int(np.argmax(kinds_of_key[code]))]
        kind = values.item_kind(picked) if field == "arrayValue" else _KIND_OF_FIELD[field]
        declared = DECLARED_ATTRIBUTES.get(key)
        if declared is None and is_content(key):
            notes.add(rows, REDACTED, key)
            continue
        if declared is None:
            if kind == "string":
                strings_in_map[code] = True
                continue
            texts = _texts(kind, values.column(kind, picked))
            if kind.endswith("[]") and _too_long(texts):
                raise _Fallback
            in_map.append((picked, texts))
            continue
        if kind == declared:
            index = np.full(n, -1, dtype=np.int64)
            index[rows] = picked
            typed = values.column(kind, index)
        else:
            converted = _converted(kind, values.column(kind, picked), declared)
            if kind != "[]":  # nor is any empty list a conversion: the record path reads it as `[]`
                empty = (values.ends[picked] == values.starts[picked]) if kind.endswith("[]") else None
                notes.add(rows if empty is None else rows[~empty], CONVERTED, key)
            index = np.full(n, -1, dtype=np.int64)
            index[rows] = np.arange(len(rows))
            typed = converted.take(pa.array(index, mask=index < 0))
        if declared == "string" and (long_strings or kind != "string") and _too_long(typed.drop_null()):
            raise _Fallback
        if declared == "string[]" and _too_long(typed.flatten().drop_null()):
            raise _Fallback
        out[attribute_column(key)] = typed
    if strings_in_map.any():
        positions = np.flatnonzero(strings_in_map[codes])
        texts = values.column("string", positions)
        if long_strings and _too_long(texts):
            raise _Fallback  # truncated and counted by the record-by-record path
        in_map.append((positions, texts))
    for key, declared in DECLARED_ATTRIBUTES.items():
        if attribute_column(key) not in out:
            out[attribute_column(key)] = pa.nulls(n, VALUE_TYPES[declared])
    out[SPAN_MAP] = _span_map(in_map, codes, owner, encoded.dictionary, n)
    return out


def _span_map(in_map: list[tuple[np.ndarray, pa.Array]], codes: np.ndarray, owner: np.ndarray, keys: pa.Array,
              n: int) -> pa.Array:
    """The map column: each span's undeclared attributes, in the order the span listed them."""
    if not in_map:
        return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()),
                                       pa.array([], pa.string()))
    positions = np.concatenate([p for p, _ in in_map])
    texts = pa.concat_arrays([t for _, t in in_map])
    if len(positions) > 1 and bool(np.any(positions[1:] < positions[:-1])):
        order = np.argsort(positions, kind="stable")
        positions = positions[order]
        texts = texts.take(pa.array(order))
    counts = np.bincount(owner[positions], minlength=n)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    return pa.MapArray.from_arrays(offsets, keys.take(pa.array(codes[positions])), texts)
