"""Jaeger's own JSON (its query API's `/api/traces`, and the UI's "Download JSON" of one trace) as OTLP JSON.

A Jaeger trace is `{"traceID", "spans": [...], "processes": {id: {"serviceName", "tags"}}}`; the API wraps a list of
them in `{"data": [...]}`. Converted as the OpenTelemetry Collector's Jaeger translator converts Jaeger spans:
ids are hex, left-padded to 32 and 16 digits; times are microseconds; the parent is the first `CHILD_OF` reference
in the same trace (else the first `FOLLOWS_FROM`, as Jaeger's model reads it), the other references are links; the
`span.kind` tag is the kind; the status comes from `error=true`, else `otel.status_code`, else a failed HTTP status
code (`_status`); `otel.scope.name` (or `otel.library.name`) and its version are the scope; the other tags are
attributes of their declared types (binary as bytes); a log is an event named by its `event` field, its other
fields the event's attributes; a process is a resource whose `serviceName` is `service.name`. One
`ResourceSpans` per process.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Final

from infertrace.store.values import BadRecord, Unconverted

_KINDS: Final = {"internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}
_STATUS: Final = {"OK": 1, "ERROR": 2}
_SCOPE_NAME: Final = ("otel.scope.name", "otel.library.name")
_SCOPE_VERSION: Final = ("otel.scope.version", "otel.library.version")
_CONSUMED: Final = {"span.kind", "otel.status_code", *_SCOPE_NAME, *_SCOPE_VERSION}


def is_trace(data: dict[str, Any]) -> bool:
    """Whether `data` is one Jaeger trace (`traceID`, `spans`, `processes`)."""
    return isinstance(data.get("spans"), list) and "processes" in data and "resourceSpans" not in data


def is_span(data: dict[str, Any]) -> bool:
    """Whether `data` is one Jaeger span (`traceID`, `spanID`, `operationName`), as Jaeger's storage exports them."""
    return all(isinstance(data.get(key), str) for key in ("traceID", "spanID", "operationName"))


def traces(data: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The Jaeger traces of the query API's answer (`{"data": [trace, …]}`), of one trace, or None when `data` is
    neither."""
    if is_trace(data):
        return [data]
    found = data.get("data")
    if isinstance(found, list) and found and all(isinstance(t, dict) and is_trace(t) for t in found):
        return found
    return None


def resource_spans(jaeger_traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OTLP JSON `ResourceSpans` (one per process, in order of first appearance) of these Jaeger traces. A span that
    cannot be converted (it names a process the trace does not have, an id or a time is malformed) is passed on as
    `Unconverted`: ingest rejects it alone, with the reason, and keeps the others. Raises BadRecord when a trace's
    processes are malformed."""
    out: dict[tuple[int, str], list[tuple[tuple[str | None, str | None], Any]]] = defaultdict(list)
    resources: dict[tuple[int, str], dict[str, Any]] = {(-1, ""): {}}
    for number, trace in enumerate(jaeger_traces):
        processes = trace.get("processes") or {}
        if not isinstance(processes, dict):
            raise BadRecord("a Jaeger trace's processes is not an object")
        for span in trace["spans"]:
            try:
                key, converted = _process_span(span, number, processes, resources)
            except BadRecord as e:
                key, converted = (-1, ""), ((None, None), Unconverted(span, str(e)) if isinstance(span, dict) else span)
            out[key].append(converted)
    return [{"resource": resources[key], "scopeSpans": _by_scope(scoped)} for key, scoped in out.items()]


def _process_span(span: Any, number: int, processes: dict[str, Any], resources: dict[tuple[int, str], dict[str, Any]]
                  ) -> tuple[tuple[int, str], tuple[tuple[str | None, str | None], dict[str, Any]]]:
    """(the key of the span's process, which is added to `resources` if new; the span converted)."""
    if not isinstance(span, dict):
        raise BadRecord("a Jaeger span is not an object")
    process_id = span.get("processID")
    process = processes.get(process_id) if isinstance(process_id, str) else span.get("process")
    if not isinstance(process, dict):
        raise BadRecord(f"a Jaeger span names process {process_id!r}, which the trace does not have")
    key = (number, str(process_id))
    if key not in resources:
        resources[key] = _resource(process)
    return key, _span(span)


def _resource(process: dict[str, Any]) -> dict[str, Any]:
    attributes = [{"key": "service.name", "value": {"stringValue": str(process.get("serviceName", ""))}}]
    attributes += [_attribute(tag) for tag in _list(process, "tags")]
    return {"attributes": attributes}


def _by_scope(scoped: list[tuple[tuple[str | None, str | None], Any]]) -> list[dict[str, Any]]:
    scopes: dict[tuple[str | None, str | None], list[Any]] = defaultdict(list)
    for scope, span in scoped:
        scopes[scope].append(span)
    return [{"scope": {k: v for k, v in (("name", name), ("version", version)) if v is not None}, "spans": group}
            for (name, version), group in scopes.items()]


def _span(span: dict[str, Any]) -> tuple[tuple[str | None, str | None], dict[str, Any]]:
    """(its scope's name and version, the span as OTLP JSON)."""
    tags = {tag.get("key"): tag for tag in _list(span, "tags") if isinstance(tag, dict)}
    trace_id = _hex(span.get("traceID"), 32, "traceID")
    parent, links = _references(_list(span, "references"), trace_id)
    start = _micros(span.get("startTime"), "startTime")
    kind = _KINDS.get(str(_tag_value(tags, "span.kind")).lower(), 0)
    status, consumed = _status(tags, kind)
    out: dict[str, Any] = {
        "traceId": trace_id, "spanId": _hex(span.get("spanID"), 16, "spanID"),
        "name": span.get("operationName", ""), "kind": kind,
        "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + _micros(span.get("duration", 0), "duration")),
        "attributes": [_attribute(tag) for key, tag in tags.items() if key not in _CONSUMED and key not in consumed],
        "events": [_event(log) for log in _list(span, "logs")],
        "status": status,
    }
    if parent is not None:
        out["parentSpanId"] = parent
    if links:
        out["links"] = links
    return (_first(tags, _SCOPE_NAME), _first(tags, _SCOPE_VERSION)), out


def _references(references: list[Any], trace_id: str) -> tuple[str | None, list[dict[str, str]]]:
    """(the parent span id, the other references as links)."""
    refs = [(r.get("refType"), _hex(r.get("traceID"), 32, "reference traceID"),
             _hex(r.get("spanID"), 16, "reference spanID")) for r in references if isinstance(r, dict)]
    same_trace = [ref for ref in refs if ref[1] == trace_id]
    parent = next((ref for ref in same_trace if ref[0] == "CHILD_OF"), None) or next(
        (ref for ref in same_trace if ref[0] == "FOLLOWS_FROM"), None)
    links = [{"traceId": ref[1], "spanId": ref[2]} for ref in refs if parent is None or ref[1:] != parent[1:]]
    return (parent[2] if parent else None), links


def _status(tags: dict[str, Any], kind: int) -> tuple[dict[str, Any], set[str]]:
    """(the OTLP status, the tags it was read from, which are not attributes). As the translator: `error=true`
    decides first, then `otel.status_code`, then, without either, an HTTP status code that failed (`_http_failed`);
    the message is `otel.status_description`, else `http.status_message`."""
    consumed: set[str] = set()
    if _tag_value(tags, "error") is True:
        code = 2
        consumed.add("error")
        message = _description(tags, consumed) or _tag_value(tags, "http.status_message")
    elif "otel.status_code" in tags:
        code = _STATUS.get(str(_tag_value(tags, "otel.status_code")).upper(), 0)
        message = _description(tags, consumed)
    elif _http_failed(_tag_value(tags, "http.status_code"), kind):
        code, message = 2, _tag_value(tags, "http.status_message")
    else:
        code, message = 0, None
    return {"code": code, **({"message": str(message)} if message is not None else {})}, consumed


def _http_failed(value: Any, kind: int) -> bool:
    """Whether an HTTP status code says the span failed: 4xx on a client span but not on a server span, and any
    other code outside 100–398 (the translator's bounds); False when there is no code, or it is not an integer."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    if 400 <= value < 500 and kind in (2, 3):
        return kind == 3
    return not 100 <= value < 399


def _description(tags: dict[str, Any], consumed: set[str]) -> Any:
    """`otel.status_description`, taken out of the attributes when there."""
    if "otel.status_description" not in tags:
        return None
    consumed.add("otel.status_description")
    return _tag_value(tags, "otel.status_description")


def _event(log: Any) -> dict[str, Any]:
    if not isinstance(log, dict):
        raise BadRecord("a Jaeger log is not an object")
    fields = [f for f in _list(log, "fields") if isinstance(f, dict)]
    name = next((str(f.get("value")) for f in fields if f.get("key") == "event"), "")
    return {"timeUnixNano": str(_micros(log.get("timestamp"), "log timestamp")), "name": name,
            "attributes": [_attribute(f) for f in fields if f.get("key") != "event"]}


def _attribute(tag: Any) -> dict[str, Any]:
    if not isinstance(tag, dict) or not isinstance(tag.get("key"), str):
        raise BadRecord("a Jaeger tag has no string key")
    kind, value = str(tag.get("type", "string")).lower(), tag.get("value")
    if kind == "bool":
        typed: dict[str, Any] = {"boolValue": value in (True, "true")}
    elif kind == "int64":
        typed = {"intValue": str(value)}
    elif kind == "float64":
        typed = {"doubleValue": value}
    elif kind == "binary":
        typed = {"bytesValue": value}
    else:
        typed = {"stringValue": "" if value is None else str(value)}
    return {"key": tag["key"], "value": typed}


def _tag_value(tags: dict[str, Any], key: str) -> Any:
    tag = tags.get(key)
    return tag.get("value") if tag is not None else None


def _first(tags: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    return next((str(v) for k in keys if (v := _tag_value(tags, k)) is not None), None)


def _hex(value: Any, digits: int, what: str) -> str:
    """A Jaeger id (hex, leading zeros dropped) as `digits` hex digits; the check of its digits is ingest's."""
    if not isinstance(value, str) or not value or len(value) > digits:
        raise BadRecord(f"Jaeger {what} {str(value)[:40]!r} is not up to {digits} hex digits")
    return value.rjust(digits, "0")


def _list(value: dict[str, Any], key: str) -> list[Any]:
    """`value[key]`, a list (none: empty); BadRecord when it is something else."""
    found = value.get(key) or []
    if not isinstance(found, list):
        raise BadRecord(f"a Jaeger {key} is not a list")
    return found


def _micros(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRecord(f"Jaeger {what} {str(value)[:40]!r} is not a number of microseconds")
    if value < 0:  # epoch microseconds and durations: neither is ever negative
        raise BadRecord(f"Jaeger {what} {value} is a negative number of microseconds")
    return round(value * 1000)
