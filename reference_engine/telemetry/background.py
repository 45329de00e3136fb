"""Spans built, encoded and written in a child process, so that a simulator's own process only records facts.

A simulated engine step costs microseconds; turning it into an OTLP JSON span costs about as much again (building
the attributes, formatting every integer, joining the text). `BackgroundSink` moves that work to a child process
(forked, so nothing is imported or pickled twice): engine tracers hand it each step report and ended request, which
it records as plain values, and other producers (the gateway's components) send whole span batches. The child
rebuilds each step's `StepFacts` and request's `RequestFacts` and replays everything in the order it was sent,
through an `EngineTracer` per engine and the inner sink. The output is byte for byte what the inner sink would have
written in-process: same spans, same ids (each tracer draws them from its own seeded generator, in the same order),
same batches. A tracer asked to (`summarize`) also keeps the simulation's summary statistics there, from the same facts
(`SimulationStats.add_step`, `add_request`): the simulator's process then neither computes them nor sends anything
more, and gets the `Summary` back at the end (`RemoteTracer.summary`).

What crosses the pipe is columnar, because the simulator's own process pays for every object it builds and
pickles: a step is a run of integers in one list (sent as int64 bytes), its request ids go to a list of strings,
its step durations to a list of arrays (sent as one int64 buffer); only what is rare (KV-tier hits, offloaded
experts, KV loads) or per request (`RequestFacts`, as a plain tuple) or whole (span batches, control messages)
is an object. The `_STEP`, `_REQUEST` and `_MESSAGE` records say in which order to read them.

The child takes messages off the pipe in a thread of its own as they come (up to `_MESSAGES_AHEAD` ahead of what it
has written), so that on a busy machine, where it falls behind for a while, the simulator does not wait on a full
pipe: it runs on, and the child catches up.

Nothing is dropped: `close()` (and `spans_written`) wait until the child has handled everything sent so far, and an
error in the child (a bad attribute value, a full disk) is raised there, naming what failed.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import multiprocessing
import pickle
import queue
import struct
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import fields
from multiprocessing.connection import Connection
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from reference_engine.stats import SimulationStats, Summary
from reference_engine.telemetry.otlp import Attributes, SpanRecord, SpanSink
from reference_engine.telemetry.tracer import EngineTracer, RequestFacts, StepFacts, rare_step_facts, request_facts

if TYPE_CHECKING:
    from reference_engine.engine.llm_engine import StepReport
    from reference_engine.engine.sequence import Sequence as EngineSequence

_INTS_PER_SEND = 8192  # ≈ 500 steps' records (64 KB) per message: the child starts early and ends soon after
_OBJECTS_PER_SEND = 512  # span batches, requests' facts
_MESSAGES_AHEAD = 64  # messages the child holds before the simulator waits on the pipe (≈ 8 MB of records)
_PIPE_BYTES = 1 << 20  # what the pipe holds (Linux's limit without privileges): several messages, so that the
# simulator does not wait while the child's inbox thread waits its turn for the interpreter
_STEP, _REQUEST, _MESSAGE = 0, 1, 2
_M_TRIM_THRESHOLD, _M_TOP_PAD = -1, -2  # glibc's mallopt parameters (malloc.h)
_HEAP_KEPT, _HEAP_PAD = 256 << 20, 16 << 20  # the writer's heap: freed bytes kept at its top, bytes added per growth
_request_id = attrgetter("request.request_id")
_span_fields = attrgetter(*(f.name for f in fields(SpanRecord)))  # SpanRecord(*fields) rebuilds it
_new_tuple = tuple.__new__


def available() -> bool:
    """Whether a child can be forked here (Linux); elsewhere, sinks run in the simulator's own process."""
    return sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


class RemoteTracer:
    """What an `EngineTracer` in the simulator's process hands the engine's reports to: it records the facts its
    twin in the child reads (`step_facts`, `request_facts` in telemetry/tracer.py), as `_replay` reads them."""

    def __init__(self, sink: BackgroundSink, tracer_id: int) -> None:
        self._sink = sink
        self._id = tracer_id
        self._ints, self._strs, self._durations, self._objects = sink._ints, sink._strs, sink._durations, sink._objects

    def on_step(self, report: StepReport) -> None:
        batch = report.batch
        decodes, prefills, preempted = batch.decodes, batch.prefills, batch.preempted
        rare = batch.kv_hits is not None or report.offload is not None or report.kv_load is not None
        ints = self._ints
        ints += (_STEP, self._id, report.index, report.start_ns, report.end_ns, batch.decode_context,
                 report.num_running, report.num_waiting, report.kv_used_blocks, report.kv_total_blocks,
                 report.pause_ns, len(report.durations), len(decodes), len(prefills), len(preempted), rare)
        self._durations.append(report.durations)
        strs = self._strs
        strs += map(_request_id, decodes)
        for seq, chunk in prefills:
            strs.append(seq.request.request_id)
            computed = seq.num_computed_tokens
            ints += (chunk, computed - chunk, computed >= seq.prefill_target)
        if preempted:
            strs += map(_request_id, preempted)
        if rare:
            self._objects.append(rare_step_facts(report))
        if len(ints) >= _INTS_PER_SEND:
            self._sink._flush()

    def on_finish(self, seq: EngineSequence) -> None:
        self._ints += (_REQUEST, self._id)
        self._objects.append(request_facts(seq)[:])  # a plain tuple pickles at half the cost of the NamedTuple
        if len(self._objects) >= _OBJECTS_PER_SEND:
            self._sink._flush()

    def flush(self) -> None:
        self._sink._send(("flush", self._id))

    def summary(self) -> Summary:
        """The summary statistics of everything recorded so far (the tracer was made with `summarize`)."""
        return self._sink._call("summary", self._id)


class BackgroundSink:
    """A `SpanSink` whose work happens in a child process; `make_sink` builds the real sink there."""

    def __init__(self, make_sink: Callable[[], SpanSink]) -> None:
        if not available():
            raise RuntimeError("BackgroundSink needs fork (Linux); use the sink in-process instead")
        context = multiprocessing.get_context("fork")
        records, self._records = context.Pipe(duplex=False)  # the simulator writes, the child reads
        self._answers, answers = context.Pipe(duplex=False)  # the child answers "sync" and "close", or says what failed
        with contextlib.suppress(OSError):  # where the system allows less, the simulator only waits sooner
            fcntl.fcntl(self._records.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        self._process = context.Process(target=_serve, args=(records, answers, make_sink), name="span-writer",
                                        daemon=True)
        self._process.start()
        records.close()
        answers.close()
        # The records not yet sent (RemoteTracer, _replay): cleared in place, RemoteTracers hold them.
        self._ints: list[int] = []
        self._strs: list[str] = []
        self._durations: list[np.ndarray] = []
        self._objects: list[Any] = []
        self._tracers = 0
        self._written = 0
        self._closed = False
        try:
            self._call("sync")  # the inner sink is built: a bad path fails here, before anything runs
        except BaseException:
            self._closed = True
            self._process.join(timeout=60)
            raise

    def export(self, resource: Attributes, spans: Sequence[SpanRecord], scope: str | None = None) -> None:
        self._send(("spans", resource, list(map(_span_fields, spans)), scope))  # tuples pickle at a third the cost

    def tracer(self, resource: Attributes, seed: int, batch_size: int, summarize: bool = False) -> RemoteTracer:
        """A twin `EngineTracer(inner sink, resource, seed, batch_size)` in the child, fed with facts; with
        `summarize`, a `SimulationStats` beside it, fed the same facts (`RemoteTracer.summary`)."""
        self._tracers += 1
        self._send(("tracer", self._tracers, resource, seed, batch_size, summarize))
        return RemoteTracer(self, self._tracers)

    def _send(self, message: tuple[Any, ...]) -> None:
        self._ints.append(_MESSAGE)
        self._objects.append(message)
        if len(self._objects) >= _OBJECTS_PER_SEND:
            self._flush()

    def _flush(self) -> None:
        if not self._ints:
            return
        ints: bytes | list[int]
        try:  # struct converts Python ints at a third of the cost of array("q") and half of numpy's
            ints = struct.pack(f"{len(self._ints)}q", *self._ints)
        except struct.error:  # a value beyond int64: sent as it is
            ints = self._ints
        durations = np.concatenate(self._durations).tobytes() if self._durations else b""
        data = pickle.dumps((ints, self._strs, durations, self._objects), protocol=pickle.HIGHEST_PROTOCOL)
        self._ints.clear()
        self._strs.clear()
        self._durations.clear()
        self._objects.clear()
        try:
            self._records.send_bytes(data)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._raise_child_error()

    def _call(self, *request: Any) -> Any:
        """Send `request` after everything pending and wait for the child's answer (spans written so far; for
        "summary", the tracer's `Summary`)."""
        self._send(request)
        self._flush()
        try:
            status, value = self._answers.recv()
        except (EOFError, ConnectionResetError):
            self._raise_child_error()
        if status != "ok":
            raise RuntimeError(f"the span writer process failed: {value}")
        return value

    def _raise_child_error(self) -> None:
        error = "it exited"
        try:
            if self._answers.poll(1):
                status, value = self._answers.recv()
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
            self._records.close()
            self._answers.close()
            self._process.join(timeout=60)


def _serve(records: Connection, answers: Connection, make_sink: Callable[[], SpanSink]) -> None:
    """The child: replays the records in order until told to close. A thread takes the messages off the pipe as they
    come (up to `_MESSAGES_AHEAD`), so that the simulator does not wait on a full pipe while this process has fallen
    behind for a moment (a busy machine): it catches up on what is queued."""
    sink: SpanSink | None = None
    tracers: dict[int, _Twin] = {}
    gc.disable()  # spans make no reference cycles; the cyclic collector would only rescan what the tracers hold
    _keep_heap()
    inbox: queue.Queue[bytes | None] = queue.Queue(maxsize=_MESSAGES_AHEAD)
    threading.Thread(target=_receive, args=(records, inbox), name="span-writer-inbox", daemon=True).start()
    try:
        sink = make_sink()
        while (message := inbox.get()) is not None:
            if _replay(pickle.loads(message), answers, sink, tracers):
                break
        if message is None:
            raise RuntimeError("the simulator's process closed the pipe before closing the sink")
    except BaseException as e:  # reported to the parent, which raises it
        with contextlib.suppress(OSError):
            answers.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise SystemExit(1) from None


def _keep_heap() -> None:
    """Has glibc's malloc keep freed memory at the top of the heap instead of handing it back to the system: the
    writer frees a batch's megabytes of text after every write and would fault the same pages in again at the next
    (≈ 100,000 page faults, a quarter of its CPU time, in a traced hour)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its own malloc as it is
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_TRIM_THRESHOLD, _HEAP_KEPT)
        libc.mallopt(_M_TOP_PAD, _HEAP_PAD)


def _receive(records: Connection, inbox: queue.Queue[bytes | None]) -> None:
    """The child's inbox thread: every message as it arrives, then None once the pipe is closed."""
    try:
        while True:
            inbox.put(records.recv_bytes())
    except (EOFError, OSError):
        inbox.put(None)


class _Twin:
    """In the child: what a `RemoteTracer` feeds, its `EngineTracer` and, when it summarises, its statistics."""

    def __init__(self, tracer: EngineTracer, stats: SimulationStats | None) -> None:
        self.tracer = tracer
        self.stats = stats
        if stats is None:
            self.add_step, self.add_request = tracer.add_step, tracer.add_request
        else:
            self.add_step, self.add_request = self._step_both, self._request_both

    def _step_both(self, step: StepFacts) -> None:
        self.tracer.add_step(step)
        self.stats.add_step(step)  # type: ignore[union-attr]

    def _request_both(self, request: RequestFacts) -> None:
        self.tracer.add_request(request)
        self.stats.add_request(request)  # type: ignore[union-attr]


def _replay(records: tuple[bytes | list[int], list[str], bytes, list[Any]], answers: Connection, sink: SpanSink,
            tracers: dict[int, _Twin]) -> bool:
    """Replays one message of records (BackgroundSink._flush); returns whether it ended with "close"."""
    packed, strs, packed_durations, objects = records
    ints = np.frombuffer(packed, dtype=np.int64).tolist() if isinstance(packed, bytes) else packed
    durations = np.frombuffer(packed_durations, dtype=np.int64).tolist()
    i = s = d = o = 0
    end = len(ints)
    while i < end:
        kind = ints[i]
        if kind == _STEP:
            (tracer, index, start_ns, end_ns, decode_context, running, waiting, kv_used, kv_total, pause,
             steps, decodes, prefills, preempted, rare) = ints[i + 1:i + 16]
            i += 16
            decode_ids = strs[s:s + decodes]
            s += decodes
            prefill_facts = []
            for _ in range(prefills):
                prefill_facts.append((strs[s], ints[i], ints[i + 1], ints[i + 2] == 1))
                s += 1
                i += 3
            preempted_ids = strs[s:s + preempted]
            s += preempted
            kv_hits = offload = kv_load = None
            if rare:
                kv_hits, offload, kv_load = objects[o]
                o += 1
            tracers[tracer].add_step(_new_tuple(StepFacts, (
                index, start_ns, end_ns, durations[d:d + steps], decode_ids, decode_context, prefill_facts,
                preempted_ids, running, waiting, kv_used, kv_total, pause, kv_hits, offload, kv_load)))
            d += steps
        elif kind == _REQUEST:
            tracers[ints[i + 1]].add_request(_new_tuple(RequestFacts, objects[o]))
            i += 2
            o += 1
        else:
            message = objects[o]
            i += 1
            o += 1
            if _handle(message, answers, sink, tracers):
                return True
    return False


def _handle(message: tuple[Any, ...], answers: Connection, sink: SpanSink, tracers: dict[int, _Twin]) -> bool:
    """A message sent whole (BackgroundSink._send); returns whether it was "close"."""
    kind = message[0]
    if kind == "spans":
        sink.export(message[1], [SpanRecord(*fields) for fields in message[2]], scope=message[3])
    elif kind == "flush":
        tracers[message[1]].tracer.flush()
    elif kind == "tracer":
        tracer_id, resource, seed, batch_size, summarize = message[1:]
        tracers[tracer_id] = _Twin(EngineTracer(sink, resource, seed, batch_size),
                                   SimulationStats() if summarize else None)
    elif kind == "summary":
        stats = tracers[message[1]].stats
        if stats is None:
            raise RuntimeError(f"tracer {message[1]} was not made to summarise")
        answers.send(("ok", stats.summary()))
    elif kind == "sync":
        answers.send(("ok", _written(sink)))
    elif kind == "close":
        sink.close()
        answers.send(("ok", _written(sink)))
        return True
    return False


def _written(sink: SpanSink) -> int:
    return int(getattr(sink, "spans_written", getattr(sink, "spans_exported", 0)))
