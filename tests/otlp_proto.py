"""Reads OTLP JSON lines with the official opentelemetry-proto parser (through `infertrace.otlp_json`, which
converts the hex ids first), and rebuilds token times from `engine_step` spans, for tests."""

from __future__ import annotations

import gzip
import io
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, TracesData

from infertrace import semconv as sc
from infertrace.otlp_json import parse_traces_data


def read_traces(path: Path) -> list[TracesData]:
    """Every line of an OTLP JSON lines file, plain, .gz or .zst (decompressed by zstandard's own reader, not
    infertrace's)."""
    if path.suffix == ".zst":
        with open(path, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as z:
            text = io.TextIOWrapper(z, encoding="utf-8")
            return [parse_traces_data(line) for line in text if line.strip()]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [parse_traces_data(line) for line in f if line.strip()]


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
        assert ends[-1] == p.span.end_time_unix_nano, "the step durations add up to the span"
        for rid in p.attrs.get(sc.STEP_DECODE_REQUEST_IDS, []):
            tokens[rid].extend(ends)
        for rid, samples in zip(p.attrs.get(sc.STEP_PREFILL_REQUEST_IDS, []),
                                p.attrs.get(sc.STEP_PREFILL_SAMPLES_TOKEN, []), strict=True):
            if samples:
                tokens[rid].append(ends[-1])
    return {rid: sorted(ts) for rid, ts in tokens.items()}
