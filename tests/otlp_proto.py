"""Reads OTLP JSON lines with the official opentelemetry-proto parser, for tests.

OTLP/JSON writes trace and span ids as hex, while protobuf's generic JSON mapping reads bytes fields as
base64 (a 32-char hex id would silently parse into 24 wrong bytes), so ids are converted first.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, TracesData

from infertrace import semconv as sc

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids_to_base64(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in _ID_FIELDS and v else _hex_ids_to_base64(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex_ids_to_base64(v) for v in obj]
    return obj


def parse_line(line: str) -> TracesData:
    return json_format.Parse(json.dumps(_hex_ids_to_base64(json.loads(line))), TracesData())


def read_traces(path: Path) -> list[TracesData]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [parse_line(line) for line in f if line.strip()]


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(span_or_resource: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in span_or_resource.attributes}


@dataclass
class ParsedSpan:
    span: Span
    resource: dict[str, Any]
    attrs: dict[str, Any]


def spans(path: Path) -> list[ParsedSpan]:
    out = []
    for data in read_traces(path):
        for rs in data.resource_spans:
            res = attributes(rs.resource)
            for ss in rs.scope_spans:
                out.extend(ParsedSpan(s, res, attributes(s)) for s in ss.spans)
    return out


def token_times(parsed: list[ParsedSpan]) -> dict[str, list[int]]:
    """Each request's token times, reconstructed from `engine_step` spans only."""
    tokens: dict[str, list[int]] = defaultdict(list)
    for p in parsed:
        if p.span.name != sc.SPAN_STEP:
            continue
        ends, t = [], p.span.start_time_unix_nano
        for d in p.attrs[sc.STEP_DURATIONS_NS]:
            t += d
            ends.append(t)
        for rid in p.attrs.get(sc.STEP_DECODE_REQUEST_IDS, []):
            tokens[rid].extend(ends)
        for rid, samples in zip(p.attrs.get(sc.STEP_PREFILL_REQUEST_IDS, []),
                                p.attrs.get(sc.STEP_PREFILL_SAMPLES_TOKEN, []), strict=True):
            if samples:
                tokens[rid].append(ends[-1])
    return {rid: sorted(ts) for rid, ts in tokens.items()}
