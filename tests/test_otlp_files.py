"""Every shape of file the OpenTelemetry Collector's file exporter writes ingests as its plain JSON lines do.

The exporter writes JSON lines with no compression; with `format: proto`, or with `compression: zstd` (unless its
native-compression feature gate is on), each message is a big-endian uint32 length and the message (OTLP JSON or
a `TracesData` protobuf), zstd-compressed one frame per message when compression is set; with the feature gate,
one zstd stream of JSON lines or of length-prefixed protobuf messages. The files here are built to that layout
from the engine's JSON lines, the protobuf messages by the official parser."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
import zstandard
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from infertrace.otlp_json import parse_traces_data
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from tests.engine_runs import write_trace

T0 = 1_767_225_600_000_000_000


@pytest.fixture(scope="module")
def json_lines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten simulated seconds, written as OTLP JSON lines in batches of 10 spans (many messages)."""
    return write_trace(tmp_path_factory.mktemp("trace") / "plain.jsonl", 10.0, seed=5, batch_size=10)


def _messages(path: Path) -> list[bytes]:
    return [line.encode() for line in path.read_text().splitlines() if line]


def _proto(line: bytes) -> bytes:
    return parse_traces_data(line).SerializeToString()


def _framed(messages: list[bytes]) -> bytes:
    return b"".join(len(m).to_bytes(4, "big") + m for m in messages)


_ZSTD = zstandard.ZstdCompressor()
SHAPES: dict[str, Callable[[list[bytes]], bytes]] = {
    "json, compression zstd (one frame per message)": lambda ms: _framed([_ZSTD.compress(m) for m in ms]),
    "proto": lambda ms: _framed([_proto(m) for m in ms]),
    "proto, compression zstd": lambda ms: _framed([_ZSTD.compress(_proto(m)) for m in ms]),
    "json, native zstd stream": lambda ms: _ZSTD.compress(b"".join(m + b"\n" for m in ms)),
    "proto, native zstd stream": lambda ms: _ZSTD.compress(_framed([_proto(m) for m in ms])),
}


def _spans(store: Path) -> pa.Table:
    with Store.open(store) as s:
        return s.sql("SELECT * FROM spans ORDER BY trace_id, span_id").to_arrow_table()


@pytest.mark.parametrize("shape", SHAPES)
def test_each_file_exporter_shape_ingests_the_spans_of_its_json_lines(json_lines: Path, tmp_path: Path,
                                                                      shape: str) -> None:
    messages = _messages(json_lines)
    assert len(messages) > 20
    path = tmp_path / "traces.json"  # the exporter's `path`: the name says nothing of the shape
    path.write_bytes(SHAPES[shape](messages))
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.skipped == 0 and summary.lines == len(messages)
    plain = ingest_paths(tmp_path / "plain", [json_lines])
    assert summary.spans_read == plain.spans_read > 0
    assert _spans(tmp_path / "store").equals(_spans(tmp_path / "plain"))


def test_a_protobuf_messages_line_takes_the_columnar_path_as_its_json_line_does(json_lines: Path) -> None:
    """A `format: proto` file's messages become the lines the Collector's JSON exporter writes (times as strings),
    which Arrow's reader takes whole, as it takes the JSON line's; before, the times were numbers and every block
    of such a file went record by record (BENCHMARKS.md, "Ingest")."""
    from infertrace.otlp_files import LengthPrefixed
    from infertrace.store.columnar import decode_block

    messages = _messages(json_lines)
    converted = LengthPrefixed(io.BytesIO(_framed([_proto(m) for m in messages]))).read().splitlines()
    assert len(converted) == len(messages)
    for line, plain in zip(converted, messages, strict=True):
        from_proto, from_json = decode_block(line + b"\n", len(line)), decode_block(plain + b"\n", len(plain))
        assert from_proto is not None and from_json is not None
        assert from_proto[0].equals(from_json[0])


@pytest.mark.parametrize("damage", ["cut inside a message", "cut inside a length", "an absurd length",
                                    "a message neither JSON nor protobuf"])
def test_a_damaged_length_prefixed_file_keeps_the_messages_before_the_damage(json_lines: Path, tmp_path: Path,
                                                                             damage: str) -> None:
    messages = [_proto(m) for m in _messages(json_lines)]
    before = _framed(messages[:3])
    rest = {"cut inside a message": _framed(messages[3:4])[:-10],
            "cut inside a length": b"\x00\x00",
            "an absurd length": (2 << 30).to_bytes(4, "big") + messages[3],
            "a message neither JSON nor protobuf": _framed([b"\xff\xff\xff", *messages[4:]])}[damage]
    path = tmp_path / "traces.pb"
    path.write_bytes(before + rest)
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.lines == 3 and summary.rejected_lines == 1
    expected = sum(len(ss.spans) for m in messages[:3] for rs in TracesData.FromString(m).resource_spans
                   for ss in rs.scope_spans)
    assert summary.spans_read == expected
    kept = [json.loads(x) for q in (tmp_path / "store" / "quarantine").iterdir() for x in q.read_text().splitlines()]
    assert len(kept) == 1 and "unreadable" in kept[0]["reason"] and "message 4" in kept[0]["reason"], kept


@pytest.mark.parametrize("blank", [b"\n", b"\n" * 3, b"\n\n  \n\t\n"])
def test_a_json_lines_file_is_not_taken_for_length_prefixed_or_protobuf_messages(json_lines: Path, tmp_path: Path,
                                                                                  blank: bytes) -> None:
    padded = tmp_path / "padded.jsonl"  # JSON lines whose first line is preceded by blank ones (0x0a, as protobuf)
    padded.write_bytes(blank + json_lines.read_bytes())
    assert ingest_paths(tmp_path / "store", [padded]).skipped == 0
    assert ingest_paths(tmp_path / "store", [json_lines]).spans_new == 0  # the same spans


@pytest.mark.parametrize("packed", ["plain", "gzip"])
def test_one_protobuf_message_with_no_length_ingests_as_its_json(json_lines: Path, tmp_path: Path,
                                                                 packed: str) -> None:
    """An OTLP/HTTP request body saved as it was sent (`TracesData` and `ExportTraceServiceRequest` are the same
    bytes), or a .binpb file: one message, all the spans of the JSON lines merged into it."""
    merged = TracesData()
    for line in _messages(json_lines):
        merged.MergeFrom(parse_traces_data(line))
    body = merged.SerializeToString()
    path = tmp_path / "request.binpb"
    path.write_bytes(gzip.compress(body) if packed == "gzip" else body)
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.skipped == 0 and summary.lines == 1
    plain = ingest_paths(tmp_path / "plain", [json_lines])
    assert summary.spans_read == plain.spans_read > 0
    assert _spans(tmp_path / "store").equals(_spans(tmp_path / "plain"))


def test_a_zstd_file_cut_mid_frame_keeps_every_line_before_the_cut(tmp_path: Path) -> None:
    lines = [json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": "auth", "startTimeUnixNano": str(T0),
        "endTimeUnixNano": str(T0 + 1)}]}]}]}).encode() for i in range(6)]  # a few hundred bytes in all
    packed = io.BytesIO()
    writer = zstandard.ZstdCompressor().stream_writer(packed, closefd=False)
    writer.write(b"".join(line + b"\n" for line in lines[:5]))
    writer.flush()  # the first five lines decode on their own
    complete = packed.tell()
    writer.write(lines[5] + b"\n")
    writer.flush(zstandard.FLUSH_FRAME)
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(packed.getvalue()[:(complete + packed.tell()) // 2])
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.spans_read == summary.lines == 5 and summary.rejected_lines == 1
    kept = [json.loads(x) for q in (tmp_path / "store" / "quarantine").iterdir() for x in q.read_text().splitlines()]
    assert len(kept) == 1 and "truncated" in kept[0]["reason"], kept


METRICS = {"resourceMetrics": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]},
                                "scopeMetrics": [{"scope": {"name": "vllm"}, "metrics": [{
                                    "name": "vllm:num_requests_running", "gauge": {"dataPoints": [{
                                        "timeUnixNano": str(T0), "asDouble": 3}]}}]}]}]}
LOGS = {"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{"scope": {}, "logRecords": [{
    "timeUnixNano": str(T0), "severityText": "INFO", "body": {"stringValue": "Avg prompt throughput: 0 tokens/s"}}]}]}]}


@pytest.mark.parametrize("shape", ["json lines", "json, compression zstd (one frame per message)"])
def test_metrics_and_logs_in_a_shared_file_exporter_file_are_left_out_and_said_not_quarantined(
        json_lines: Path, tmp_path: Path, shape: str) -> None:
    traces = _messages(json_lines)
    mixed: list[bytes] = []
    for i, message in enumerate(traces):  # as a file exporter in three pipelines writes them, interleaved
        mixed += [message, json.dumps(METRICS).encode()] + ([json.dumps(LOGS).encode()] if i % 3 == 0 else [])
    path = tmp_path / "otel-export.json"
    path.write_bytes(b"".join(m + b"\n" for m in mixed) if shape == "json lines" else SHAPES[shape](mixed))
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.skipped == 0 and not (tmp_path / "store" / "quarantine").exists()
    assert summary.other_signals == {"metrics": len(traces), "logs": (len(traces) + 2) // 3}
    assert f"Left out {len(mixed) - len(traces)} lines of other OTLP signals" in summary.paragraph()
    ingest_paths(tmp_path / "plain", [json_lines])
    assert _spans(tmp_path / "store").equals(_spans(tmp_path / "plain"))
