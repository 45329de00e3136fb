"""Spans as OpenTelemetry's Python SDK prints them (`ConsoleSpanExporter`, `OTEL_TRACES_EXPORTER=console`: what a
vLLM or SGLang server started with console tracing writes to its output) as OTLP JSON.

Each span is one JSON object (`ReadableSpan.to_json`, pretty-printed, one after another): `{"name", "context":
{"trace_id": "0x…", "span_id": "0x…"}, "kind": "SpanKind.SERVER", "parent_id", "start_time", "end_time" (ISO 8601
UTC, to the microsecond), "status": {"status_code", "description"}, "attributes", "events", "links", "resource":
{"attributes"}}`. Converted field by field: ids without their `0x`, the kind and status by name, times to
nanoseconds (the text holds microseconds: the last three digits are zero), attribute values typed by their JSON
type (a whole number is an integer, as the SDK wrote it). The printout has no instrumentation scope and no link
flags; each span is its own `ResourceSpans` with its resource.
"""

from __future__ import annotations

import calendar
import datetime
import re
from typing import Any, Final

from infertrace.store.values import BadRecord, encode_value

_KINDS: Final = {"SpanKind.INTERNAL": 1, "SpanKind.SERVER": 2, "SpanKind.CLIENT": 3, "SpanKind.PRODUCER": 4,
                 "SpanKind.CONSUMER": 5}
_STATUS: Final = {"UNSET": 0, "OK": 1, "ERROR": 2}
_ISO: Final = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?Z")


def is_span(data: dict[str, Any]) -> bool:
    """Whether `data` is one span as the SDK's console exporter prints it."""
    context = data.get("context")
    return (isinstance(context, dict) and isinstance(context.get("trace_id"), str)
            and context["trace_id"].startswith("0x") and "start_time" in data and "resourceSpans" not in data)


def resource_spans(span: dict[str, Any]) -> list[dict[str, Any]]:
    """The span as one OTLP JSON `ResourceSpans` (its resource, one scope without a name). Raises BadRecord,
    naming what is wrong, when a field is not what the SDK prints."""
    resource = span.get("resource") or {}
    if not isinstance(resource, dict):
        raise BadRecord("the printed span's resource is not an object")
    context = span["context"]
    status = span.get("status") or {}
    if not isinstance(status, dict):
        raise BadRecord("the printed span's status is not an object")
    out: dict[str, Any] = {
        "traceId": _id(context.get("trace_id"), "trace_id"), "spanId": _id(context.get("span_id"), "span_id"),
        "name": span.get("name", ""), "kind": _KINDS.get(str(span.get("kind")), 0),
        "startTimeUnixNano": str(_nanos(span.get("start_time"), "start_time")),
        "endTimeUnixNano": str(_nanos(span.get("end_time"), "end_time")),
        "attributes": _attributes(span.get("attributes"), "attributes"),
        "events": [{"name": e.get("name", ""), "timeUnixNano": str(_nanos(e.get("timestamp"), "event timestamp")),
                    "attributes": _attributes(e.get("attributes"), "event attributes")}
                   for e in _objects(span.get("events"), "events")],
        "links": [{"traceId": _id(_context(link).get("trace_id"), "link trace_id"),
                   "spanId": _id(_context(link).get("span_id"), "link span_id"),
                   "attributes": _attributes(link.get("attributes"), "link attributes")}
                  for link in _objects(span.get("links"), "links")],
        "status": {"code": _STATUS.get(str(status.get("status_code")), 0),
                   **({"message": str(status["description"])} if status.get("description") else {})},
    }
    if span.get("parent_id"):
        out["parentSpanId"] = _id(span["parent_id"], "parent_id")
    return [{"resource": {"attributes": _attributes(resource.get("attributes"), "resource attributes")},
             "scopeSpans": [{"scope": {}, "spans": [out]}]}]


def _id(value: Any, what: str) -> str:
    """`0x…` without its prefix (the check of its digits is ingest's)."""
    if not isinstance(value, str) or not value.startswith("0x"):
        raise BadRecord(f"the printed span's {what} {str(value)[:40]!r} is not 0x and hex digits")
    return value[2:]


def _nanos(value: Any, what: str) -> int:
    match = _ISO.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise BadRecord(f"the printed span's {what} {str(value)[:40]!r} is not an ISO 8601 UTC time")
    *fields, fraction = match.groups()
    try:
        moment = datetime.datetime(*(int(f) for f in fields), tzinfo=datetime.UTC)
    except ValueError:
        raise BadRecord(f"the printed span's {what} {value!r} is not a time") from None
    return calendar.timegm(moment.utctimetuple()) * 10**9 + int((fraction or "").ljust(9, "0"))


def _objects(value: Any, what: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise BadRecord(f"the printed span's {what} is not a list of objects")
    return value


def _context(link: dict[str, Any]) -> dict[str, Any]:
    context = link.get("context")
    if not isinstance(context, dict):
        raise BadRecord("a printed link has no context")
    return context


def _attributes(values: Any, what: str) -> list[dict[str, Any]]:
    if values is None:
        return []
    if not isinstance(values, dict):
        raise BadRecord(f"the printed span's {what} is not an object")
    return [{"key": str(key), "value": encode_value(value)} for key, value in values.items()]
