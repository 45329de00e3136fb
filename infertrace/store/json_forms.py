"""The forms trace JSON takes outside the Collector's file exporter, read as the OTLP JSON they hold.

OTLP JSON proper (the OTLP specification's JSON encoding) writes ids as hex, enums as integers and fields in
lowerCamelCase. Other tools print the same messages with the protobuf library's generic JSON mapping, which a
reader must also accept: ids in base64 (`json_format.MessageToJson`, Go's `protojson`, Tempo's API), enums by
name (`"SPAN_KIND_SERVER"`, `"STATUS_CODE_ERROR"`), fields under their proto names (`resource_spans`,
`start_time_unix_nano`: `preserving_proto_field_name`). Query APIs wrap the message: Tempo's v1 trace API
returns `{"batches": [ResourceSpans…]}`, its v2 API `{"trace": TracesData}`, Jaeger's v3 (OTLP) API streams
`{"result": TracesData}`; OTLP before 0.15 named `scopeSpans` `instrumentationLibrarySpans`. A JSON array holds
several of these. Each is read here as the `ResourceSpans` it holds; the ingest then treats them as it treats
the exporter's. Jaeger's own JSON (`/api/traces`: `{"data": [trace…]}`, and the UI's download of one trace) is
converted as the Collector's Jaeger translator converts it (`jaeger_json`), Zipkin's v2 JSON (a list of spans,
or the traces API's list of lists) as its Zipkin receiver does (`zipkin_json`), and spans as OpenTelemetry's
Python SDK prints them (`ConsoleSpanExporter`) field by field (`sdk_console`). A Zipkin or Jaeger span alone (one
a line, as their storage backends export spans: Jaeger's with its `process` inside) is read as a list of one.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Final

from infertrace.store import jaeger_json, sdk_console, zipkin_json
from infertrace.store.values import BadRecord

SPAN_KINDS: Final = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2,
                     "SPAN_KIND_CLIENT": 3, "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
STATUS_CODES: Final = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_WRAPPERS: Final = ("trace", "result")  # Tempo v2 `{"trace": …}`, Jaeger v3 `{"result": …}`
_SNAKE: Final = re.compile(r"_([a-z])")
_MAX_DEPTH: Final = 4  # wrappers and arrays nested deeper than this are not a trace export


def resource_spans(data: Any, depth: int = 0) -> list[Any]:
    """The `ResourceSpans` of one JSON value in any of the forms above (fields renamed to lowerCamelCase, the
    pre-0.15 names to today's). Raises BadRecord when `data` holds no trace in any of them."""
    if depth > _MAX_DEPTH:
        raise BadRecord("not a TracesData (nested too deep)")
    if isinstance(data, list):
        if not data:
            raise BadRecord("an empty JSON array: no trace")
        if zipkin_json.is_spans(data):
            return zipkin_json.resource_spans(data)
        return [rs for item in data for rs in resource_spans(item, depth + 1)]
    if not isinstance(data, dict):
        raise BadRecord("not a JSON object")
    found = data.get("resourceSpans", data.get("resource_spans", data.get("batches")))
    if found is None:
        wrapped = next((data[key] for key in _WRAPPERS if isinstance(data.get(key), dict | list)), None)
        if wrapped is not None:
            return resource_spans(wrapped, depth + 1)
        jaeger = jaeger_json.traces(data)
        if jaeger is not None:
            return jaeger_json.resource_spans(jaeger)
        if sdk_console.is_span(data):
            return sdk_console.resource_spans(data)
        if zipkin_json.is_spans([data]):  # one span a line, as Zipkin's storage exports them
            return zipkin_json.resource_spans([data])
        if jaeger_json.is_span(data):  # one span a line with its process, as Jaeger's storage exports them
            return jaeger_json.resource_spans([{"traceID": data.get("traceID"), "spans": [data], "processes": {}}])
        keys = ", ".join(list(data)[:5]) + (", …" if len(data) > 5 else "")
        raise BadRecord(f"no resourceSpans (an object of {keys or 'no keys'}: not a trace export)")
    if not isinstance(found, list):
        raise BadRecord("resourceSpans is not a list")
    return [_current(rs) for rs in found]


def _current(rs: Any) -> Any:
    """One `ResourceSpans` with lowerCamelCase fields and today's names (as given when it has them)."""
    if not isinstance(rs, dict):
        return rs
    if "scope_spans" in rs or "instrumentation_library_spans" in rs or "schema_url" in rs:
        rs = _camel(rs)
    if "scopeSpans" not in rs and "instrumentationLibrarySpans" in rs:
        rs = dict(rs)
        old = rs.pop("instrumentationLibrarySpans")
        rs["scopeSpans"] = [_scope_named(ss) for ss in old] if isinstance(old, list) else old
    return rs


def _scope_named(ss: Any) -> Any:
    if isinstance(ss, dict) and "scope" not in ss and "instrumentationLibrary" in ss:
        ss = dict(ss)
        ss["scope"] = ss.pop("instrumentationLibrary")
    return ss


def _camel(value: Any) -> Any:
    """Every object key (OTLP JSON has no user-named keys: attributes are lists of key/value pairs) from
    proto_name to protoName."""
    if isinstance(value, dict):
        return {(_SNAKE.sub(lambda m: m.group(1).upper(), k) if "_" in k else k): _camel(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_camel(v) for v in value]
    return value


def base64_id(value: str, size: int) -> str | None:
    """The hex of an id written in base64 (standard or URL-safe, padded or not) when it decodes to `size`
    bytes, else None. Never ambiguous with hex: 16 bytes are 22–24 base64 characters, not 32; 8 bytes 11–12,
    not 16."""
    if not -(-4 * size // 3) <= len(value) <= 4 * -(-size // 3):
        return None
    text = value.replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == size else None


def enum_value(value: Any, names: dict[str, int]) -> Any:
    """An enum written by name → its number; anything else as given (checked by the caller)."""
    return names.get(value, value) if isinstance(value, str) else value
