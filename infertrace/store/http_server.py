"""OTLP/HTTP on uvicorn and Starlette: `POST /v1/traces`, protobuf or JSON, gzip / deflate / zstd; and Zipkin's
`POST /api/v2/spans` (v2 JSON, as Envoy, Istio's proxies and Zipkin's libraries send it; `zipkin_json`).

uvicorn serves each connection as an asyncio task, not a thread, so a slow client costs a socket and a few
kilobytes, never a worker. On top of its keep-alive (idle) timeout, a connection gets `header_timeout`
seconds from its first byte (or from accepting it) to send complete request headers, and the body must
arrive within `body_timeout`: a client that sends headers or a body byte by byte is cut off (slowloris).
The write path (`receiver.Receiver`) runs on worker threads once the body is in.

Answers (bodies are a `google.rpc.Status`, protobuf or JSON like the request, as OTLP/HTTP specifies):
200 (with `partialSuccess` when spans were rejected, or values converted or truncated); 400 for a body that
is not a trace export or a broken compressed stream; 401 without the bearer token; 404 for another path;
405 for another method; 408 when the body does not arrive in time; 413 over the size cap (checked on the
declared length, on the bytes received and while decompressing); 415 for another content type or encoding;
503 + Retry-After when the collector is busy, over its memory limit, or the disk refuses the write. Zipkin's
route answers as a Zipkin server does: 202 with no body when the spans are stored (a span that could not be
converted is in the store's quarantine, and in the log line), the same error statuses with the reason as text.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import h11
import pyarrow as pa
import uvicorn
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from infertrace.store.receiver import (
    BadExport,
    Outcome,
    Overloaded,
    Receiver,
    StorageUnavailable,
    log_outcome,
    now,
)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
ZIPKIN_PATH = "/api/v2/spans"
_GRPC_INVALID_ARGUMENT = 3
_GRPC_NOT_FOUND = 5
_GRPC_RESOURCE_EXHAUSTED = 8
_GRPC_UNIMPLEMENTED = 12
_GRPC_INTERNAL = 13
_GRPC_UNAVAILABLE = 14
_GRPC_UNAUTHENTICATED = 16
_GRPC_DEADLINE_EXCEEDED = 4
_READ_CHUNK = 1 << 20


class _Refusal(Exception):
    def __init__(self, status: int, message: str, grpc_code: int, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.grpc_code, self.retry_after = status, message, grpc_code, retry_after


def timed_protocol(header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for complete request headers, counted from the connection (or
    from the first byte of the next request on a kept-alive connection)."""

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and self.conn.their_state is h11.IDLE:
                self._arm()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol


def decompress(body: bytes, encoding: str, cap: int) -> bytes:
    """The body decoded per its Content-Encoding (gzip with every member, deflate, zstd), at most `cap`
    bytes: 413 beyond, 400 for a broken stream, 415 for another encoding."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip", "deflate"):
        out = bytearray()
        data = body
        while data:
            inflater = zlib.decompressobj(zlib.MAX_WBITS | (16 if encoding != "deflate" else 0))
            try:
                out += inflater.decompress(data, cap + 1 - len(out))
            except zlib.error as e:
                if encoding == "deflate" and not out:  # raw deflate, as some clients send it
                    return decompress_raw_deflate(body, cap)
                raise _Refusal(400, f"bad {encoding} body: {e}", _GRPC_INVALID_ARGUMENT) from None
            if len(out) > cap or inflater.unconsumed_tail:
                raise _Refusal(413, f"body is over the cap of {cap} bytes decompressed", _GRPC_RESOURCE_EXHAUSTED)
            if not inflater.eof:
                raise _Refusal(400, f"bad {encoding} body: truncated", _GRPC_INVALID_ARGUMENT)
            data = inflater.unused_data  # the next gzip member, if any
            if encoding == "deflate":
                break
        return bytes(out)
    if encoding == "zstd":
        try:
            stream = pa.input_stream(pa.py_buffer(body), compression="zstd")
            out = bytearray()
            while chunk := stream.read(_READ_CHUNK):
                out += chunk
                if len(out) > cap:
                    raise _Refusal(413, f"body is over the cap of {cap} bytes decompressed",
                                   _GRPC_RESOURCE_EXHAUSTED)
        except OSError as e:
            raise _Refusal(400, f"bad zstd body: {e}", _GRPC_INVALID_ARGUMENT) from None
        return bytes(out)
    raise _Refusal(415, f"Content-Encoding {encoding!r}: send gzip, deflate, zstd or none", _GRPC_UNIMPLEMENTED)


def decompress_raw_deflate(body: bytes, cap: int) -> bytes:
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, cap + 1)
    except zlib.error as e:
        raise _Refusal(400, f"bad deflate body: {e}", _GRPC_INVALID_ARGUMENT) from None
    if len(out) > cap or inflater.unconsumed_tail:
        raise _Refusal(413, f"body is over the cap of {cap} bytes decompressed", _GRPC_RESOURCE_EXHAUSTED)
    return out


class HttpServer:
    """The OTLP/HTTP receiver: a uvicorn server on its own thread and event loop."""

    def __init__(self, receiver: Receiver, host: str = "127.0.0.1", port: int = 4318,
                 tls: tuple[str, str] | None = None, header_timeout: float = 10.0, body_timeout: float = 30.0,
                 idle_timeout: int = 30) -> None:
        self.receiver = receiver
        self.body_timeout = body_timeout
        self.tls = tls is not None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((host, port))
        except OSError:
            self._socket.close()
            raise
        self._socket.listen(1024)
        self._socket.set_inheritable(True)
        self._workers = ThreadPoolExecutor(max_workers=receiver.limits.writers,
                                           thread_name_prefix="infertrace-write")
        app = Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"]),
                                Route(ZIPKIN_PATH, self._zipkin_spans, methods=["POST"])],
                        exception_handlers={404: self._not_found, 405: self._not_allowed})
        config = uvicorn.Config(app, http=timed_protocol(header_timeout), lifespan="off", access_log=False,
                                log_config=None, timeout_keep_alive=idle_timeout, server_header=False,
                                ssl_certfile=tls[0] if tls else None, ssl_keyfile=tls[1] if tls else None)
        if tls:
            config.load()  # builds the SSL context now: a bad certificate fails here, not in the thread
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._running = threading.Event()
        self._stopped = threading.Event()

    @property
    def address(self) -> str:
        host, port = self._socket.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}/v1/traces"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="infertrace-http", daemon=True)
        self._thread.start()

    def serve_forever(self) -> None:
        """Serves on the calling thread until `shutdown()`."""
        self._running.set()
        try:
            self.server.run(sockets=[self._socket])
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        self.server.should_exit = True
        if self._running.is_set():
            self._stopped.wait(15)
        self._workers.shutdown(wait=True)
        self._socket.close()

    # ------------------------------------------------------------------------------------------ routes
    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return _error(_Refusal(404, f"no such path {request.url.path}; OTLP traces go to POST /v1/traces, "
                                    f"Zipkin spans to POST {ZIPKIN_PATH}", _GRPC_NOT_FOUND), _wants_json(request))

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        response = _error(_Refusal(405, f"{request.method} is not allowed; POST OTLP traces to /v1/traces",
                                   _GRPC_UNIMPLEMENTED), _wants_json(request))
        response.headers["Allow"] = "POST"
        return response

    async def _traces(self, request: Request) -> Response:
        as_json = _wants_json(request)

        def store(body: bytes, content_type: str, peer: str) -> Outcome:
            if content_type == JSON:
                return self.receiver.store_json(body, peer)
            return self.receiver.store_protobuf(body, peer)

        return await self._receive(request, (PROTOBUF, JSON), store, 200, lambda outcome: _success(outcome, as_json),
                                   lambda e: _error(e, as_json))

    async def _zipkin_spans(self, request: Request) -> Response:
        """Zipkin's v2 API: a JSON list of spans; 202 and no body once stored, the reason as text otherwise."""

        def store(body: bytes, content_type: str, peer: str) -> Outcome:
            return self.receiver.store_zipkin(body, peer)

        return await self._receive(request, (JSON,), store, 202, lambda outcome: Response(status_code=202),
                                   _text_error)

    async def _receive(self, request: Request, content_types: tuple[str, ...],
                       store: Callable[[bytes, str, str], Outcome], status: int,
                       success: Callable[[Outcome], Response], error: Callable[[_Refusal], Response]) -> Response:
        """Checks, reads, decompresses and admits a request's body, then `store`s it on a writer thread."""
        start = now()
        peer = request.client.host if request.client else "?"
        size = 0
        try:
            if not self.receiver.authorized(request.headers.get("authorization")):
                raise _Refusal(401, "missing or wrong bearer token", _GRPC_UNAUTHENTICATED)
            content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if content_type not in content_types:
                raise _Refusal(415, f"Content-Type {content_type!r}: send {' or '.join(content_types)}",
                               _GRPC_UNIMPLEMENTED)
            raw = await self._read_body(request)
            size = len(raw)
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(None, decompress, raw, request.headers.get("content-encoding", ""),
                                              self.receiver.limits.max_body_bytes)
            del raw
            # Admitted here, before a writer is free: past the queue or the memory limit the answer is an
            # immediate 503; within them the request waits its turn for one of the writers.
            with self._admitted(len(body)):
                outcome = await loop.run_in_executor(self._workers, self._store, store, body, content_type,
                                                     f"http {peer}")
        except _Refusal as e:
            log_outcome("http", peer, e.status, now() - start, size, error=e.message)
            return error(e)
        except Exception as e:  # a bug: answer rather than drop the connection
            log_outcome("http", peer, 500, now() - start, size, error=f"internal error: {e!r}")
            return error(_Refusal(500, f"internal error: {e!r}", _GRPC_INTERNAL))
        log_outcome("http", peer, status, now() - start, size, outcome)
        return success(outcome)

    async def _read_body(self, request: Request) -> bytes:
        cap = self.receiver.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > cap:
            raise _Refusal(413, f"body of {declared} bytes is over the cap of {cap}", _GRPC_RESOURCE_EXHAUSTED)

        async def read() -> bytes:
            chunks = bytearray()
            async for chunk in request.stream():
                chunks += chunk
                if len(chunks) > cap:
                    raise _Refusal(413, f"body is over the cap of {cap} bytes", _GRPC_RESOURCE_EXHAUSTED)
            return bytes(chunks)

        try:
            return await asyncio.wait_for(read(), self.body_timeout)
        except TimeoutError:
            raise _Refusal(408, f"the body did not arrive within {self.body_timeout:g} s",
                           _GRPC_DEADLINE_EXCEEDED) from None
        except ClientDisconnect:
            raise _Refusal(400, "the client closed the connection before sending the whole body",
                           _GRPC_INVALID_ARGUMENT) from None

    @contextmanager
    def _admitted(self, body_bytes: int) -> Iterator[None]:
        try:
            with self.receiver.admit(body_bytes):
                yield
        except Overloaded as e:
            raise _Refusal(503, str(e), _GRPC_RESOURCE_EXHAUSTED, e.retry_after_s) from None

    @staticmethod
    def _store(store: Callable[[bytes, str, str], Outcome], body: bytes, content_type: str, peer: str) -> Outcome:
        try:
            return store(body, content_type, peer)
        except BadExport as e:
            raise _Refusal(400, str(e), _GRPC_INVALID_ARGUMENT) from None
        except StorageUnavailable as e:
            raise _Refusal(503, str(e), _GRPC_UNAVAILABLE, e.retry_after_s) from None


def _wants_json(request: Request) -> bool:
    return request.headers.get("content-type", "").split(";")[0].strip().lower() == JSON


def _success(outcome: Outcome, as_json: bool) -> Response:
    message = outcome.warning()
    if as_json:
        body: dict[str, Any] = {}
        if message:
            body["partialSuccess"] = {"rejectedSpans": str(outcome.rejected), "errorMessage": message}
        return Response(json.dumps(body).encode(), 200, media_type=JSON)
    response = ExportTraceServiceResponse()
    if message:
        response.partial_success.CopyFrom(ExportTracePartialSuccess(rejected_spans=outcome.rejected,
                                                                    error_message=message))
    return Response(response.SerializeToString(), 200, media_type=PROTOBUF)


def _error(e: _Refusal, as_json: bool) -> Response:
    headers = {"Connection": "close"} if e.status in (400, 408, 411, 413, 415) else {}
    if e.retry_after is not None:
        headers["Retry-After"] = str(e.retry_after)
    if e.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if as_json:
        return Response(json.dumps({"code": e.grpc_code, "message": e.message}).encode(), e.status,
                        headers=headers, media_type=JSON)
    return Response(Status(code=e.grpc_code, message=e.message).SerializeToString(), e.status, headers=headers,
                    media_type=PROTOBUF)


def _text_error(e: _Refusal) -> Response:
    """An error as a Zipkin server answers it: the status, the reason as text."""
    headers = {"Connection": "close"} if e.status in (400, 408, 411, 413, 415) else {}
    if e.retry_after is not None:
        headers["Retry-After"] = str(e.retry_after)
    return Response(e.message.encode(), e.status, headers=headers, media_type="text/plain")


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """Checks that a certificate and key load (a clear error before the server starts)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context

