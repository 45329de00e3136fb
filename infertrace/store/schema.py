"""The raw span table's columns: fixed span fields, two attribute maps, and one typed column per declared key.

Keys declared in `infertrace.semconv` (and vLLM's own request attribute names) have a typed column in every
segment, `res.<key>` for resource attributes and `attr.<key>` for span attributes, so derived relations name
them directly. Every other attribute goes into one of two `map<string, string>` columns, `resource_attributes`
and `span_attributes`, as the OpenTelemetry Collector's ClickHouse exporter (`ResourceAttributes`,
`SpanAttributes`) and Tempo's Parquet schema do: no input can add a column, so a store's schema is fixed by the
code that wrote it. A map value is the attribute's text (`values.as_text`): strings as they are, integers in
decimal, doubles as Python writes them, booleans `true`/`false`, arrays and key-value lists as JSON.

A value of a declared key whose type differs from the declared one is converted when its meaning is clear
(`values.convert`); otherwise the typed column stays null and the value is kept, as text, in the map under
its own key. Either way the span is stored, and the segment's notes count it.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from infertrace import semconv as sc

RESOURCE_PREFIX: Final = "res."
ATTRIBUTE_PREFIX: Final = "attr."
RESOURCE_MAP: Final = "resource_attributes"
SPAN_MAP: Final = "span_attributes"

EVENT_TYPE: Final = pa.list_(pa.struct([("time_ns", pa.int64()), ("name", pa.string()),
                                        ("attributes", pa.string())]))
MAP_TYPE: Final = pa.map_(pa.string(), pa.string())

# Fixed fields of every span, in order.
SPAN_FIELDS: Final[list[pa.Field]] = [
    pa.field("trace_id", pa.string(), nullable=False),  # 32 lowercase hex digits
    pa.field("span_id", pa.string(), nullable=False),  # 16 lowercase hex digits
    pa.field("parent_span_id", pa.string()),  # null for a root span
    pa.field("name", pa.string(), nullable=False),
    pa.field("kind", pa.int8(), nullable=False),  # OTLP SpanKind: 1 internal, 2 server, 3 client, ...
    pa.field("start_ns", pa.int64(), nullable=False),
    pa.field("end_ns", pa.int64(), nullable=False),
    pa.field("status_code", pa.int8(), nullable=False),  # 0 unset, 1 ok, 2 error
    pa.field("status_message", pa.string()),
    pa.field("scope_name", pa.string()),
    pa.field("scope_version", pa.string()),
    pa.field("events", EVENT_TYPE),  # event attributes as a JSON object
    pa.field("links", pa.string()),  # JSON array, null when none
]
MAP_FIELDS: Final[list[pa.Field]] = [pa.field(RESOURCE_MAP, MAP_TYPE), pa.field(SPAN_MAP, MAP_TYPE)]

# OTLP value kinds as the parser names them, and their Arrow types.
VALUE_TYPES: Final[dict[str, pa.DataType]] = {
    "string": pa.string(), "int": pa.int64(), "double": pa.float64(), "bool": pa.bool_(),
    "string[]": pa.list_(pa.string()), "int[]": pa.list_(pa.int64()), "double[]": pa.list_(pa.float64()),
    "bool[]": pa.list_(pa.bool_()),
}


def _semconv_kind(type_: str) -> str:
    return "double" if type_.startswith("double") else type_


def _declared() -> tuple[dict[str, str], dict[str, str]]:
    resource: dict[str, str] = {}
    attributes: dict[str, str] = {}
    for c in sc.REGISTRY:
        if c.kind == "resource":
            resource[c.name] = _semconv_kind(c.type)
        elif c.kind == "attribute" and c.where not in (sc.EVENT_PREFILL_CHUNK,):
            attributes[c.name] = _semconv_kind(c.type)
    return resource, attributes


DECLARED_RESOURCE, DECLARED_ATTRIBUTES = _declared()


def resource_column(key: str) -> str:
    return RESOURCE_PREFIX + key


def attribute_column(key: str) -> str:
    return ATTRIBUTE_PREFIX + key


def base_schema() -> pa.Schema:
    """The columns of every segment, in order."""
    fields = list(SPAN_FIELDS) + list(MAP_FIELDS)
    fields += [pa.field(resource_column(k), VALUE_TYPES[t]) for k, t in DECLARED_RESOURCE.items()]
    fields += [pa.field(attribute_column(k), VALUE_TYPES[t]) for k, t in DECLARED_ATTRIBUTES.items()]
    return pa.schema(fields)


SCHEMA: Final = base_schema()
