"""Runs a fleet (or a scenario) into a file and reads its OTLP JSON lines back with `json` (the format itself
is checked against the official opentelemetry-proto parser in test_fleet.py), grouped the way the fleet
tests ask their questions: by trace, by engine, by component."""

from __future__ import annotations

import gzip
import json
import statistics
import tomllib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infertrace import semconv as sc
from reference_engine.fleet.config import FleetSpec, parse_fleet
from reference_engine.fleet.fleet import Fleet, FleetSummary
from reference_engine.fleet.workload import fleet_requests
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.profiles import TelemetrySpec
from reference_engine.workload import DEFAULT_EPOCH_NS
from tests.otlp_proto import token_times

EPOCH = DEFAULT_EPOCH_NS


def fleet_from_toml(text: str) -> FleetSpec:
    return parse_fleet(tomllib.loads(text))


def simulate_fleet(spec: FleetSpec, path: Path, duration_s: float, seed: int = 0,
                   telemetry: TelemetrySpec | None = None) -> FleetSummary:
    writer = OtlpJsonLinesWriter(path)
    try:
        return Fleet(spec, writer, seed, telemetry=telemetry).run(fleet_requests(spec, duration_s, seed))
    finally:
        writer.close()


def resource_instance(resource_spans: dict[str, Any]) -> str | None:
    """The `service.instance.id` of an OTLP JSON ResourceSpans, or None."""
    attributes = {a["key"]: a["value"] for a in resource_spans["resource"]["attributes"]}
    return attributes.get(sc.SERVICE_INSTANCE_ID, {}).get("stringValue")


def move_span(span: dict[str, Any], offset_ns: int, end_offset_ns: int | None = None) -> None:
    """Moves an OTLP JSON span (its start, its events, and its end by `end_offset_ns`, else by `offset_ns`)."""
    span["startTimeUnixNano"] = str(int(span["startTimeUnixNano"]) + offset_ns)
    span["endTimeUnixNano"] = str(int(span["endTimeUnixNano"]) + (offset_ns if end_offset_ns is None else
                                                                    end_offset_ns))
    for event in span.get("events", ()):
        event["timeUnixNano"] = str(int(event["timeUnixNano"]) + offset_ns)


def traces_of(path: Path, instance: str) -> set[str]:
    """The trace ids of every span `instance` exported (OTLP JSON lines)."""
    with path.open() as lines:
        return {span["traceId"] for line in lines for rs in json.loads(line)["resourceSpans"]
                if resource_instance(rs) == instance for scope in rs["scopeSpans"] for span in scope["spans"]}


def rewrite_trace(src: Path, out: Path, edit: Callable[[dict[str, Any], dict[str, Any]], bool | None]) -> None:
    """Copies OTLP JSON lines, calling `edit(resource_spans, span)` on every span first (to change it in place;
    it returns False to leave the span out): a trace as a misconfigured, skewed or overloaded exporter would have
    written it."""
    with src.open() as lines, out.open("w") as dst:
        for line in lines:
            request = json.loads(line)
            for resource_spans in request["resourceSpans"]:
                for scope in resource_spans["scopeSpans"]:
                    scope["spans"] = [span for span in scope["spans"] if edit(resource_spans, span) is not False]
            dst.write(json.dumps(request) + "\n")


@dataclass(slots=True)
class Span:
    """The fields of an OTLP span the tests read, named as opentelemetry-proto names them."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_time_unix_nano: int
    end_time_unix_nano: int
    events: list[dict[str, Any]]
    status_code: int


@dataclass(slots=True)
class ParsedSpan:
    span: Span
    resource: dict[str, Any]
    attrs: dict[str, Any]


def _value(v: dict[str, Any]) -> Any:
    (kind, x), = v.items()
    if kind == "intValue":
        return int(x)
    if kind == "arrayValue":
        return [_value(e) for e in x.get("values", [])]
    return x


def _attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {kv["key"]: _value(kv["value"]) for kv in items}


def read_spans(path: Path) -> list[ParsedSpan]:
    out = []
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
        for line in f:
            for rs in json.loads(line)["resourceSpans"]:
                resource = _attributes(rs["resource"]["attributes"])
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        span = Span(s["traceId"], s["spanId"], s.get("parentSpanId", ""), s["name"],
                                    int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]), s.get("events", []),
                                    s["status"].get("code", 0))
                        out.append(ParsedSpan(span, resource, _attributes(s["attributes"])))
    return out


@dataclass
class Traces:
    spans: list[ParsedSpan]

    @classmethod
    def read(cls, path: Path) -> Traces:
        return cls(read_spans(path))

    def named(self, name: str) -> list[ParsedSpan]:
        return [p for p in self.spans if p.span.name == name]

    def by_trace(self) -> dict[str, list[ParsedSpan]]:
        traces: dict[str, list[ParsedSpan]] = defaultdict(list)
        for p in self.spans:
            if p.span.name != sc.SPAN_STEP:
                traces[p.span.trace_id].append(p)
        return traces

    def model_of_trace(self) -> dict[str, str]:
        return {p.span.trace_id: p.attrs[sc.REQUEST_MODEL] for p in self.named(sc.SPAN_GATEWAY)}

    def steps_by_engine(self) -> dict[str, list[ParsedSpan]]:
        engines: dict[str, list[ParsedSpan]] = defaultdict(list)
        for p in self.named(sc.SPAN_STEP):
            engines[p.resource[sc.SERVICE_INSTANCE_ID]].append(p)
        for steps in engines.values():
            steps.sort(key=lambda p: p.span.start_time_unix_nano)
        return engines

    def tokens(self) -> dict[str, list[int]]:
        return token_times(self.spans)  # type: ignore[arg-type]


def decode_step_ms(steps: list[ParsedSpan], start: int, end: int) -> float:
    """Median duration of the decode-only steps that start in [start, end), per step, in ms."""
    durations = [d for p in steps if start <= p.span.start_time_unix_nano < end
                 and not p.attrs.get(sc.STEP_PREFILL_TOKENS) for d in p.attrs[sc.STEP_DURATIONS_NS]]
    return statistics.median(durations) / 1e6 if durations else float("nan")
