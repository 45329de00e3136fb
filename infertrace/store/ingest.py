"""Ingest of OTLP JSON lines files (the OpenTelemetry Collector's file exporter format) into a store.

Streaming: a block of whole lines (about `block_bytes`) is parsed, written as segments and dropped, so
memory is bounded by the block, not by the file (two blocks: the next one is parsed on a parser thread while
the current one is written). A block is parsed by Arrow's C++ JSON reader into columns (`columnar`); a block
that path cannot take whole (bad lines, unusual values) is parsed record by record (`batch`), which
quarantines each bad line or span with its reason. There the garbage collector is paused while the block is
parsed (it costs more than the parsing itself on many small objects).
"""

from __future__ import annotations

import gc
import glob
import gzip
import json
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

DEFAULT_BLOCK_BYTES = 32 << 20  # of JSON lines per block: bounds memory
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


def ingest_paths(root: Path, paths: list[str | Path], block_bytes: int = DEFAULT_BLOCK_BYTES,
                 on_progress: Callable[[int], None] | None = None, columnar: bool = True) -> IngestSummary:
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
                    try:
                        lines = stream.readlines(block_bytes)
                    except (OSError, EOFError) as e:  # a truncated or corrupt .gz: keep what was read before
                        unreadable = [Rejection(source, line_no + 1, f"unreadable: {e}", "")]
                        summary.add_rejections(unreadable, 1)
                        _quarantine(root, unreadable, summary)
                        break
                    if not lines:
                        break
                    block = _Block(lines, line_no + 1, parser.submit(_parse, lines) if columnar else None,
                                   raw.tell())
                    line_no += len(lines)
                    if pending is not None:
                        position = _finish_block(root, pending, source, summary, on_progress, position)
                    pending = block
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
    table = spans_table(parsed) if parsed is not None else None
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
        del batch
        gc.collect()
    if table is not None and table.num_rows:
        segments, new = write_segments(root, table)
        summary.spans_read += table.num_rows
        summary.spans_new += new
        summary.segments += len(segments)
    return whole
