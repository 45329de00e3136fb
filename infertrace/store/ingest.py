"""Ingest of OTLP JSON lines files (the OpenTelemetry Collector's file exporter format) into a store.

Streaming: a block of whole lines (about `block_bytes`, read in chunks) is parsed, written as segments and
dropped, so memory is bounded by the block, not by the file (three blocks: the next one is parsed on a parser
thread and the previous one written on a writer thread while this thread turns one into spans). A line
longer than `max_line_bytes` is never held whole: it is skipped and quarantined with its length and first
bytes. A file that ends mid-stream (a truncated .gz or .zst) keeps every complete line read before the break; the
unreadable tail is quarantined.

A block is parsed by Arrow's C++ JSON reader into columns (`columnar`; after the first block, with the OTLP
schema less the fields no earlier block set, which gives the same table for less work); a block that path
cannot take whole (bad lines, unusual values) is parsed record by record (`batch`), which quarantines each bad
line or span with its reason. The garbage collector is paused for the whole ingest. What it saves is fixed,
not per block: in a process that has not imported pandas, pyarrow imports it on the first `pa.array` of the
first block, and the collector's passes during that import cost ≈ 0.4 s (about 10% of an ingest of the engine
hour; nothing once pandas is loaded). A block leaves no cyclic garbage behind (the same handful of objects is
collected after a fleet hour of 25 blocks as after one block; a test checks it). The record path also collects
after each of its blocks (its many small objects cost more than its parsing).
"""

from __future__ import annotations

import gc
import glob
import json
import mmap
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pyarrow as pa

from infertrace.otlp_files import SUFFIXES, bytes_in
from infertrace.store.batch import BadRecord, Rejection, SpanBatch, other_signal
from infertrace.store.columnar import BlockParser, spans_table
from infertrace.store.content import without_content
from infertrace.store.segments import (
    CORRUPT_DIR,
    QUARANTINE_DIR,
    SPANS_DIR,
    Written,
    keep_resource,
    write_quarantine,
    write_segments,
)
from infertrace.store.values import Notes, describe, merge_counts

DEFAULT_BLOCK_BYTES = 32 << 20  # of JSON lines per block: bounds memory
DEFAULT_MAX_LINE_BYTES = 32 << 20  # a longer line is quarantined unread (the collector's default body cap)
_READ_CHUNK = 4 << 20  # bytes asked of the stream at a time


@dataclass
class IngestSummary:
    files: int = 0
    lines: int = 0
    spans_read: int = 0  # spans parsed and accepted
    spans_new: int = 0  # of those, spans not already in the store
    segments: int = 0
    rejected_lines: int = 0
    rejected_spans: int = 0
    left_out: int = 0  # spans read whose resource did not match `resource` (ingest_paths)
    store_files: int = 0  # files found inside the store itself (its quarantine), not read
    other_signals: dict[str, int] = field(default_factory=dict)  # metrics/logs/profiles → lines left out
    resource: tuple[tuple[str, str], ...] = ()  # the resource attributes a span had to have to be kept
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
        if self.store_files:
            text += (f" Left out {self.store_files} files inside the store itself (its quarantine: a store is never "
                     "read as input).")
        if self.resource:
            wanted = ", ".join(f"{k}={v}" for k, v in self.resource)
            text += f" Left out {self.left_out} spans whose resource is not {wanted}."
        if self.other_signals:
            kinds = ", ".join(f"{signal} {n}" for signal, n in sorted(self.other_signals.items()))
            text += (f" Left out {sum(self.other_signals.values())} lines of other OTLP signals ({kinds}): infertrace "
                     "reads traces (a Collector's file exporter in several pipelines writes every signal into its "
                     "file).")
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
                    if path.is_file() and path.name.endswith(SUFFIXES):
                        found.setdefault(path)
            elif match.is_file():
                found.setdefault(match)
    return list(found)


def in_store(path: Path, root: Path) -> bool:
    """Whether `path` is one of the store's own files at `root` (its quarantine's JSON lines match what a
    directory of exports is searched for: `ingest --store exports/store exports/` would read them back, and
    quarantine them again, on every run). Other files under `root` are inputs like any (`--store .` in a
    directory of exports)."""
    resolved, store = path.resolve(), root.resolve()
    return any(resolved.is_relative_to(store / owned) for owned in (QUARANTINE_DIR, SPANS_DIR, CORRUPT_DIR))


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Lines:
    """Blocks of whole lines read from a (decompressed) stream, in chunks (never line by line).

    A block ends with the first line that reaches `block_bytes`, so a file is cut at the same places every
    time. A line over `max_line` bytes (newline included) is never held whole: it is read through, rejected
    with its length and first bytes, and left in the block as a blank line so that line numbers stay right.
    A read error (a truncated or corrupt .gz or .zst) ends the file: the complete lines before it are kept, and the
    rest is rejected as unreadable.

    Chunks are read straight into one of two block buffers, used in turn: fresh memory for every chunk and
    block cost more than reading into the same memory again (the kernel clears every new page). The buffers
    are anonymous memory maps, so that a small file touches only the pages it fills. A block's `data` is valid
    until the block after the next one is read; then it is released (reading it raises ValueError, and
    releasing a buffer Arrow still holds raises BufferError)."""

    def __init__(self, stream: IO[bytes], max_line: int, source: str) -> None:
        self.stream, self.max_line, self.source = stream, max_line, source
        # readinto1: at most one read of the file or the gzip member (Arrow's zstd stream has only readinto)
        self._readinto = getattr(stream, "readinto1", None) or stream.readinto
        self.carry = b""  # bytes read after the end of the last block: the start of the next one
        self.failed = False  # the stream cannot be read further
        self.ended = False  # the stream has no more bytes
        self.line = 1  # number of the next line
        self._buffers: list[mmap.mmap | None] = [None, None]  # block buffers, used in turn
        self._given: list[memoryview | None] = [None, None]  # the `data` last handed out from each
        self._turn = 0
        self._block_bytes = 0  # of the block being read

    def block(self, block_bytes: int) -> _Read:
        """The next block of lines (`data` ends with a newline; empty at the end of the stream; valid until the
        block after this one is read)."""
        rejections: list[Rejection] = []
        first, size, longest, objects = self.line, 0, 0, True  # objects: whether every line starts with `{`
        self._turn = turn = 1 - self._turn
        self._block_bytes = block_bytes
        given = self._given[turn]
        if given is not None:
            given.release()  # the block read two blocks ago, done with (BufferError if Arrow still holds it)
        buffer = self._room(0, len(self.carry))
        buffer[:len(self.carry)] = self.carry
        start, scan, end = 0, 0, len(self.carry)  # the current line starts at `start`; no newline before `scan`
        while size < block_bytes:
            newline = buffer.find(b"\n", scan, end)
            if newline >= 0 and newline + 1 - start <= self.max_line:
                objects = objects and buffer[start] == ord("{")
                size += newline + 1 - start
                longest = max(longest, newline + 1 - start)
                self.line += 1
                start = scan = newline + 1
                continue
            if newline >= 0 or end - start > self.max_line:  # a line over the limit: blank in the block
                end = self._reject_long(buffer, start, end, newline, rejections)
                buffer = self._room(0, 0)
                objects = False
                start = scan = start + 1
                continue
            scan = end
            buffer = self._room(end, end + _READ_CHUNK)
            read = self._read(buffer, end, rejections)
            if not read:
                if end > start and not self.failed:  # a last line without a newline
                    objects = objects and buffer[start] == ord("{")
                    buffer = self._room(end, end + 1)
                    buffer[end:end + 1] = b"\n"
                    end += 1
                    size += end - start
                    longest = max(longest, end - start)
                    self.line += 1
                    start = end
                break
            end += read
        self.carry = bytes(memoryview(buffer)[start:end]) if not self.failed else b""
        with memoryview(buffer) as view:
            data = self._given[turn] = view[:start]
        return _Read(data, first, self.line - first, longest, rejections, objects)

    def _room(self, keep: int, need: int) -> mmap.mmap:
        """The block buffer in use, with room for `need` bytes and its first `keep` bytes kept (a bigger one
        replaces it when it has not: at first a block and two chunks, up to 1 GB; after that twice as big)."""
        buffer = self._buffers[self._turn]
        size = 0 if buffer is None else len(buffer)
        if size < need or buffer is None:
            grown = mmap.mmap(-1, max(need, 2 * size, min(self._block_bytes + 2 * _READ_CHUNK, 1 << 30)))
            if buffer is not None:
                grown[:keep] = memoryview(buffer)[:keep]
            buffer = self._buffers[self._turn] = grown
        return buffer

    def _read(self, buffer: mmap.mmap, at: int, rejections: list[Rejection]) -> int:
        """Reads the next chunk into `buffer` at `at`; 0 at the end of the stream or on a read error (rejected)."""
        if self.failed or self.ended:
            return 0
        try:
            with memoryview(buffer) as view, view[at:at + _READ_CHUNK] as room:
                read = self._readinto(room)
        except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz or .zst: keep the lines read before
            self.failed = True
            rejections.append(Rejection(self.source, self.line,
                                        f"unreadable from this line on (truncated or corrupt file?): {e}", ""))
            return 0
        self.ended = not read
        return read

    def _reject_long(self, buffer: mmap.mmap, start: int, end: int, newline: int,
                     rejections: list[Rejection]) -> int:
        """Rejects the line at `start` (its newline at `newline`, or not read yet: -1), reading the rest of it
        through (into the same bytes, never held whole), and leaves a blank line in its place; returns the new
        end of the bytes read."""
        head = bytes(buffer[start:min(start + 200, newline + 1 if newline >= 0 else end)])
        total = newline + 1 - start if newline >= 0 else end - start
        while newline < 0:
            end = start + 1
            buffer = self._room(end, end + _READ_CHUNK)
            read = self._read(buffer, end, rejections)
            if not read:
                break
            newline = buffer.find(b"\n", end, end + read)
            total += read if newline < 0 else newline + 1 - end
            end += read
        rest = buffer[newline + 1:end] if newline >= 0 else b""
        buffer[start:start + 1 + len(rest)] = b"\n" + rest
        rejections.append(Rejection(self.source, self.line, f"line of {total} bytes is over the limit of "
                                    f"{self.max_line} bytes (--max-line-bytes)",
                                    head.decode("utf-8", "replace") + "…"))
        self.line += 1
        return start + 1 + len(rest)


@dataclass
class _Read:
    data: memoryview  # whole lines, each ending with a newline (in a buffer `_Lines` reuses)
    first_line: int
    lines: int
    longest: int  # bytes of the longest line, newline included
    rejections: list[Rejection]  # lines over the length limit, and an unreadable tail
    objects: bool  # whether every line starts with `{` (a placeholder of a line over the limit is blank)


@dataclass
class _Block:
    """A block of lines read from a file, its Arrow parse under way on the parser thread."""

    read: _Read
    parsed: Future[pa.Table | None] | None  # None: parse record by record
    read_to: int  # position in the (compressed) file after the block


def ingest_paths(root: Path, paths: list[str | Path], block_bytes: int = DEFAULT_BLOCK_BYTES,
                 on_progress: Callable[[int], None] | None = None, columnar: bool = True,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                 resource: Sequence[tuple[str, str]] = (), labels: dict[str, str] | None = None) -> IngestSummary:
    """Ingests OTLP JSON lines files into the store at `root`, a block of about `block_bytes` of whole lines
    at a time (one or more segments per block). `on_progress(bytes)` is called with the number of
    (compressed) bytes read since its last call, once the block is stored. `columnar=False` parses every
    block record by record (the fallback path; for tests and the benchmark). With `resource` ((key, value)
    pairs), only the spans whose resource has every one of those attributes (compared as text) are stored: one
    deployment environment of a collector's output, say; the others are counted in `left_out`. `labels`: what
    rejections call a file instead of its path (`<stdin>` for the CLI's copy of standard input).

    Pipelined over three threads: while a block is turned into spans (this thread), Arrow parses the next one
    (its JSON reader runs in C++ without the GIL) and the previous one's Parquet segments are written (also in
    C++ without the GIL), so at most three blocks are in memory."""
    found = expand_paths(paths)
    files = [path for path in found if not in_store(path, root)]
    summary = IngestSummary(files=len(files), resource=tuple(resource), store_files=len(found) - len(files))
    blocks = BlockParser()  # on the parser thread only, one block after another
    root.mkdir(parents=True, exist_ok=True)
    with gc_paused(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="infertrace-parse") as parser, \
            _Writer(root, summary, on_progress) as writer:
        for path in files:
            source = (labels or {}).get(str(path), str(path))
            raw, stream = bytes_in(path)
            with raw, stream:
                lines = _Lines(stream, max_line_bytes, source)
                position = 0  # in the file, up to which progress is reported
                pending: _Block | None = None
                while True:
                    read = lines.block(block_bytes)
                    if read.rejections:
                        summary.add_rejections(read.rejections, len(read.rejections))
                        _quarantine(root, read.rejections, summary)
                    if read.lines:
                        block = _Block(read, parser.submit(blocks.parse, read.data, read.longest, read.objects)
                                       if columnar and read.data else None, raw.tell())
                        if pending is not None:
                            position = _finish_block(pending, source, summary, writer, position)
                        pending = block
                    if lines.failed or not read.lines:
                        break
                if pending is not None:
                    _finish_block(pending, source, summary, writer, position)
                summary.lines += lines.line - 1
    return summary


class _Writer:
    """Writes blocks' segments on a writer thread, one block at a time, in order; progress is reported once
    a block is stored. An error of the disk is raised by the next `submit` or on leaving the `with`."""

    def __init__(self, root: Path, summary: IngestSummary, on_progress: Callable[[int], None] | None) -> None:
        self.root, self.summary, self.on_progress = root, summary, on_progress
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="infertrace-write")
        self._pending: tuple[Future[Written | None], int] | None = None

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self._collect()
        finally:
            self._pool.shutdown(wait=True)

    def submit(self, table: pa.Table | None, notes: Notes, progress: int) -> None:
        """Writes `table` once the previous block is written (memory stays bounded), then reports `progress`
        bytes of the file."""
        self._collect()
        self._pending = (self._pool.submit(self._write, table, notes), progress)

    def _write(self, table: pa.Table | None, notes: Notes) -> Written | None:
        return write_segments(self.root, table, notes) if table is not None and table.num_rows else None

    def _collect(self) -> None:
        if self._pending is None:
            return
        future, progress = self._pending
        self._pending = None
        written = future.result()
        if written is not None:
            self.summary.spans_new += written.spans_new
            self.summary.segments += len(written.segments)
        if self.on_progress is not None:
            self.on_progress(progress)


def _finish_block(block: _Block, source: str, summary: IngestSummary, writer: _Writer, position: int) -> int:
    """Turns one block into spans and hands them to the writer; returns the file position progress will
    have been reported to."""
    rejections: list[Rejection] = []
    parsed = block.parsed.result() if block.parsed is not None else None
    table, notes, whole = _block_spans(block.read, source, parsed, rejections, summary.other_signals)
    summary.add_rejections(rejections, whole)
    _quarantine(writer.root, rejections, summary)
    if table is not None and summary.resource:
        table, notes, left_out = keep_resource(table, notes, summary.resource)
        summary.left_out += left_out
    if table is not None:
        summary.spans_read += table.num_rows
        merge_counts(summary.notes, notes.counts())
    writer.submit(table, notes, block.read_to - position)
    return block.read_to


def _quarantine(root: Path, rejections: list[Rejection], summary: IngestSummary) -> None:
    path = write_quarantine(root, rejections)
    if path is not None:
        summary.quarantine.append(path)


def _block_spans(read: _Read, source: str, parsed: pa.Table | None, rejections: list[Rejection],
                 other_signals: dict[str, int]) -> tuple[pa.Table | None, Notes, int]:
    """One block of lines (`parsed` by Arrow, or None) → (its spans, their notes, how many lines were rejected
    whole); rejected lines and spans are added to `rejections`, lines of other OTLP signals counted in
    `other_signals`."""
    decoded = spans_table(parsed) if parsed is not None else None
    if decoded is not None:
        return decoded[0], decoded[1], 0
    whole = 0
    batch = SpanBatch()
    with gc_paused():
        for offset, line in enumerate(bytes(read.data).split(b"\n")[:read.lines]):
            line_no = read.first_line + offset
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except (ValueError, RecursionError) as e:
                rejections.append(Rejection(source, line_no, f"not JSON: {e}",
                                            line.decode("utf-8", "replace").rstrip("\r\n")))
                whole += 1
                continue
            signal = other_signal(data)
            if signal is not None:
                other_signals[signal] = other_signals.get(signal, 0) + 1
                continue
            try:
                batch.add_traces_data(data, source, line_no)
            except BadRecord as e:
                kept = without_content(data)  # the line as it was, unless it holds message text
                rejections.append(Rejection(source, line_no, f"not a TracesData: {e}",
                                            line.decode("utf-8", "replace").rstrip("\r\n") if kept == data
                                            else json.dumps(kept, separators=(",", ":"))))
                whole += 1
    rejections += batch.rejections
    table = batch.table() if batch.num_spans else None
    notes = batch.notes
    del batch
    gc.collect()
    return table, notes, whole
