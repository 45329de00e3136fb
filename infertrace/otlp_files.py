"""OTLP files on disk: JSON lines, plain, gzip or zstd; written by the name's suffix, read by the first bytes. Read
too: the OpenTelemetry Collector's file exporter's length-prefixed files (`format: proto`, or `compression: zstd`
without its native-compression feature gate), each message a big-endian uint32 length and an OTLP JSON or
`TracesData` protobuf message, zstd-compressed or not: they are read as the JSON lines they hold, one per message.
And JSON that is not one value per line (pretty-printed, an array: what query UIs download and `jq .` prints), one
line per top-level value (`JsonDocuments`), and a file that is one protobuf message with no length before it (a
saved OTLP/HTTP request body: `OneMessage`).

zstd is written at level 1 with a checksum per frame: on OTLP JSON it is as small as level 3 and faster (the
engine hour's 136 MB of spans: 9.8 MB, about 0.2 CPU s), and writing a tenth of the bytes spares the kernel most
of the cost of new page-cache pages, which some virtual machines make dear (BENCHMARKS.md, "Reference engine").
gzip is written with no name and mtime 0 in its header, so that a fixed seed gives the same bytes.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import zstandard

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SUFFIXES = tuple(f"{name}{packed}" for name in (".jsonl", ".json", ".ndjson") for packed in ("", ".gz", ".zst"))
ZSTD_LEVEL = 1
MAX_DOCUMENT_BYTES = 256 << 20  # of text in one pretty-printed JSON value, decoded whole
MAX_MESSAGE_BYTES = 1 << 30  # a length-prefixed message's limit: a larger length is damage (or not such a file)
_DOCUMENT_PEEK = 4096  # bytes looked at to tell a JSON document from JSON lines
_DOCUMENT_READ = 4 << 20  # bytes of a JSON document read at a time
_BOM = b"\xef\xbb\xbf"
_VALUE_START = re.compile(r"(?<=\n)[\[{]")  # a line that starts a value, in its first column
_SPACE = re.compile(r"[ \t\r\n]*")  # JSON's whitespace
_ZSTD_READ = 64 << 10  # compressed bytes decoded at a time (a corrupt one loses what its read decoded)


@contextmanager
def lines_out(path: Path) -> Iterator[IO[str]]:
    """A new text file at `path`: gzip when its name ends in .gz, zstd in .zst, else plain UTF-8; written as the
    reference engine writes its traces (reference_engine/telemetry/otlp.py: the engine knows the toolkit only by
    its semantic conventions, so it has its own copy of these few lines)."""
    if path.suffix == ".gz":
        with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6,
                                                    mtime=0) as packed, io.TextIOWrapper(packed, "utf-8") as text:
            yield text
    elif path.suffix == ".zst":
        packer = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
        with io.TextIOWrapper(packer.stream_writer(open(path, "wb")), "utf-8") as text:  # closes the file
            yield text
    else:
        with open(path, "w", encoding="utf-8") as text:
            yield text


def bytes_in(path: Path) -> tuple[IO[bytes], IO[bytes]]:
    """(the file, a stream of the JSON lines it holds): gzip and zstd told by their magic bytes whatever the name,
    and length-prefixed messages by their first length; the file's position measures progress. The caller closes
    both. A truncated compressed file raises OSError (or EOFError for gzip) after every byte before the cut; a
    corrupt one raises OSError (zlib.error for gzip) where the decoder finds the damage, and what it decoded of the
    same read (up to 64 KB of zstd) is lost with it; a length-prefixed file, at the first message it cannot read."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    stream = _decompressed(raw)
    try:
        head = stream.peek(8)[:8]  # type: ignore[attr-defined]
    except (OSError, EOFError, zlib.error):
        return raw, stream  # damaged from the start: the reader says so
    if _length_prefixed(head):
        return raw, LengthPrefixed(stream)  # type: ignore[return-value]
    if _one_message(stream.peek(16)[:16]):  # type: ignore[attr-defined]
        return raw, OneMessage(stream)  # type: ignore[return-value]
    if _document(stream.peek(_DOCUMENT_PEEK)):  # type: ignore[attr-defined]
        return raw, JsonDocuments(stream)  # type: ignore[return-value]
    return raw, stream


@contextmanager
def text_in(path: Path) -> Iterator[IO[str]]:
    """A text file read as UTF-8 (undecodable bytes replaced), gzip and zstd told by their magic bytes whatever
    the name: what other JSON lines and logs than OTLP's (client token times, iteration logs) are read through."""
    with open(path, "rb") as raw, io.TextIOWrapper(_decompressed(raw), encoding="utf-8", errors="replace") as text:
        yield text


def _decompressed(raw: IO[bytes]) -> IO[bytes]:
    """`raw`'s bytes, decompressed when they start as gzip's or zstd's do: a stream with `peek`, and with no
    buffer of its own in front of the zstd decoder (a BufferedReader drops the bytes it holds when the stream under
    it raises in the same read, so a truncated file would lose its last good bytes)."""
    magic = raw.read(len(ZSTD_MAGIC))
    raw.seek(0)
    if magic.startswith(GZIP_MAGIC):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if magic == ZSTD_MAGIC:
        return ZstdFrames(raw)  # type: ignore[return-value]
    return raw


def _length_prefixed(head: bytes) -> bool:
    """Whether a file's first bytes are a message length under 64 MiB (its first byte 0–3: never the start of a
    JSON text, which is printable or whitespace) and the start of an OTLP message: JSON, a zstd frame, or a
    `TracesData` protobuf (field 1, `resource_spans`, length-delimited: 0x0a)."""
    return (len(head) >= 5 and head[0] < 4 and int.from_bytes(head[:4], "big") > 0
            and (head[4:5] in (b"{", b"\x0a") or head[4:8] == ZSTD_MAGIC))


def _one_message(head: bytes) -> bool:
    """Whether a file's first bytes are those of a `TracesData` protobuf message: its field 1 (`resource_spans`,
    length-delimited: 0x0a, a varint length) and inside it a `ResourceSpans` field (1 `resource`, 2
    `scope_spans`, 3 `schema_url`). JSON lines that start with blank lines also start with 0x0a, then more
    whitespace and `{` (taken for JSON, so is a message whose first `ResourceSpans` is 123 bytes long, then read
    as lines and quarantined: a message of one tiny span)."""
    if len(head) < 3 or head[0] != 0x0A or head.lstrip()[:1] in (b"{", b"[", b""):
        return False
    at = 1
    while at < len(head) and head[at] & 0x80:  # the varint's continuation bytes
        at += 1
    return at + 1 < len(head) and head[at + 1] in (0x0A, 0x12, 0x1A)


def _document(head: bytes) -> bool:
    """Whether a file's first bytes are those of JSON that is not one value per line: a byte-order mark, or a first
    line that starts a value without ending it (pretty-printed: `{` or `[` alone on the first line, as jq,
    `json.dumps(indent=…)`, protobuf's `MessageToJson` and the query UIs' downloads write it). A first line that is
    a whole value (an array on one line too), that is not JSON at all, or that is longer than what was peeked is
    taken for a JSON line."""
    if head.startswith(_BOM):
        return True
    text = head.lstrip()
    newline = text.find(b"\n")
    if not text.startswith((b"{", b"[")) or newline < 0:
        return False
    try:
        line = text[:newline].decode("utf-8")
        json.loads(line)
    except UnicodeDecodeError:
        return False
    except json.JSONDecodeError as e:
        return _cut_short(line, e)
    return False


def _cut_short(text: str, error: json.JSONDecodeError) -> bool:
    """Whether `text` failed to decode only because it ends too soon (more of the value may follow), not because
    of a character that no continuation makes JSON: the error is at its end, or a string opened and not closed
    before it (a raw newline in a string is an error of its own)."""
    if _SPACE.match(text, error.pos).end() == len(text):  # type: ignore[union-attr]
        return True
    return error.msg.startswith("Unterminated string") and "\n" not in text[error.pos:]


class _LineStream(io.RawIOBase):
    """A stream of the lines `_next` makes one at a time (None at the end)."""

    _pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            line = self._next()
            if line is None:
                return 0
            self._pending = memoryview(line)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def _next(self) -> bytes | None:
        raise NotImplementedError


class JsonDocuments(_LineStream):
    """JSON lines of a file of JSON values that are not one per line (`_document`): each top-level value (a
    pretty-printed object, or an array) re-encoded compactly as one line, preceded by blank lines so that it is
    read as the line of the file it starts on (so rejections name the right line, and as many lines are read as
    the file has). Values follow one another with any whitespace between them, as `jq .` writes a stream. A value
    is decoded whole (at most MAX_DOCUMENT_BYTES of text): what cannot be decoded raises OSError naming its line,
    after the values before it."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self._decoder = json.JSONDecoder()
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text = ""
        self._at = 0  # in `_text`: where the next value is looked for
        self._line = 1  # the line of the file at `_at`
        self._emitted = 1  # the line of the output the next value will be on
        self._eof = False
        self._first = True
        self._last = ""  # the last character read

    def _next(self) -> bytes | None:
        while True:
            start = self._skip_space()
            if start == len(self._text):
                if self._eof:  # blank lines to the file's end, so that as many lines are read as it has
                    tail = self._line - self._emitted + (self._last not in ("", "\n"))  # a last line with no newline
                    self._emitted += max(tail, 0)
                    return b"\n" * tail if tail > 0 else None
                self._more()
                continue
            try:
                value, end = self._decoder.raw_decode(self._text, start)
            except json.JSONDecodeError as e:
                if _cut_short(self._text, e) and not self._eof:
                    if len(self._text) - start > MAX_DOCUMENT_BYTES:
                        raise OSError(f"line {self._line}: a JSON value over {MAX_DOCUMENT_BYTES >> 20} MiB (write "
                                      "it as JSON lines: jq -c)") from None
                    self._more()
                    continue
                return self._broken(start)
            return self._emit(start, end, json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())

    def _broken(self, start: int) -> bytes:
        """A value that is not JSON: its first line as it is (the ingest rejects it, naming that line), and the
        lines after it up to the next that starts a value (`{` or `[` in its first column) as blank lines, so that
        the values after it are read."""
        while (found := _VALUE_START.search(self._text, start + 1)) is None and not self._eof:
            if len(self._text) - start > MAX_DOCUMENT_BYTES:
                break
            self._more()  # moves the text: the value now starts at 0
            start = self._at
        end = found.start() if found else len(self._text)
        return self._emit(start, end, self._text[start:end].split("\n", 1)[0].encode("utf-8", "surrogatepass"))

    def _emit(self, start: int, end: int, line: bytes) -> bytes:
        """`line` for the text from `start` to `end`, after blank lines up to the line of the file it starts on;
        the text is consumed (dropped once past half of what is held: it stays under twice a value)."""
        pad = self._line - self._emitted
        self._line += self._text.count("\n", start, end)
        self._emitted += pad + 1
        self._at = end
        if end > len(self._text) // 2:
            self._text, self._at = self._text[end:], 0
        return b"\n" * pad + line + b"\n"

    def _skip_space(self) -> int:
        """Moves past whitespace (counting its lines); the position of the next value, or the end of the text."""
        at = _SPACE.match(self._text, self._at).end()  # type: ignore[union-attr]
        self._line += self._text.count("\n", self._at, at)
        self._at = at
        return at

    def _more(self) -> None:
        """Reads and decodes more of the file: as much again as is held (a long value takes few reads)."""
        wanted = max(_DOCUMENT_READ, len(self._text) - self._at)
        data = self.stream.read(wanted)
        try:
            text = self._utf8.decode(data, final=not data)
        except UnicodeDecodeError as e:
            raise OSError(f"after line {self._line}: not UTF-8 ({e.reason})") from None
        if self._first:
            text, self._first = text.removeprefix("\ufeff"), False
        self._eof = not data
        self._last = text[-1:] or self._last
        self._text = self._text[self._at:] + text
        self._at = 0


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a stream of zstd frames (one or several, as `cat a.zst b.zst` makes).

    zstandard's own `stream_reader` ends quietly where a file is cut mid-frame; this raises OSError there instead,
    after every byte decoded before the cut, so that a truncated file is said to be one. A frame's checksum is
    checked at its end."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._started = False  # bytes of the current frame were read
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def peek(self, size: int = 1) -> bytes:
        """The next bytes, without consuming them (at most `size`; fewer at the end)."""
        self._fill()
        return bytes(self._pending[:size])

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """What is decoded and not read yet, or else the next read's worth: never bytes decoded before an error
        raised in the same call."""
        if not self._fill():
            return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def _fill(self) -> bool:
        """Decodes until something is pending; False at the end of the stream."""
        while not self._pending:
            packed = self.raw.read(_ZSTD_READ)
            if not packed:
                if self._started:
                    raise OSError("zstd stream ends inside a frame: the file is truncated")
                return False
            self._pending = memoryview(self._decode(packed))
        return True

    def _decode(self, packed: bytes) -> bytes:
        out = []
        while packed:
            self._started = True
            try:
                out.append(self._frame.decompress(packed))
            except zstandard.ZstdError as e:
                raise OSError(f"corrupt zstd data: {e}") from None
            if not self._frame.eof:
                break
            packed, self._started = self._frame.unused_data, False  # the next frame, if any
            self._frame = zstandard.ZstdDecompressor().decompressobj()
        return b"".join(out)


class LengthPrefixed(_LineStream):
    """The OTLP JSON lines of a file of length-prefixed messages (the Collector's file exporter, above): each
    message decompressed when it is a zstd frame, and a protobuf one converted by the official parser, one line
    each. A message that cannot be read (cut short, an absurd length, neither JSON nor a protobuf `TracesData`)
    raises OSError naming it; the lines of the messages before it are kept."""

    def __init__(self, stream: IO[bytes]) -> None:
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

        from infertrace.store import protobuf_spans  # here: the engine's writer needs none of these

        self._parse, self._chunks, self._bad = TracesData.FromString, protobuf_spans.resource_spans, DecodeError
        self.stream = stream
        self.messages = 0  # read so far

    def _next(self) -> bytes | None:
        head = self._exactly(4)
        if not head:
            return None
        number = self.messages + 1
        size = int.from_bytes(head, "big")
        if len(head) < 4 or size > MAX_MESSAGE_BYTES:
            raise OSError(f"message {number}: " + ("the file ends inside its length" if len(head) < 4 else
                                                   f"a length of {size} bytes: damaged, or not length-prefixed"))
        body = self._exactly(size)
        if len(body) < size:
            raise OSError(f"message {number}: {len(body)} of its {size} bytes, then the file ends (truncated)")
        if body.startswith(ZSTD_MAGIC):
            try:
                with ZstdFrames(io.BytesIO(body)) as frames:
                    body = frames.readall()
            except OSError as e:
                raise OSError(f"message {number}: {e}") from None
        self.messages = number
        return self._line(body, f"message {number}")

    def _line(self, body: bytes, what: str) -> bytes:
        """One message (OTLP JSON or a `TracesData` protobuf) as a JSON line."""
        if body.lstrip().startswith(b"{"):  # pretty-printed on one line: JSON text has no raw newline in a string
            return body.strip().replace(b"\n", b" ") + b"\n"
        try:
            message = self._parse(body)
        except self._bad as e:
            raise OSError(f"{what}: neither OTLP JSON nor a TracesData protobuf ({e})") from None
        chunks = [chunk for rs in message.resource_spans for chunk in self._chunks(rs)]
        return json.dumps({"resourceSpans": chunks}, separators=(",", ":")).encode() + b"\n"

    def _exactly(self, size: int) -> bytes:
        parts, wanted = [], size
        while wanted:
            part = self.stream.read(wanted)
            if not part:
                break
            parts.append(part)
            wanted -= len(part)
        return b"".join(parts)


class OneMessage(LengthPrefixed):
    """A file that is one `TracesData` (or `ExportTraceServiceRequest`: the same bytes) protobuf message, with no
    length before it: an OTLP/HTTP request body saved as it was sent, a `.binpb` file. Read whole (at most
    MAX_MESSAGE_BYTES) as one JSON line."""

    def _next(self) -> bytes | None:
        if self.messages:
            return None
        body = self._exactly(MAX_MESSAGE_BYTES + 1)
        if len(body) > MAX_MESSAGE_BYTES:
            raise OSError(f"a protobuf message over {MAX_MESSAGE_BYTES >> 20} MiB: not one OTLP message")
        self.messages = 1
        return self._line(body, "the file")
