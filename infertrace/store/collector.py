"""What `infertrace collect` runs: OTLP/HTTP (and optionally OTLP/gRPC) receivers writing into a store
through one write path (`receiver`), and compaction in the background.

Each request's spans become their own segments (see `segments`): the answer is a success only after they
are fsynced and renamed into place, and a client that retries a request whose answer it never got (the
collector died in between) writes the same content key again, which adds nothing. Every `compact_interval_s`
the small segments older than `compact_min_age_s` are merged (`compaction`), and partitions older than
`retain_s` dropped.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from infertrace.store.compaction import DEFAULT_GRACE_S, compact
from infertrace.store.http_server import HttpServer
from infertrace.store.receiver import Limits, Receiver

log = logging.getLogger("infertrace.collect")
COMPACTION_FANOUT = 4  # background compaction merges a size class once it has this many segments


def parse_listen(listen: str, option: str = "--listen", default_port: int = 4318) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{option} {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:{default_port}")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


class Collector:
    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 4318, token: str | None = None,
                 max_body_bytes: int = 32 * 1024 * 1024, queue_size: int = 64, writers: int = 4,
                 memory_limit_bytes: int = 1024 * 1024 * 1024, grpc: tuple[str, int] | None = None,
                 tls: tuple[str, str] | None = None, header_timeout: float = 10.0, body_timeout: float = 30.0,
                 idle_timeout: int = 30, compact_interval_s: float | None = 30.0, compact_min_age_s: float = 10.0,
                 grace_s: float = DEFAULT_GRACE_S, retain_s: float | None = None,
                 resource: tuple[tuple[str, str], ...] = ()) -> None:
        self.receiver = Receiver(root, Limits(max_body_bytes, queue_size, memory_limit_bytes, writers), token,
                                 resource)
        self.root = self.receiver.root
        self.http = HttpServer(self.receiver, host, port, tls, header_timeout, body_timeout, idle_timeout)
        self.grpc = None
        if grpc is not None:
            from infertrace.store.grpc_server import GrpcServer

            try:
                self.grpc = GrpcServer(self.receiver, grpc[0], grpc[1], tls)
            except BaseException:
                self.http.shutdown()
                raise
        self.compact_interval_s = compact_interval_s
        self.compact_min_age_s = compact_min_age_s
        self.grace_s = grace_s
        self.retain_s = retain_s
        self._stop = threading.Event()
        self._compactor: threading.Thread | None = None

    @property
    def address(self) -> str:
        return self.http.address

    @property
    def grpc_address(self) -> str | None:
        return self.grpc.address if self.grpc is not None else None

    @property
    def spans_stored(self) -> int:
        return self.receiver.spans_stored

    def _start_background(self) -> None:
        if self.grpc is not None:
            self.grpc.start()
        if self.compact_interval_s:
            self._compactor = threading.Thread(target=self._compact_forever, name="infertrace-compact", daemon=True)
            self._compactor.start()

    def start(self) -> None:
        """Serves on background threads; `shutdown()` stops."""
        self.http.start()
        self._start_background()

    def serve_forever(self) -> None:
        """Serves until `shutdown()`; HTTP on the calling thread."""
        self._start_background()
        self.http.serve_forever()

    def shutdown(self) -> None:
        self._stop.set()
        self.http.shutdown()
        if self.grpc is not None:
            self.grpc.shutdown()
        if self._compactor is not None:
            self._compactor.join(60)

    def _compact_forever(self) -> None:
        assert self.compact_interval_s
        while not self._stop.wait(self.compact_interval_s):
            try:
                summary = compact(self.root, min_age_s=self.compact_min_age_s, grace_s=self.grace_s,
                                  retain_s=self.retain_s, fanout=COMPACTION_FANOUT)
            except Exception as e:  # never fatal: the segments stay as they are and readers go on
                log.error("compaction failed: %r", e)
                continue
            if summary.inputs or summary.removed or summary.expired:
                log.info("compaction: %s", summary.paragraph())
