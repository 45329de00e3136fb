"""Zipkin's v2 JSON (what Envoy, Istio's proxies and Zipkin's own libraries send to `/api/v2/spans`, what Zipkin's
`/api/v2/traces` answers and its UI's "Download JSON" saves) as OTLP JSON.

A Zipkin span is `{"traceId", "id", "parentId", "name", "kind", "timestamp", "duration", "localEndpoint",
"remoteEndpoint", "annotations", "tags"}`; a body is a list of spans, the traces API a list of such lists.
Converted as the OpenTelemetry Collector's Zipkin receiver converts them (its zipkinv2 translator): ids are hex,
a 64-bit trace id left-padded to 32 digits; times are microseconds; a parent equal to the span's own id is none;
`kind` CLIENT/SERVER/PRODUCER/CONSUMER is the kind, else a `span.kind=internal` tag makes it internal; tags are
string attributes; the local endpoint's address and port are `net.host.ip`/`net.host.port`, the remote one's
service, address and port `peer.service`, `net.peer.ip`, `net.peer.port`; an annotation is an event named by its
value (an OpenTelemetry event with attributes, which exporters write as `{"name": {attributes}}` or
`name|{attributes}|dropped`, gets them back);
`otlp.link.N` tags are links; `otel.library.name`/`otel.scope.name` and their versions are the scope; the local
endpoint's `serviceName` is `service.name`.

Where the translator loses what a reader of these traces relies on, this module keeps it, and says so here:
- Zipkin marks a failed span with an `error` tag whose value is the message (OpenTelemetry's Zipkin exporter
  writes the status description there, often empty); the translator counts only `error=true`. Any `error` tag is
  a failure here, its value (other than "true") the status message. `otel.status_code` is read in both its
  spellings, "ERROR" (the exporters') and "STATUS_CODE_ERROR" (the translator's).
- The translator keys a resource by service name alone, so two replicas of one service (`service.instance.id`
  tags) would share the first one's resource. Here a resource is the service name with the span's tags that are
  resource attributes (`_is_resource`: the resource namespaces, service, host, k8s, container, process, cloud,
  telemetry.sdk, …, and the attributes the store declares on resources, such as `infertrace.component.kind`),
  which leave the span's attributes, as the translator moves the resource conventions.
- A span without a `timestamp` (Zipkin allows one, for data a later span completes) is rejected with that reason
  instead of being placed at 1970.
- The server side of a shared span (B3's shared span context, Envoy's and Zipkin's libraries' default: the CLIENT
  and SERVER sides of a call under one span id) gets an id of its own below the CLIENT span, as Jaeger does
  (`_split_shared_spans`); the translator keeps both under one id, of which a store keeps one.
Zipkin v1's JSON (`binaryAnnotations`, endpoints inside annotations) is named in the error.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from typing import Any, Final

from infertrace.store.schema import DECLARED_RESOURCE
from infertrace.store.values import BadRecord, Unconverted

_KINDS: Final = {"SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}
_STATUS: Final = {"OK": 1, "ERROR": 2, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_SCOPE_NAME: Final = ("otel.scope.name", "otel.library.name")
_SCOPE_VERSION: Final = ("otel.scope.version", "otel.library.version")
_RESOURCE_PREFIXES: Final = ("service.", "host.", "k8s.", "container.", "process.", "cloud.", "telemetry.sdk.",
                             "deployment.", "os.", "faas.", "device.")
_CONSUMED: Final = {"otel.status_code", "otel.status_description", "error", "w3c.tracestate", *_SCOPE_NAME,
                    *_SCOPE_VERSION}
_MAX_LINKS: Final = 128  # `otlp.link.0` … as the translator reads them


def is_spans(data: list[Any]) -> bool:
    """Whether `data` is Zipkin spans: a list of span objects, or a list of such lists (the traces API)."""
    first = data[0] if data else None
    if isinstance(first, list):
        first = first[0] if first else None
    return isinstance(first, dict) and "traceId" in first and "id" in first and "resourceSpans" not in first


def resource_spans(data: list[Any]) -> list[dict[str, Any]]:
    """OTLP JSON `ResourceSpans` of these Zipkin spans (a list, or a list of lists): one per service and resource
    tags, in order of first appearance, each with a `ScopeSpans` per scope. A span that cannot be converted is
    passed on as `Unconverted` (ingest rejects it alone, with the reason, and keeps it in quarantine)."""
    groups: dict[tuple[tuple[str, str], ...], dict[tuple[str | None, str | None], list[Any]]] = {}
    servers: list[tuple[dict[str, Any], bool]] = []  # converted SERVER spans, and whether Zipkin marks them shared
    clients: set[tuple[str, str]] = set()
    converted_spans: list[dict[str, Any]] = []
    for item in data:
        for span in item if isinstance(item, list) else [item]:
            try:
                resource, scope, converted = _span(span)
            except BadRecord as e:  # rejected alone, with its reason; the spans beside it are kept
                resource, scope = (), (None, None)
                converted = Unconverted(span, str(e)) if isinstance(span, dict) else span
            else:
                converted_spans.append(converted)
                if converted["kind"] == 2:
                    servers.append((converted, span.get("shared") is True))
                elif converted["kind"] == 3:
                    clients.add((converted["traceId"], converted["spanId"]))
            groups.setdefault(resource, defaultdict(list))[scope].append(converted)
    _split_shared_spans(converted_spans, servers, clients)
    return [{"resource": {"attributes": [_string(k, v) for k, v in resource]},
             "scopeSpans": [{"scope": {k: v for k, v in (("name", name), ("version", version)) if v is not None},
                             "spans": spans} for (name, version), spans in scopes.items()]}
            for resource, scopes in groups.items()]


def _span(span: Any) -> tuple[tuple[tuple[str, str], ...], tuple[str | None, str | None], dict[str, Any]]:
    """(the resource's attributes, the scope's name and version, the span as OTLP JSON)."""
    if not isinstance(span, dict):
        raise BadRecord("a Zipkin span is not an object")
    annotations = span.get("annotations") or []
    if not isinstance(annotations, list):
        raise BadRecord("a Zipkin span's annotations is not a list")
    if "binaryAnnotations" in span or any(isinstance(a, dict) and "endpoint" in a for a in annotations):
        raise BadRecord("Zipkin v1 JSON (binaryAnnotations, endpoints in annotations): read Zipkin's v2 API "
                        "(/api/v2/traces) instead")
    tags = span.get("tags") or {}
    if not isinstance(tags, dict):
        raise BadRecord("a Zipkin span's tags is not an object")
    tags = {str(k): "" if v is None else str(v) for k, v in tags.items()}
    span_id = _hex(span.get("id"), 16, "id")
    local, remote = _endpoint(span, "localEndpoint"), _endpoint(span, "remoteEndpoint")
    resource = [("service.name", str(local.get("serviceName") or "unknown_service"))]
    resource += sorted((k, v) for k, v in tags.items() if _is_resource(k) and k != "service.name")
    kind = _KINDS.get(str(span.get("kind", "")).upper(), 0)
    if not kind and tags.get("span.kind") == "internal":
        kind = 1
        tags.pop("span.kind")
    start = _micros(span.get("timestamp"), "timestamp")
    out: dict[str, Any] = {
        "traceId": _hex(span.get("traceId"), 32, "traceId"), "spanId": span_id,
        "name": str(span.get("name") or ""), "kind": kind,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + _micros(span.get("duration", 0), "duration")),
        "attributes": [_string(k, v) for k, v in tags.items()
                       if k not in _CONSUMED and not k.startswith("otlp.link.") and not _is_resource(k)]
        + _endpoint_attributes(local, remote),
        "events": [_event(a) for a in annotations],
        "status": _status(tags),
    }
    parent = span.get("parentId")
    if parent is not None and (parent := _hex(parent, 16, "parentId")) != span_id:
        out["parentSpanId"] = parent
    if "w3c.tracestate" in tags:
        out["traceState"] = tags["w3c.tracestate"]
    links = _links(tags)
    if links:
        out["links"] = links
    return tuple(resource), (_first(tags, _SCOPE_NAME), _first(tags, _SCOPE_VERSION)), out


def _split_shared_spans(spans: list[dict[str, Any]], servers: list[tuple[dict[str, Any], bool]],
                        clients: set[tuple[str, str]]) -> None:
    """Gives each SERVER span that shares its id with the caller's CLIENT span (B3's shared span context: Zipkin's
    libraries and Envoy by default; marked `shared`, or a CLIENT span of the same id is here) an id of its own, its
    parent the CLIENT span, and makes the spans below it its children, as Jaeger's `ZipkinSpanIDUniquifier` does.
    Otherwise the two would be one span id, and a store keeps one span per id: the server side would be lost. The
    new id is derived from the trace and the shared id, so the same span gets the same id in every ingest. Spans
    below it that arrive in another document stay children of the shared id (the CLIENT span)."""
    renamed: dict[tuple[str, str], str] = {}
    for span, shared in servers:
        key = (span["traceId"], span["spanId"])
        if shared or key in clients:
            renamed[key] = hashlib.sha256(f"zipkin shared server {key[0]} {key[1]}".encode()).hexdigest()[:16]
            span["spanId"], span["parentSpanId"] = renamed[key], key[1]
    if renamed:
        for span in spans:
            new = renamed.get((span["traceId"], span.get("parentSpanId", "")))
            if new is not None and span["spanId"] != new:
                span["parentSpanId"] = new


def _is_resource(key: str) -> bool:
    """Whether a tag is a resource attribute that an exporter flattened into the span's tags (OpenTelemetry's
    Zipkin exporters write every resource attribute as a tag): the resource namespaces, and every attribute the
    store's conventions declare on resources (`infertrace.component.kind`, `infertrace.engine.*`, …)."""
    return key.startswith(_RESOURCE_PREFIXES) or key in DECLARED_RESOURCE


def _status(tags: dict[str, str]) -> dict[str, Any]:
    """Any `error` tag fails the span (its value, unless "true" or empty, the message); else `otel.status_code`
    with `otel.status_description`."""
    if "error" in tags:
        message = tags.get("otel.status_description") or (tags["error"] if tags["error"] != "true" else "")
        return {"code": 2, **({"message": message} if message else {})}
    if "otel.status_code" in tags:
        code = _STATUS.get(tags["otel.status_code"].upper(), 0)
        message = tags.get("otel.status_description")
        return {"code": code, **({"message": message} if message else {})}
    return {"code": 0}


def _endpoint(span: dict[str, Any], key: str) -> dict[str, Any]:
    endpoint = span.get(key) or {}
    if not isinstance(endpoint, dict):
        raise BadRecord(f"a Zipkin span's {key} is not an object")
    return endpoint


def _endpoint_attributes(local: dict[str, Any], remote: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for endpoint, side in ((local, "host"), (remote, "peer")):
        if side == "peer" and endpoint.get("serviceName"):
            out.append(_string("peer.service", str(endpoint["serviceName"])))
        address = endpoint.get("ipv6") or endpoint.get("ipv4")
        if address:
            out.append(_string(f"net.{side}.ip", str(address)))
        port = endpoint.get("port")
        if isinstance(port, int) and not isinstance(port, bool) and port > 0:
            out.append({"key": f"net.{side}.port", "value": {"intValue": str(port)}})
    return out


def _event(annotation: Any) -> dict[str, Any]:
    """An annotation as an event: its value the name. An OpenTelemetry event with attributes gets them back, in
    either way exporters write one: `{"name": {attributes}}` (the SDKs' Zipkin exporters) or
    `name|{attributes}|dropped` (the Collector's)."""
    if not isinstance(annotation, dict):
        raise BadRecord("a Zipkin annotation is not an object")
    value = str(annotation.get("value", ""))
    event: dict[str, Any] = {"timeUnixNano": str(_micros(annotation.get("timestamp"), "annotation timestamp")),
                             "name": value}
    if value.startswith("{"):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and len(parsed) == 1:
            [(name, attributes)] = parsed.items()
            if isinstance(attributes, dict) and (typed := _attributes(attributes)) is not None:
                event["name"], event["attributes"] = name, typed
        return event
    parts = value.split("|")
    if len(parts) >= 3:
        attributes = _json_attributes("|".join(parts[1:-1]))
        if attributes is not None:
            event["name"] = parts[0]
            event["attributes"] = attributes
    return event


def _links(tags: dict[str, str]) -> list[dict[str, Any]]:
    """`otlp.link.0`, `otlp.link.1`, … (`traceId|spanId|traceState|{attributes}|dropped`) as links."""
    links = []
    for n in range(_MAX_LINKS):
        value = tags.get(f"otlp.link.{n}")
        if value is None:
            break
        parts = value.split("|")
        if len(parts) < 5:
            continue
        link: dict[str, Any] = {"traceId": _hex(parts[0], 32, "link trace id"),
                                "spanId": _hex(parts[1], 16, "link span id")}
        if parts[2]:
            link["traceState"] = parts[2]
        attributes = _json_attributes("|".join(parts[3:-1]))
        if attributes:
            link["attributes"] = attributes
        links.append(link)
    return links


def _json_attributes(text: str) -> list[dict[str, Any]] | None:
    """The attributes of a JSON object of strings, numbers and booleans (as the translator reads them: a whole
    number is an integer); None when `text` is not such an object."""
    try:
        values = json.loads(text)
    except ValueError:
        return None
    return _attributes(values) if isinstance(values, dict) else None


def _attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    """OTLP attributes of a JSON object's strings, numbers and booleans (a whole number an integer); lists and
    objects are left out, as the translator leaves them."""
    out = []
    for key, value in values.items():
        if isinstance(value, bool):
            out.append({"key": key, "value": {"boolValue": value}})
        elif isinstance(value, int | float):
            typed = {"intValue": str(int(value))} if float(value).is_integer() else {"doubleValue": value}
            out.append({"key": key, "value": typed})
        elif isinstance(value, str):
            out.append(_string(key, value))
    return out


def _string(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def _first(tags: dict[str, str], keys: tuple[str, ...]) -> str | None:
    return next((tags[k] for k in keys if k in tags), None)


def _hex(value: Any, digits: int, what: str) -> str:
    """A Zipkin id (16 or 32 hex digits; a 64-bit trace id is padded to 128 bits); the check of its digits is
    ingest's."""
    if not isinstance(value, str) or not value or len(value) > digits:
        raise BadRecord(f"Zipkin {what} {str(value)[:40]!r} is not up to {digits} hex digits")
    return value.rjust(digits, "0").lower()


def _micros(value: Any, what: str) -> int:
    if value is None and what == "timestamp":
        raise BadRecord("a Zipkin span without a timestamp (a fragment another span completes): not placed in time")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRecord(f"Zipkin {what} {str(value)[:40]!r} is not a number of microseconds")
    if value < 0:  # epoch microseconds and durations: neither is ever negative
        raise BadRecord(f"Zipkin {what} {value} is a negative number of microseconds")
    return round(value * 1000)
