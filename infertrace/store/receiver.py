"""The collector's write path, the same for every transport (OTLP/HTTP in `http_server`, OTLP/gRPC in
`grpc_server`): admission, decoding, durable storage, and one log line per request.

A request goes through, in order:

1. authorization (a bearer token compared in constant time), done by the transport;
2. its body read in full, under the body size cap and the read timeouts (transport);
3. `admit()`: a place in the queue (at most `queue_size` requests wait for a writer or are being written)
   and a share of the memory budget (an estimate of what decoding the body takes, like the Collector's
   memory_limiter). Neither is held while a body is still arriving, so slow clients cannot starve the
   others. Without a place or memory the answer is `Overloaded`: retryable, with a delay (HTTP 503 +
   Retry-After, gRPC RESOURCE_EXHAUSTED + RetryInfo). An admitted request waits for one of `writers`
   writers: a burst of concurrent exporters queues for a moment instead of being refused;
4. `store()`: decode, quarantine bad spans, write segments (fsync + rename) and only then answer. A bad
   body is `BadExport` (HTTP 400, gRPC INVALID_ARGUMENT), never a 500; a disk that refuses the write
   (full, read-only) is `StorageUnavailable`, retryable (HTTP 503 + Retry-After, gRPC UNAVAILABLE +
   RetryInfo), and leaves no temporary file behind.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from infertrace.store import protobuf_spans, zipkin_json
from infertrace.store.batch import BadRecord, SpanBatch
from infertrace.store.segments import keep_resource, remove_stale_temporaries, write_quarantine, write_segments
from infertrace.store.values import describe

log = logging.getLogger("infertrace.collect")

RETRY_AFTER_S: Final = 1
DECODE_EXPANSION: Final = 14  # peak memory to decode and store a body ≈ this × its size (measured: 13.4×)


class BadExport(Exception):
    """The body is not a trace export: a permanent error (HTTP 400, gRPC INVALID_ARGUMENT)."""


class Overloaded(Exception):
    """No write slot or memory for this request now: retry after `retry_after_s`."""

    retry_after_s = RETRY_AFTER_S


class StorageUnavailable(Exception):
    """The disk refused the write (full, read-only, I/O error): retry after `retry_after_s`; nothing was
    left half-written."""

    retry_after_s = RETRY_AFTER_S


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 32 * 1024 * 1024  # after decompression
    queue_size: int = 64  # requests admitted: waiting for a writer or being written
    memory_limit_bytes: int = 1024 * 1024 * 1024  # estimated decoding memory of the admitted requests
    writers: int = 4  # requests decoded and written at once

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "queue_size", "memory_limit_bytes", "writers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")


@dataclass
class Outcome:
    """What became of one export request's spans."""

    stored: int = 0
    rejected: int = 0
    reason: str = ""  # the first rejection's reason
    notes: dict[str, dict[str, int]] = field(default_factory=dict)
    left_out: int = 0  # spans whose resource did not match the receiver's `resource`: not an error, so not reported
    # to the client, only logged

    def warning(self) -> str:
        """The OTLP partial-success message: rejected spans, and values converted or truncated."""
        parts = []
        if self.rejected:
            parts.append(f"{self.rejected} spans rejected and quarantined: {self.reason}")
        if self.notes:
            parts.append("stored, but " + describe(self.notes))
        return "; ".join(parts)


class Receiver:
    """Admission and storage of export requests into a store directory; thread-safe."""

    def __init__(self, root: str | Path, limits: Limits | None = None, token: str | None = None,
                 resource: tuple[tuple[str, str], ...] = ()) -> None:
        """`resource`: (key, value) pairs a span's resource must have to be stored (`keep_resource`)."""
        self.root = Path(root)
        self.resource = resource
        self.root.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.root)
        self.limits = limits or Limits()
        self.token = token
        self.spans_stored = 0
        self._lock = threading.Lock()
        self._in_flight = 0
        self._reserved = 0
        self._writers = threading.BoundedSemaphore(self.limits.writers)

    # ------------------------------------------------------------------------------- authorization
    def authorized(self, header: str | None) -> bool:
        """Whether an `Authorization` header value carries the token (always, without one)."""
        if self.token is None:
            return True
        return hmac.compare_digest((header or "").encode(), f"Bearer {self.token}".encode())

    # -------------------------------------------------------------------------------------- admission
    @contextmanager
    def admit(self, body_bytes: int) -> Iterator[None]:
        """Holds a place in the queue and the memory estimate of decoding `body_bytes` while the block runs.
        Raises Overloaded when either is not available now; never waits."""
        need = body_bytes * DECODE_EXPANSION
        with self._lock:
            if self._in_flight >= self.limits.queue_size:
                raise Overloaded(f"{self._in_flight} requests are already queued or being written (--queue-size); "
                                 f"retry in {RETRY_AFTER_S} s")
            if self._reserved and self._reserved + need > self.limits.memory_limit_bytes:
                raise Overloaded(f"over the memory limit of {self.limits.memory_limit_bytes >> 20} MiB "
                                 f"(--memory-limit-mib) with the requests in flight; retry in {RETRY_AFTER_S} s")
            self._in_flight += 1
            self._reserved += need
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._reserved -= need

    # ------------------------------------------------------------------------------------ decoding
    def store_protobuf(self, body: bytes, peer: str) -> Outcome:
        """Stores a serialized `ExportTraceServiceRequest`."""
        with self._writers:
            return self._store_protobuf(body, peer)

    def _store_protobuf(self, body: bytes, peer: str) -> Outcome:
        try:
            request = ExportTraceServiceRequest.FromString(body)
        except (DecodeError, RecursionError) as e:
            raise BadExport(f"body is not an ExportTraceServiceRequest: {e}") from None
        return self._store_message(request, peer)

    def store_message(self, request: ExportTraceServiceRequest, peer: str) -> Outcome:
        """Stores a parsed `ExportTraceServiceRequest` (what gRPC hands over)."""
        with self._writers:
            return self._store_message(request, peer)

    def _store_message(self, request: ExportTraceServiceRequest, peer: str) -> Outcome:
        batch = SpanBatch()
        try:
            for resource_spans in request.resource_spans:
                for chunk in protobuf_spans.resource_spans(resource_spans):
                    batch.add_traces_data({"resourceSpans": [chunk]}, peer, 0)
        except BadRecord as e:
            raise BadExport(f"not a trace export: {e}") from None
        return self._write(batch)

    def store_json(self, body: bytes, peer: str) -> Outcome:
        """Stores an OTLP/JSON `ExportTraceServiceRequest`."""
        with self._writers:
            return self._store_json(body, peer)

    def _store_json(self, body: bytes, peer: str) -> Outcome:
        data = _json_body(body)
        if not isinstance(data, dict):
            raise BadExport("body is not a JSON object")
        batch = SpanBatch()
        if data.get("resourceSpans", data.get("resource_spans")) is not None:  # an empty export is fine
            try:
                batch.add_traces_data(data, peer, 0)
            except BadRecord as e:
                raise BadExport(f"not a trace export: {e}") from None
        return self._write(batch)

    def store_zipkin(self, body: bytes, peer: str) -> Outcome:
        """Stores Zipkin v2 JSON spans (a list), as `POST /api/v2/spans` sends them (`zipkin_json`)."""
        with self._writers:
            return self._store_zipkin(body, peer)

    def _store_zipkin(self, body: bytes, peer: str) -> Outcome:
        data = _json_body(body)
        if not isinstance(data, list):
            raise BadExport("body is not a JSON list of Zipkin spans")
        batch = SpanBatch()
        if data:  # an empty list is fine
            if not zipkin_json.is_spans(data):
                raise BadExport("not Zipkin v2 spans (a list of objects with traceId and id)")
            batch.add_traces_data({"resourceSpans": zipkin_json.resource_spans(data)}, peer, 0)
        return self._write(batch)

    def _write(self, batch: SpanBatch) -> Outcome:
        notes, stored, left_out = batch.notes, batch.num_spans, 0
        try:
            if batch.num_spans:
                table = batch.table()
                if self.resource:
                    table, notes, left_out = keep_resource(table, notes, self.resource)
                    stored = table.num_rows
                if stored:
                    write_segments(self.root, table, notes)
            write_quarantine(self.root, batch.rejections)
        except OSError as e:  # the disk, not the data: the client keeps the spans and retries
            raise StorageUnavailable(f"cannot write to the store: {e.strerror or e}") from None
        with self._lock:
            self.spans_stored += stored
        return Outcome(stored, len(batch.rejections), batch.rejections[0].reason if batch.rejections else "",
                       notes.counts(), left_out)


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:
        raise BadExport(f"body is not JSON: {e}") from None


# ----------------------------------------------------------------------------------------- logging
def log_outcome(transport: str, peer: str, status: int | str, seconds: float, body_bytes: int,
                outcome: Outcome | None = None, error: str = "", level: int | None = None) -> None:
    """One line per request: info when every span was stored, warning for a partial success or a refusal
    the client must fix (4xx), error for a failure (5xx)."""
    if level is None:
        code = int(status) if str(status).isdigit() else 0
        level = logging.ERROR if code >= 500 else logging.WARNING if code >= 400 else logging.INFO
    if outcome is not None and (outcome.rejected or outcome.notes) and level == logging.INFO:
        level = logging.WARNING
    text = f"{transport} {peer} {status} {body_bytes} bytes {seconds * 1000:.1f} ms"
    if outcome is not None:
        text += f" stored {outcome.stored} spans"
        if outcome.left_out:
            text += f", left out {outcome.left_out} of other resources"
        if outcome.rejected or outcome.notes:
            text += f"; {outcome.warning()}"
    if error:
        text += f": {error}"
    log.log(level, "%s", text)


def now() -> float:
    return time.perf_counter()


def _grpc_peer(peer: str) -> str:
    """`ipv4:127.0.0.1:5555` → `127.0.0.1`."""
    parts = peer.split(":")
    return parts[1] if len(parts) >= 3 and parts[0] in ("ipv4", "ipv6") else peer


def peer_name(peer: Any) -> str:
    return _grpc_peer(str(peer)) if isinstance(peer, str) else str(peer)
