"""Ingest of OTLP JSON lines files (the OpenTelemetry Collector's file exporter format) into a store.

Streaming: lines are parsed into a batch of at most `batch_spans` spans, written as segments, and dropped,
so memory is bounded by the batch, not by the file. The garbage collector is paused while a batch is
parsed (it costs more than the parsing itself on millions of small objects) and runs between batches.
"""

from __future__ import annotations

import gc
import glob
import gzip
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from infertrace.store.batch import BadRecord, Rejection, SpanBatch
from infertrace.store.segments import write_quarantine, write_segments

DEFAULT_BATCH_SPANS = 50_000
_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz")


@dataclass
class IngestSummary:
    files: int = 0
    lines: int = 0
    spans_read: int = 0  # spans parsed and accepted
    spans_new: int = 0  # of those, spans not already in the store
    segments: int = 0
    rejected_lines: int = 0
    rejected_spans: int = 0
    quarantine: list[Path] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)  # reason → count

    @property
    def skipped(self) -> int:
        return self.rejected_lines + self.rejected_spans

    def add_rejections(self, rejections: list[Rejection], whole_lines: int) -> None:
        self.rejected_lines += whole_lines
        self.rejected_spans += len(rejections) - whole_lines
        for r in rejections:
            self.reasons[r.reason] = self.reasons.get(r.reason, 0) + 1

    def paragraph(self) -> str:
        text = (f"Ingested {self.spans_read} spans from {self.lines} lines of {self.files} files: "
                f"{self.spans_new} new, {self.spans_read - self.spans_new} already stored, "
                f"in {self.segments} segments.")
        if self.skipped:
            top = sorted(self.reasons.items(), key=lambda kv: -kv[1])[:5]
            text += (f" Skipped {self.rejected_lines} lines and {self.rejected_spans} spans, kept in "
                     f"{', '.join(map(str, self.quarantine))}; most common reasons: "
                     + "; ".join(f"{reason} ({n})" for reason, n in top) + ".")
        return text


def expand_paths(paths: list[str | Path]) -> list[Path]:
    """Files, directories (searched recursively for OTLP JSON lines files) and glob patterns, in order,
    each file once. Raises FileNotFoundError for a path that matches nothing."""
    found: dict[Path, None] = {}
    for raw in paths:
        text = str(raw)
        matches = [Path(m) for m in sorted(glob.glob(text, recursive=True))] if glob.has_magic(text) else [Path(text)]
        if not matches or not any(m.exists() for m in matches):
            raise FileNotFoundError(f"{text}: no such file or directory")
        for match in matches:
            if match.is_dir():
                for path in sorted(match.rglob("*")):
                    if path.is_file() and path.name.endswith(_SUFFIXES):
                        found.setdefault(path)
            elif match.is_file():
                found.setdefault(match)
    return list(found)


def _open(path: Path) -> tuple[IO[bytes], IO[bytes]]:
    """(raw file, stream of decompressed bytes); the raw file's position measures progress."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw, raw


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def ingest_paths(root: Path, paths: list[str | Path], batch_spans: int = DEFAULT_BATCH_SPANS,
                 on_progress: Callable[[int], None] | None = None) -> IngestSummary:
    """Ingests OTLP JSON lines files into the store at `root`. `on_progress(bytes)` is called with the
    number of (compressed) bytes read since its last call."""
    files = expand_paths(paths)
    summary = IngestSummary(files=len(files))
    root.mkdir(parents=True, exist_ok=True)
    batch = SpanBatch()
    rejections: list[Rejection] = []
    whole_lines = 0

    def flush() -> None:
        nonlocal batch, rejections, whole_lines
        rejections += batch.rejections
        if batch.num_spans:
            segments, new = write_segments(root, batch.table())
            summary.spans_read += batch.num_spans
            summary.spans_new += new
            summary.segments += len(segments)
        summary.add_rejections(rejections, whole_lines)
        quarantine = write_quarantine(root, rejections)
        if quarantine is not None:
            summary.quarantine.append(quarantine)
        batch, rejections, whole_lines = SpanBatch(), [], 0
        gc.collect()

    for path in files:
        raw, stream = _open(path)
        with raw, stream:
            position = 0
            line_no = 0
            source = str(path)
            while True:
                with gc_paused():
                    while batch.num_spans < batch_spans:
                        try:
                            line = stream.readline()
                        except (OSError, EOFError) as e:  # a truncated or corrupt .gz
                            rejections.append(Rejection(source, line_no + 1, f"unreadable: {e}", ""))
                            whole_lines += 1
                            line = b""
                        if not line:
                            break
                        line_no += 1
                        if not line.strip():
                            continue
                        try:
                            data = json.loads(line)
                        except (ValueError, RecursionError) as e:
                            rejections.append(Rejection(source, line_no, f"not JSON: {e}",
                                                        line.decode("utf-8", "replace").rstrip("\r\n")))
                            whole_lines += 1
                            continue
                        try:
                            batch.add_traces_data(data, source, line_no)
                        except BadRecord as e:
                            rejections.append(Rejection(source, line_no, f"not a TracesData: {e}",
                                                        line.decode("utf-8", "replace").rstrip("\r\n")))
                            whole_lines += 1
                    full = batch.num_spans >= batch_spans
                if on_progress is not None:
                    now = raw.tell()
                    on_progress(now - position)
                    position = now
                if not full:
                    break
                flush()
            summary.lines += line_no
    flush()
    return summary


def file_size(path: Path) -> int:
    return os.path.getsize(path)
