"""OTLP/gRPC: opentelemetry-proto's `TraceService/Export` on grpcio, on the same write path as OTLP/HTTP.

grpcio reads and decompresses each message (gzip, deflate) and refuses one over `max_receive_message_length`
(the body cap) with RESOURCE_EXHAUSTED and no RetryInfo, which exporters treat as permanent. Then, like
OTLP/HTTP: `authorization: Bearer <token>` metadata or UNAUTHENTICATED; the write path's answers map to
OK (with `partial_success` when spans were rejected or values converted or truncated), INVALID_ARGUMENT,
RESOURCE_EXHAUSTED + RetryInfo when busy or over the memory limit, UNAVAILABLE + RetryInfo when the disk
refuses the write. Retryable codes carry `google.rpc.RetryInfo` in the `grpc-status-details-bin`
trailer, which the OpenTelemetry exporters read for their delay.
"""

from __future__ import annotations

import logging
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from infertrace.store.receiver import (
    BadExport,
    Overloaded,
    Receiver,
    StorageUnavailable,
    log_outcome,
    now,
    peer_name,
)


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str,
           retry_after_s: float | None = None) -> None:
    """Ends the call with `code`; a retryable one carries RetryInfo (google.rpc.Status details)."""
    if retry_after_s is not None:
        detail = AnyMessage()
        detail.Pack(RetryInfo(retry_delay=Duration(seconds=int(retry_after_s))))
        status = Status(code=code.value[0], message=message, details=[detail])
        context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),
                                       ("google.rpc.retryinfo-bin", RetryInfo(
                                           retry_delay=Duration(seconds=int(retry_after_s))).SerializeToString())))
    context.abort(code, message)


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(self, request: ExportTraceServiceRequest, context: grpc.ServicerContext
               ) -> ExportTraceServiceResponse:
        start = now()
        peer = peer_name(context.peer())
        size = request.ByteSize()
        refusal: tuple[grpc.StatusCode, str, float | None, int] | None = None
        if not self.receiver.authorized(dict(context.invocation_metadata()).get("authorization")):
            refusal = (grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token", None, logging.WARNING)
        else:
            try:
                with self.receiver.admit(size):
                    outcome = self.receiver.store_message(request, f"grpc {peer}")
            except BadExport as e:
                refusal = (grpc.StatusCode.INVALID_ARGUMENT, str(e), None, logging.WARNING)
            except Overloaded as e:
                refusal = (grpc.StatusCode.RESOURCE_EXHAUSTED, str(e), e.retry_after_s, logging.ERROR)
            except StorageUnavailable as e:
                refusal = (grpc.StatusCode.UNAVAILABLE, str(e), e.retry_after_s, logging.ERROR)
            except Exception as e:  # a bug: grpcio answers UNKNOWN
                log_outcome("grpc", peer, "UNKNOWN", now() - start, size, error=f"internal error: {e!r}",
                            level=logging.ERROR)
                raise
        if refusal is not None:
            code, message, retry_after_s, level = refusal
            log_outcome("grpc", peer, code.name, now() - start, size, error=message, level=level)
            _abort(context, code, message, retry_after_s)
        log_outcome("grpc", peer, "OK", now() - start, size, outcome, level=logging.INFO)
        response = ExportTraceServiceResponse()
        message = outcome.warning()
        if message:
            response.partial_success.CopyFrom(ExportTracePartialSuccess(rejected_spans=outcome.rejected,
                                                                        error_message=message))
        return response


class GrpcServer:
    """The OTLP/gRPC receiver: a grpcio server on its own threads."""

    def __init__(self, receiver: Receiver, host: str = "127.0.0.1", port: int = 4317,
                 tls: tuple[str, str] | None = None, workers: int | None = None) -> None:
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", receiver.limits.max_body_bytes),
            ("grpc.max_send_message_length", 4 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.max_connection_idle_ms", 300_000),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        # One handler thread per place in the queue, and one more: a call beyond the queue is answered
        # RESOURCE_EXHAUSTED with RetryInfo at once (retried by exporters) instead of waiting, and grpcio's own
        # limit on concurrent calls, which answers without RetryInfo (not retried: the spans would be lost), is
        # not used. Admitted calls wait in the receiver for one of its writers.
        threads = workers or receiver.limits.queue_size + 1
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="infertrace-grpc"),
                                  options=options)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(receiver), self.server)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if tls:
            credentials = grpc.ssl_server_credentials([(Path(tls[1]).read_bytes(), Path(tls[0]).read_bytes())])
            bound = self.server.add_secure_port(target, credentials)
        else:
            bound = self.server.add_insecure_port(target)
        if not bound:
            raise OSError(f"--grpc {host}:{port}: cannot listen there (in use, or not an address of this host)")
        self.host, self.port, self.tls = host, bound, tls is not None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> None:
        self.server.start()

    def shutdown(self) -> None:
        self.server.stop(grace=5).wait(10)
