"""OTLP JSON ↔ OTLP protobuf messages, through the official parser (`google.protobuf.json_format`).

OTLP/JSON writes trace and span ids as hex, but protobuf's generic JSON mapping reads bytes fields as
base64, and a 32-character hex id *parses* as base64 into 24 wrong bytes without an error. So ids are
converted (hex → base64 before parsing, base64 → hex after printing) around `json_format`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

_ID_KEYS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def _hex_to_base64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def _base64_to_hex(value: str) -> str:
    return base64.b64decode(value, validate=True).hex()


def _convert_ids(data: Any, convert: Callable[[str], str]) -> Any:
    """Converts the ids of every span and span link in a TracesData-shaped dict, in place."""
    for rs in data.get("resourceSpans", data.get("resource_spans")) or ():
        for ss in rs.get("scopeSpans", rs.get("scope_spans")) or ():
            for span in ss.get("spans") or ():
                for holder in (span, *(span.get("links") or ())):
                    for key in _ID_KEYS:
                        value = holder.get(key)
                        if isinstance(value, str) and value:
                            holder[key] = convert(value)
    return data


def hex_ids_to_base64(data: Any) -> Any:
    """OTLP JSON (hex ids) → protobuf JSON mapping (base64 ids), in place. ValueError on a non-hex id."""
    try:
        return _convert_ids(data, _hex_to_base64)
    except ValueError as e:
        raise ValueError(f"an id is not hex: {e}") from None


def base64_ids_to_hex(data: Any) -> Any:
    """Protobuf JSON mapping (base64 ids) → OTLP JSON (hex ids), in place."""
    try:
        return _convert_ids(data, _base64_to_hex)
    except (ValueError, binascii.Error) as e:
        raise ValueError(f"an id is not base64: {e}") from None


def parse_traces_data(line: str | bytes) -> TracesData:
    """One OTLP JSON line (as the Collector's file exporter writes it) → `TracesData`, with the official
    parser. Raises ValueError (json_format.ParseError is one) on anything that is not a TracesData."""
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return json_format.ParseDict(hex_ids_to_base64(data), TracesData())


def message_to_otlp_dict(message: TracesData | ExportTraceServiceRequest) -> dict[str, Any]:
    """A protobuf message → OTLP JSON as a dict (hex ids, enums as integers, 64-bit integers as strings)."""
    data = json_format.MessageToDict(message, use_integers_for_enums=True)
    return base64_ids_to_hex(data)


def message_to_otlp_json(message: TracesData | ExportTraceServiceRequest) -> str:
    """A protobuf message → one OTLP JSON line."""
    return json.dumps(message_to_otlp_dict(message), separators=(",", ":"))
