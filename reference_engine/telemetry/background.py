"""Spans built, encoded and written in a child process, so that a simulator's own process only records facts.

A simulated engine step costs microseconds; turning it into an OTLP JSON span costs about as much again (building
the attributes, formatting every integer, joining the text). `BackgroundSink` moves that work to a child process
(forked, so nothing is imported or pickled twice): engine tracers send it the plain facts of each step and ended
request (`StepFacts`, `RequestFacts`), other producers (the gateway's components) send whole span batches, and the
child replays everything in the order it was sent, through an `EngineTracer` per engine and the inner sink. The
output is byte for byte what the inner sink would have written in-process: same spans, same ids (each tracer draws
them from its own seeded generator, in the same order), same batches.

Nothing is dropped: `close()` (and `spans_written`) wait until the child has handled everything sent so far, and an
error in the child (a bad attribute value, a full disk) is raised there, naming what failed.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from reference_engine.telemetry.otlp import Attributes, SpanRecord, SpanSink
from reference_engine.telemetry.tracer import EngineTracer, RequestFacts, StepFacts

_MESSAGES_PER_SEND = 512
_new_tuple = tuple.__new__


def available() -> bool:
    """Whether a child can be forked here (Linux); elsewhere, sinks run in the simulator's own process."""
    return sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


class RemoteTracer:
    """What an `EngineTracer` in the simulator's process hands its facts to: its twin in the child."""

    def __init__(self, sink: BackgroundSink, tracer_id: int) -> None:
        self._send = sink._send
        self._id = tracer_id

    def add_step(self, facts: StepFacts) -> None:
        self._send(("step", self._id, facts[:]))  # a plain tuple pickles at half the cost of the NamedTuple

    def add_request(self, facts: RequestFacts) -> None:
        self._send(("request", self._id, facts[:]))

    def flush(self) -> None:
        self._send(("flush", self._id))


class BackgroundSink:
    """A `SpanSink` whose work happens in a child process; `make_sink` builds the real sink there."""

    def __init__(self, make_sink: Callable[[], SpanSink]) -> None:
        if not available():
            raise RuntimeError("BackgroundSink needs fork (Linux); use the sink in-process instead")
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, make_sink), name="span-writer", daemon=True)
        self._process.start()
        child.close()
        self._messages: list[tuple[Any, ...]] = []
        self._tracers = 0
        self._written = 0
        self._closed = False
        try:
            self._call("sync")  # the inner sink is built: a bad path fails here, before anything runs
        except BaseException:
            self._closed = True
            self._process.join(timeout=60)
            raise

    def export(self, resource: Attributes, spans: Sequence[SpanRecord]) -> None:
        self._send(("spans", resource, spans))

    def tracer(self, resource: Attributes, seed: int, batch_size: int) -> RemoteTracer:
        """A twin `EngineTracer(inner sink, resource, seed, batch_size)` in the child, fed with facts."""
        self._tracers += 1
        self._send(("tracer", self._tracers, resource, seed, batch_size))
        return RemoteTracer(self, self._tracers)

    def _send(self, message: tuple[Any, ...]) -> None:
        self._messages.append(message)
        if len(self._messages) >= _MESSAGES_PER_SEND:
            self._flush()

    def _flush(self) -> None:
        if self._messages:
            try:
                self._conn.send_bytes(pickle.dumps(self._messages, protocol=pickle.HIGHEST_PROTOCOL))
            except (BrokenPipeError, ConnectionResetError, EOFError):
                self._raise_child_error()
            self._messages = []

    def _call(self, request: str) -> int:
        """Send `request` after everything pending and wait for the child's answer: spans written so far."""
        self._send((request,))
        self._flush()
        try:
            status, value = self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._raise_child_error()
        if status != "ok":
            raise RuntimeError(f"the span writer process failed: {value}")
        return value

    def _raise_child_error(self) -> None:
        error = "it exited"
        try:
            if self._conn.poll(1):
                status, value = self._conn.recv()
                error = value if status != "ok" else error
        except (EOFError, OSError):
            pass
        raise RuntimeError(f"the span writer process failed: {error}")

    @property
    def spans_written(self) -> int:
        """Spans the inner sink has written, once it has handled everything sent so far."""
        if not self._closed:
            self._written = self._call("sync")
        return self._written

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._written = self._call("close")
        finally:
            self._closed = True
            self._conn.close()
            self._process.join(timeout=60)


def _serve(conn: Connection, make_sink: Callable[[], SpanSink]) -> None:
    """The child: replays the messages in order until told to close."""
    sink: SpanSink | None = None
    tracers: dict[int, EngineTracer] = {}
    gc.disable()  # spans make no reference cycles; the cyclic collector would only rescan what the tracers hold
    try:
        sink = make_sink()
        while True:
            for message in pickle.loads(conn.recv_bytes()):
                kind = message[0]
                if kind == "step":
                    tracers[message[1]].add_step(_new_tuple(StepFacts, message[2]))
                elif kind == "request":
                    tracers[message[1]].add_request(_new_tuple(RequestFacts, message[2]))
                elif kind == "spans":
                    sink.export(message[1], message[2])
                elif kind == "flush":
                    tracers[message[1]].flush()
                elif kind == "tracer":
                    tracers[message[1]] = EngineTracer(sink, message[2], message[3], message[4])
                elif kind == "sync":
                    conn.send(("ok", _written(sink)))
                elif kind == "close":
                    sink.close()
                    conn.send(("ok", _written(sink)))
                    return
    except BaseException as e:  # reported to the parent, which raises it
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise SystemExit(1) from None


def _written(sink: SpanSink) -> int:
    return int(getattr(sink, "spans_written", getattr(sink, "spans_exported", 0)))
