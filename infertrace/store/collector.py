"""An OTLP/HTTP trace receiver that writes into a store: what `infertrace collect` runs.

`POST /v1/traces` with a protobuf (`application/x-protobuf`) or JSON (`application/json`) body, optionally
gzip-compressed. Each request's spans become their own segments (see `segments`): the answer is 200 only
after they are fsynced and renamed into place, and a client that retries a request whose answer it never
got (the collector died in between) writes the same content key again, which adds nothing.

Answers: 200 (with `partialSuccess` when some spans were rejected and quarantined), 400 with a reason when
the body is not a trace export, 401 without the bearer token when one is required, 411 without a
Content-Length, 413 over the size cap (checked on the body and again while decompressing), 415 for another
content type, 503 with Retry-After when `queue_size` requests are already being handled.
"""

from __future__ import annotations

import hmac
import json
import threading
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from infertrace.otlp_json import message_to_otlp_dict
from infertrace.store.batch import BadRecord, SpanBatch
from infertrace.store.segments import remove_stale_temporaries, write_quarantine, write_segments

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
RETRY_AFTER_S = 1
_GRPC_INVALID_ARGUMENT = 3
_GRPC_UNAVAILABLE = 14
_GRPC_UNAUTHENTICATED = 16


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:4318")
    return host.strip("[]") or "127.0.0.1", int(port)


class _Reject(Exception):
    def __init__(self, status: HTTPStatus, message: str, grpc_code: int = _GRPC_INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.status, self.message, self.grpc_code = status, message, grpc_code


class Collector:
    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 4318, token: str | None = None,
                 max_body_bytes: int = 32 * 1024 * 1024, queue_size: int = 16) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.root)
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.slots = threading.BoundedSemaphore(queue_size) if queue_size > 0 else None
        self.spans_stored = 0
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer((host, port), _handler_class(self))
        self.server.daemon_threads = True

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def serve_forever(self) -> None:
        self.server.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def store(self, data: dict[str, Any], peer: str) -> tuple[int, int, str]:
        """Stores the spans of one export request. Returns (spans stored, spans rejected, first reason)."""
        batch = SpanBatch()
        try:
            batch.add_traces_data(data, f"http {peer}", 0)
        except BadRecord as e:
            raise _Reject(HTTPStatus.BAD_REQUEST, f"not a trace export: {e}") from None
        if batch.num_spans:
            write_segments(self.root, batch.table())
        write_quarantine(self.root, batch.rejections)
        with self._lock:
            self.spans_stored += batch.num_spans
        reason = batch.rejections[0].reason if batch.rejections else ""
        return batch.num_spans, len(batch.rejections), reason


def _handler_class(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.collector = collector
    return Handler


class _Handler(BaseHTTPRequestHandler):
    collector: Collector
    protocol_version = "HTTP/1.1"
    server_version = "infertrace-collect"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._reply(HTTPStatus.METHOD_NOT_ALLOWED if self.path == "/v1/traces" else HTTPStatus.NOT_FOUND,
                    b"POST OTLP traces to /v1/traces\n", "text/plain", close=False)

    def do_POST(self) -> None:
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        as_json = content_type == JSON
        slot = None
        try:
            if self.path.split("?")[0] != "/v1/traces":
                raise _Reject(HTTPStatus.NOT_FOUND, f"no such path {self.path}; traces go to /v1/traces")
            self._authorize()
            length = self._content_length()
            slot = self.collector.slots
            if slot is not None and not slot.acquire(blocking=False):
                slot = None
                raise _Reject(HTTPStatus.SERVICE_UNAVAILABLE, "the collector is busy; retry later",
                              _GRPC_UNAVAILABLE)
            body = self._decompress(self.rfile.read(length))
            if content_type not in (PROTOBUF, JSON):
                raise _Reject(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                              f"Content-Type {content_type!r}: send {PROTOBUF} or {JSON}")
            data = self._decode(body, as_json)
            _stored, rejected, reason = self.collector.store(data, self.client_address[0])
        except _Reject as e:
            self._reply_error(e, as_json)
            return
        except Exception as e:  # a bug or a full disk: answer rather than drop the connection
            self._reply_error(_Reject(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {e!r}", 13), as_json)
            return
        finally:
            if slot is not None:
                slot.release()
        self._reply_success(rejected, reason, as_json)

    # --------------------------------------------------------------------------------------- steps
    def _authorize(self) -> None:
        token = self.collector.token
        if token is None:
            return
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise _Reject(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token", _GRPC_UNAUTHENTICATED)

    def _content_length(self) -> int:
        raw = self.headers.get("Content-Length")
        if raw is None or not raw.strip().isdigit():
            raise _Reject(HTTPStatus.LENGTH_REQUIRED, "a Content-Length is required")
        length = int(raw)
        if length > self.collector.max_body_bytes:
            raise _Reject(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                          f"body of {length} bytes is over the cap of {self.collector.max_body_bytes}")
        return length

    def _decompress(self, body: bytes) -> bytes:
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            return body
        if encoding != "gzip":
            raise _Reject(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Encoding {encoding!r}: send gzip or none")
        cap = self.collector.max_body_bytes
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(body, cap + 1)
        except zlib.error as e:
            raise _Reject(HTTPStatus.BAD_REQUEST, f"bad gzip body: {e}") from None
        if len(out) > cap or inflater.unconsumed_tail:
            raise _Reject(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body is over the cap of {cap} bytes decompressed")
        if not inflater.eof:
            raise _Reject(HTTPStatus.BAD_REQUEST, "bad gzip body: truncated")
        return out

    def _decode(self, body: bytes, as_json: bool) -> dict[str, Any]:
        if as_json:
            try:
                data = json.loads(body)
            except (ValueError, RecursionError) as e:
                raise _Reject(HTTPStatus.BAD_REQUEST, f"body is not JSON: {e}") from None
            if not isinstance(data, dict):
                raise _Reject(HTTPStatus.BAD_REQUEST, "body is not a JSON object")
            return data
        try:
            request = ExportTraceServiceRequest.FromString(body)
        except (DecodeError, RecursionError) as e:
            raise _Reject(HTTPStatus.BAD_REQUEST, f"body is not an ExportTraceServiceRequest: {e}") from None
        try:
            return message_to_otlp_dict(request)
        except ValueError as e:
            raise _Reject(HTTPStatus.BAD_REQUEST, str(e)) from None

    # ------------------------------------------------------------------------------------- replies
    def _reply_success(self, rejected: int, reason: str, as_json: bool) -> None:
        response = ExportTraceServiceResponse()
        if rejected:
            response.partial_success.CopyFrom(ExportTracePartialSuccess(
                rejected_spans=rejected, error_message=f"{rejected} spans rejected and quarantined: {reason}"))
        if as_json:
            body = b"{}" if not rejected else json.dumps({"partialSuccess": {
                "rejectedSpans": str(rejected), "errorMessage": response.partial_success.error_message}}).encode()
            self._reply(HTTPStatus.OK, body, JSON, close=False)
        else:
            self._reply(HTTPStatus.OK, response.SerializeToString(), PROTOBUF, close=False)

    def _reply_error(self, e: _Reject, as_json: bool) -> None:
        headers = {}
        if e.status == HTTPStatus.SERVICE_UNAVAILABLE:
            headers["Retry-After"] = str(RETRY_AFTER_S)
        if e.status == HTTPStatus.UNAUTHORIZED:
            headers["WWW-Authenticate"] = "Bearer"
        if as_json:
            body = json.dumps({"code": e.grpc_code, "message": e.message}).encode()
            content_type = JSON
        else:
            body = Status(code=e.grpc_code, message=e.message).SerializeToString()
            content_type = PROTOBUF
        # The body may not have been read: close the connection rather than parse it as the next request.
        self._reply(e.status, body, content_type, close=True, headers=headers)

    def _reply(self, status: HTTPStatus, body: bytes, content_type: str, close: bool,
               headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
