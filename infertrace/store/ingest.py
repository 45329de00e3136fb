"""Ingest of OTLP JSON lines files (the OpenTelemetry Collector's file exporter format) into a store.

Streaming: a block of whole lines (about `block_bytes`) is parsed, written as segments and dropped, so
memory is bounded by the block, not by the file (two blocks: the next one is parsed on a parser thread while
the current one is written). A line longer than `max_line_bytes` is never held whole: it is skipped and
quarantined with its length and first bytes. A file that ends mid-stream (a truncated .gz) keeps every
complete line read before the break; the unreadable tail is quarantined.

A block is parsed by Arrow's C++ JSON reader into columns (`columnar`); a block that path cannot take
whole (bad lines, unusual values) is parsed record by record (`batch`), which quarantines each bad line or
span with its reason. There the garbage collector is paused while the block is parsed (it costs more than
the parsing itself on many small objects).
"""

from __future__ import annotations

import gc
import glob
import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pyarrow as pa

from infertrace.store.batch import BadRecord, Rejection, SpanBatch
from infertrace.store.columnar import parse_block, spans_table
from infertrace.store.segments import write_quarantine, write_segments
from infertrace.store.values import Notes, describe, merge_counts

DEFAULT_BLOCK_BYTES = 32 << 20  # of JSON lines per block: bounds memory
DEFAULT_MAX_LINE_BYTES = 32 << 20  # a longer line is quarantined unread (the collector's default body cap)
_SKIP_CHUNK = 1 << 20
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
    notes: dict[str, dict[str, int]] = field(default_factory=dict)  # converted/truncated/... → key → count

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
        if self.notes:
            said = describe(self.notes)
            text += " Stored every span, but " + said + "."
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


@dataclass
class _Block:
    """A block of lines read from a file, its Arrow parse under way on the parser thread."""

    lines: list[bytes]
    first_line: int
    parsed: Future[pa.Table | None] | None  # None: parse record by record
    read_to: int  # position in the (compressed) file after the block


def _parse(lines: list[bytes]) -> pa.Table | None:
    content = [line for line in lines if line.strip()]
    if not content:
        return None
    return parse_block(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in content),
                       max(map(len, content)))


@dataclass
class _Read:
    lines: list[bytes]
    rejections: list[Rejection]  # lines over the length limit, and an unreadable tail
    failed: bool  # the file cannot be read further


def _skip_line(stream: IO[bytes]) -> int:
    """Reads and drops the rest of a line; returns how many bytes that was."""
    skipped = 0
    while chunk := stream.readline(_SKIP_CHUNK):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _read_block(stream: IO[bytes], block_bytes: int, max_line: int, source: str, first_line: int) -> _Read:
    """About `block_bytes` of whole lines; a line over `max_line` is replaced by a blank line (so line
    numbers stay right) and rejected with its length."""
    lines: list[bytes] = []
    rejections: list[Rejection] = []
    size = 0
    try:
        while size < block_bytes:
            line = stream.readline(max_line + 1)
            if not line:
                break
            if len(line) > max_line:
                total = len(line) + (0 if line.endswith(b"\n") else _skip_line(stream))
                rejections.append(Rejection(
                    source, first_line + len(lines), f"line of {total} bytes is over the limit of {max_line} "
                    f"bytes (--max-line-bytes)", line[:200].decode("utf-8", "replace") + "…"))
                lines.append(b"\n")
                continue
            lines.append(line)
            size += len(line)
    except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz: keep the lines read before
        rejections.append(Rejection(source, first_line + len(lines),
                                    f"unreadable from this line on (truncated or corrupt file?): {e}", ""))
        return _Read(lines, rejections, True)
    return _Read(lines, rejections, False)


def ingest_paths(root: Path, paths: list[str | Path], block_bytes: int = DEFAULT_BLOCK_BYTES,
                 on_progress: Callable[[int], None] | None = None, columnar: bool = True,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> IngestSummary:
    """Ingests OTLP JSON lines files into the store at `root`, a block of about `block_bytes` of whole lines
    at a time (one or more segments per block). `on_progress(bytes)` is called with the number of
    (compressed) bytes read since its last call. `columnar=False` parses every block record by record
    (the fallback path; for tests and the benchmark).

    Pipelined: while a block is turned into spans and written, Arrow parses the next one on a parser thread
    (its JSON reader runs in C++ without the GIL), so at most two blocks are in memory."""
    files = expand_paths(paths)
    summary = IngestSummary(files=len(files))
    root.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="infertrace-parse") as parser:
        for path in files:
            raw, stream = _open(path)
            with raw, stream:
                position = 0
                line_no = 0
                source = str(path)
                pending: _Block | None = None
                while True:
                    read = _read_block(stream, block_bytes, max_line_bytes, source, line_no + 1)
                    if read.rejections:
                        summary.add_rejections(read.rejections, len(read.rejections))
                        _quarantine(root, read.rejections, summary)
                    lines = read.lines
                    if lines:
                        block = _Block(lines, line_no + 1, parser.submit(_parse, lines) if columnar else None,
                                       raw.tell())
                        line_no += len(lines)
                        if pending is not None:
                            position = _finish_block(root, pending, source, summary, on_progress, position)
                        pending = block
                    if read.failed or not lines:
                        break
                if pending is not None:
                    _finish_block(root, pending, source, summary, on_progress, position)
                summary.lines += line_no
    return summary


def _finish_block(root: Path, block: _Block, source: str, summary: IngestSummary,
                  on_progress: Callable[[int], None] | None, position: int) -> int:
    """Stores one block; returns the file position progress has been reported to."""
    rejections: list[Rejection] = []
    parsed = block.parsed.result() if block.parsed is not None else None
    whole = _ingest_block(root, block.lines, block.first_line, source, parsed, summary, rejections)
    summary.add_rejections(rejections, whole)
    _quarantine(root, rejections, summary)
    if on_progress is not None:
        on_progress(block.read_to - position)
    return block.read_to


def _quarantine(root: Path, rejections: list[Rejection], summary: IngestSummary) -> None:
    path = write_quarantine(root, rejections)
    if path is not None:
        summary.quarantine.append(path)


def _ingest_block(root: Path, lines: list[bytes], first_line: int, source: str, parsed: pa.Table | None,
                  summary: IngestSummary, rejections: list[Rejection]) -> int:
    """Stores one block of lines (`parsed` by Arrow, or None); returns how many lines were rejected whole."""
    decoded = spans_table(parsed) if parsed is not None else None
    table, notes = decoded if decoded is not None else (None, Notes())
    whole = 0
    if table is None:
        batch = SpanBatch()
        with gc_paused():
            for offset, line in enumerate(lines):
                line_no = first_line + offset
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except (ValueError, RecursionError) as e:
                    rejections.append(Rejection(source, line_no, f"not JSON: {e}",
                                                line.decode("utf-8", "replace").rstrip("\r\n")))
                    whole += 1
                    continue
                try:
                    batch.add_traces_data(data, source, line_no)
                except BadRecord as e:
                    rejections.append(Rejection(source, line_no, f"not a TracesData: {e}",
                                                line.decode("utf-8", "replace").rstrip("\r\n")))
                    whole += 1
        rejections += batch.rejections
        table = batch.table() if batch.num_spans else None
        notes = batch.notes
        del batch
        gc.collect()
    if table is not None and table.num_rows:
        written = write_segments(root, table, notes)
        summary.spans_read += table.num_rows
        summary.spans_new += written.spans_new
        summary.segments += len(written.segments)
        merge_counts(summary.notes, notes.counts())
    return whole
