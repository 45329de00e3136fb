"""A Perfetto trace of the engines (protobuf `Trace` of TrackEvents; open it in ui.perfetto.dev or load it with
the trace processor). Per engine instance, one process with:

- a `steps` track: one slice per engine step (`prefill+decode`, `decode`, `prefill`), its token counts and
  load as arguments; a stalled step is named `STALL …` and carries the time it added;
- counter tracks `running`, `waiting`, `KV blocks used`, `preempted` (a value at each change);
- request lanes: each engine request an async slice (requests that do not overlap share a lane) with its
  phases `queue`, `prefill` (its `chunk` slices inside, one per step that computed part of the prompt) and
  `decode`; a victim of an ITL stall has a `stalled` slice inside its decode phase;
- flows: from the culprit prefill chunk of each stall (`infertrace.analyzers.itl`) to the `token` instant at the
  end of each victim's `stalled` slice (the token the stall delayed), so that selecting a culprit's chunk in the UI
  shows the requests it stalled.

An engine that exports no step spans but times each token (SGLang, TGI; or a streaming client's token times) has
no steps track; its stalls are the request-only method's windows (`infertrace.analyzers.itl_requests`): a `stalled`
slice over each victim's window (its `token` instant at the end) and a flow from each culprit's `culprit prefill`
slice (the part of its prefill in the window), the culprit's confidence as an argument. Where neither is in the
store (vLLM's spans), no stall is drawn and the summary says why.

Timestamps are nanoseconds since the Unix epoch, UTC (a clock snapshot maps the trace clock to wall time).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pandas as pd
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    BuiltinClock,
    TracePacket,
    TrackDescriptor,
    TrackEvent,
)

from infertrace.export import NO_STALL_INPUTS, query_text, stall_source

if TYPE_CHECKING:
    from infertrace.analyzers.itl import ItlAnalysis, Stall
    from infertrace.analyzers.itl_requests import RequestStall
    from infertrace.store.store import Store

log = logging.getLogger(__name__)
_SEQUENCE = 1
_FRAME = b"\x0a"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@dataclass(frozen=True)
class PerfettoSummary:
    engines: int
    steps: int
    requests: int
    chunks: int
    stalls: int
    flows: int
    packets: int
    stall_method: str = "steps"  # 'steps' (engine_step spans), 'requests' (request and token times: windows), or
    # '' (neither in the store: no stall looked for)

    def sentence(self) -> str:
        stalls = {"steps": f"{self.stalls} stalls as {self.flows} culprit→victim flows",
                  "requests": f"{self.stalls} stall windows from request spans and token times (no engine_step "
                              f"spans: windows, not steps) as {self.flows} culprit→victim flows",
                  "": f"no stall drawn: {NO_STALL_INPUTS}"}[self.stall_method]
        return (f"{self.engines} engines, {self.steps} steps, {self.requests} requests ({self.chunks} prefill "
                f"chunks), {stalls}; {self.packets} packets")



class _Writer:
    """Packets to a stream, one `Trace` message each (concatenated messages are one `Trace`)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.packets = 0
        self._uuids = itertools.count(1)

    def _write(self, packet: TracePacket) -> None:
        # `Trace.packet` is field 1: a packet is framed as tag 0x0a, its length as a varint, its bytes.
        body = packet.SerializeToString()
        self.stream.write(_FRAME + _varint(len(body)) + body)
        self.packets += 1

    def clock(self, at_ns: int) -> None:
        """Trace time is wall time: the UI and the trace processor can show UTC."""
        packet = TracePacket(trusted_packet_sequence_id=_SEQUENCE)
        for clock in (BuiltinClock.BUILTIN_CLOCK_BOOTTIME, BuiltinClock.BUILTIN_CLOCK_REALTIME):
            packet.clock_snapshot.clocks.add(clock_id=clock, timestamp=at_ns)
        self._write(packet)

    def track(self, name: str, parent: int | None = None, pid: int | None = None, counter: bool = False) -> int:
        uuid = next(self._uuids)
        descriptor = TrackDescriptor(uuid=uuid, name=name)
        if parent is not None:
            descriptor.parent_uuid = parent
        if pid is not None:
            descriptor.process.pid = pid
            descriptor.process.process_name = name
        if counter:
            descriptor.counter.SetInParent()
        self._write(TracePacket(trusted_packet_sequence_id=_SEQUENCE, track_descriptor=descriptor))
        return uuid

    def begin(self, track: int, ts: int, name: str, args: dict[str, Any] | None = None,
              flows_out: Iterable[int] = ()) -> None:
        event = TrackEvent(type=TrackEvent.TYPE_SLICE_BEGIN, track_uuid=track, name=name, flow_ids=list(flows_out))
        for key, value in (args or {}).items():
            if value is None:
                continue
            annotation = event.debug_annotations.add(name=key)
            if isinstance(value, bool):
                annotation.bool_value = value
            elif isinstance(value, int):
                annotation.int_value = value
            elif isinstance(value, float):
                annotation.double_value = value
            else:
                annotation.string_value = str(value)
        self._write(TracePacket(timestamp=ts, trusted_packet_sequence_id=_SEQUENCE, track_event=event))

    def instant(self, track: int, ts: int, name: str, flows_in: Iterable[int] = ()) -> None:
        event = TrackEvent(type=TrackEvent.TYPE_INSTANT, track_uuid=track, name=name,
                           terminating_flow_ids=list(flows_in))
        self._write(TracePacket(timestamp=ts, trusted_packet_sequence_id=_SEQUENCE, track_event=event))

    def end(self, track: int, ts: int) -> None:
        event = TrackEvent(type=TrackEvent.TYPE_SLICE_END, track_uuid=track)
        self._write(TracePacket(timestamp=ts, trusted_packet_sequence_id=_SEQUENCE, track_event=event))

    def counter(self, track: int, ts: int, value: int) -> None:
        event = TrackEvent(type=TrackEvent.TYPE_COUNTER, track_uuid=track, counter_value=value)
        self._write(TracePacket(timestamp=ts, trusted_packet_sequence_id=_SEQUENCE, track_event=event))


@dataclass
class _Child:
    """A slice inside a request's phase: a prefill chunk or a stall."""

    start_ns: int
    end_ns: int
    name: str
    args: dict[str, Any]
    flows_out: list[int]
    flows_in: list[int]


def _int(value: Any) -> int | None:
    """An int, or None for SQL's NULL as pandas gives it (None, NaN, or NA in a column of a nullable type)."""
    return None if pd.isna(value) else int(value)


def write_perfetto(store: Store, out: Path | IO[bytes], since_ns: int | None = None, until_ns: int | None = None,
                   instances: Iterable[str] | None = None, itl: ItlAnalysis | None = None,
                   on_progress: Callable[[int], None] | None = None) -> PerfettoSummary:
    """Writes the trace of the engines in the window (steps ending, requests overlapping [since, until)) to
    `out`. `itl` is the ITL analysis of the store (computed when not given); its stalls become flows."""
    from infertrace.analyzers.itl import analyze_itl
    from infertrace.analyzers.itl_requests import attribute_store_requests

    wanted = sorted(set(instances)) if instances is not None else None
    params = {"since": since_ns, "until": until_ns, "instances": wanted}
    steps = store.sql(query_text("perfetto_steps"), params=params).df()
    requests = store.sql(query_text("perfetto_requests"), params=params).df()
    chunks = store.sql(query_text("perfetto_chunks"), params=params).df()

    def kept(instance: str, end_ns: int) -> bool:
        return ((since_ns is None or end_ns >= since_ns) and (until_ns is None or end_ns < until_ns)
                and (wanted is None or instance in wanted))

    present = set(requests["request_id"])
    stall_at: dict[tuple[str, int], Stall] = {}
    method = "steps" if itl is not None else stall_source(store)
    if method == "steps":
        stalls: list[Any] = [s for s in (itl or analyze_itl(store)).stalls if kept(s.instance, s.end_ns)]
        stall_at = {(s.instance, s.end_ns): s for s in stalls}
        children, flows = _stall_children(stalls, chunks, present)
    elif method == "requests":
        stalls = [s for s in attribute_store_requests(store).stalls if kept(s.instance, s.end_ns)]
        children, flows = _request_stall_children(stalls, requests, present)
    else:
        stalls, children, flows = [], {}, 0
    log.info("perfetto export: %d steps, %d requests, %d prefill chunks, %d stalls (%s)", len(steps), len(requests),
             len(chunks), len(stalls), method or "none looked for")
    if isinstance(out, Path):
        with out.open("wb") as stream:
            packets, engines = _write(stream, steps, requests, stall_at, children, on_progress)
    else:
        packets, engines = _write(out, steps, requests, stall_at, children, on_progress)
    return PerfettoSummary(engines=engines, steps=len(steps), requests=len(requests), chunks=len(chunks),
                           stalls=len(stalls), flows=flows, packets=packets, stall_method=method)


def _write(stream: IO[bytes], steps: Any, requests: Any, stall_at: dict[tuple[str, int], Stall],
           children: dict[str, list[_Child]], on_progress: Callable[[int], None] | None) -> tuple[int, int]:
    """Draws the engines; returns (packets, engines)."""
    writer = _Writer(stream)
    starts = [int(f.min()) for f in (steps["start_ns"], requests["arrival_ns"]) if len(f)]
    writer.clock(min(starts) if starts else 0)
    models = {**dict(zip(requests["instance"], requests["model"], strict=True)),
              **dict(zip(steps["instance"], steps["model"], strict=True))}
    engines = sorted(set(steps["instance"]) | set(requests["instance"]))
    done = 0
    for pid, instance in enumerate(engines, start=1):
        model = models.get(instance)
        process = writer.track(f"{instance} ({model})" if model else str(instance), pid=pid)
        engine_steps = steps[steps["instance"] == instance]
        if len(engine_steps):
            _write_steps(writer, process, engine_steps, stall_at, instance)
        _write_requests(writer, process, requests[requests["instance"] == instance], children)
        done += len(engine_steps) + int((requests["instance"] == instance).sum())
        if on_progress is not None:
            on_progress(done)
    return writer.packets, len(engines)


def _write_steps(writer: _Writer, process: int, steps: Any, stall_at: dict[tuple[str, int], Stall],
                 instance: str) -> None:
    track = writer.track("steps", parent=process)
    counters = {name: writer.track(name, parent=process, counter=True)
                for name in ("running", "waiting", "KV blocks used", "preempted")}
    last: dict[str, int | None] = dict.fromkeys(counters)
    columns = ("step_index", "start_ns", "end_ns", "prefill_tokens", "decode_tokens", "num_decodes", "running",
               "waiting", "kv_used_blocks", "num_preempted", "pause_ns")
    for row in zip(*(steps[c].tolist() for c in columns), strict=True):
        index, start, end, prefill, decode, decodes, running, waiting, kv, preempted, pause = map(_int, row)
        kind = "+".join(k for k, n in (("prefill", prefill), ("decode", decode)) if n) or "idle"
        # running, waiting, KV use and preemptions are the counter tracks' values
        args: dict[str, Any] = {"step": index, "prefill_tokens": prefill, "decode_tokens": decode,
                                "decoding_requests": decodes}
        if pause:
            args["pause_ms"] = pause / 1e6
        stall = stall_at.get((instance, end))
        if stall is not None:
            kind = f"STALL {kind}"
            args.update(added_ms=stall.added_ns / 1e6, causes=", ".join(stall.causes), victims=len(stall.victims),
                        culprits=", ".join(c.request_id for c in stall.culprits))
        writer.begin(track, start, kind, args)
        writer.end(track, end)
        for name, value in zip(counters, (running, waiting, kv, preempted), strict=True):
            if value is not None and value != last[name]:
                writer.counter(counters[name], end, value)
                last[name] = value


def _stall_children(stalls: list[Stall], chunks: Any, present: set[str]) -> tuple[dict[str, list[_Child]], int]:
    """Each request's chunk and stall slices, with a flow from each stall's culprit chunks to each victim."""
    children: dict[str, list[_Child]] = defaultdict(list)
    chunk_at: dict[tuple[str, int], _Child] = {}
    for request_id, start, end, tokens, computed in zip(
            chunks["request_id"], chunks["start_ns"], chunks["end_ns"], chunks["chunk_tokens"],
            chunks["computed_tokens"], strict=True):
        child = _Child(int(start), int(end), "chunk", {"chunk_tokens": _int(tokens), "cached_tokens": _int(computed)},
                       [], [])
        children[request_id].append(child)
        chunk_at[(request_id, int(end))] = child
    flow_ids = itertools.count(1)
    flows = 0
    for s in stalls:
        victims = [v for v in s.victims if v in present]
        for c in s.culprits:
            if c.request_id not in present:
                continue
            chunk = chunk_at.get((c.request_id, s.end_ns))
            if chunk is None:
                chunk = _Child(s.start_ns, s.end_ns, "chunk", {"chunk_tokens": c.chunk_tokens,
                                                                "cached_tokens": c.computed_tokens}, [], [])
                children[c.request_id].append(chunk)
            chunk.name = "culprit chunk"
            chunk.args.update(stalled_requests=len(s.victims), share_of_excess=round(c.share, 4),
                              excess_ms=c.excess_ns / 1e6)
            for victim in victims:
                flow = next(flow_ids)
                chunk.flows_out.append(flow)
                children[victim].append(_Child(s.start_ns, s.end_ns, "stalled",
                                               {"culprit": c.request_id, "added_ms": s.added_ns / 1e6,
                                                "step": s.step_index}, [], [flow]))
                flows += 1
        if not s.culprits:  # a host pause: the victims' stall, without a culprit request
            for victim in victims:
                children[victim].append(_Child(s.start_ns, s.end_ns, "stalled", {
                    "causes": ", ".join(s.causes), "added_ms": s.added_ns / 1e6, "step": s.step_index}, [], []))
    return children, flows


def _request_stall_children(stalls: list[RequestStall], requests: Any,
                            present: set[str]) -> tuple[dict[str, list[_Child]], int]:
    """Each request's slices for the request-only stall windows: the part of each culprit's prefill inside the
    window (its whole prefill where the clocks put it just outside), with a flow to the token ending each victim's
    `stalled` slice."""
    children: dict[str, list[_Child]] = defaultdict(list)
    prefill = {r: (lo, hi) for r, s, f in zip(requests["request_id"], requests["scheduled_ns"],
                                              requests["first_token_ns"], strict=True)
               if (lo := _int(s)) is not None and (hi := _int(f)) is not None}
    flow_ids = itertools.count(1)
    flows = 0
    for s in stalls:
        victims = [v for v in s.victims if v in present]
        for c in s.culprits:
            if c.request_id not in present or c.request_id not in prefill:
                continue
            lo, hi = prefill[c.request_id]
            start, end = (max(lo, s.start_ns), min(hi, s.end_ns)) if lo < s.end_ns and hi > s.start_ns else (lo, hi)
            culprit = _Child(start, end, "culprit prefill", {
                "uncached_tokens": c.uncached_tokens, "confidence": round(c.confidence, 4),
                "stalled_requests": len(s.victims), "excess_ms": s.excess_ns / 1e6}, [], [])
            children[c.request_id].append(culprit)
            for victim in victims:
                flow = next(flow_ids)
                culprit.flows_out.append(flow)
                children[victim].append(_Child(s.start_ns, s.end_ns, "stalled", {
                    "culprit": c.request_id, "confidence": round(c.confidence, 4),
                    "worst_itl_ms": s.worst_itl_ns / 1e6}, [], [flow]))
                flows += 1
        if not s.culprits:  # no prefill in the window explains it
            for victim in victims:
                children[victim].append(_Child(s.start_ns, s.end_ns, "stalled", {
                    "culprit": "none found", "worst_itl_ms": s.worst_itl_ns / 1e6}, [], []))
    return children, flows


def _write_requests(writer: _Writer, process: int, requests: Any, children: dict[str, list[_Child]]) -> None:
    lanes: list[int] = []
    free: list[tuple[int, int]] = []  # (end of the lane's last request, lane number)
    columns = ("request_id", "tenant", "arrival_ns", "scheduled_ns", "first_token_ns", "finish_ns", "input_tokens",
               "output_tokens", "cached_tokens", "preemptions", "outcome")
    for row in zip(*(requests[c].tolist() for c in columns), strict=True):
        request_id, tenant, arrival, scheduled, first, finish, inputs, outputs, cached, preemptions, outcome = row
        arrival, finish = int(arrival), max(int(finish), int(arrival))
        if free and free[0][0] <= arrival:
            _, lane = heapq.heappop(free)
        else:
            lane = len(lanes)
            lanes.append(writer.track(f"requests {lane}", parent=process))
        heapq.heappush(free, (finish, lane))
        track = lanes[lane]
        scheduled_ns = _int(scheduled)
        first_ns = _int(first)
        phases = _phases(arrival, scheduled_ns, first_ns, finish)
        writer.begin(track, arrival, str(request_id), {
            "request_id": request_id, "tenant": tenant, "input_tokens": _int(inputs), "output_tokens": _int(outputs),
            "cached_tokens": _int(cached), "preemptions": _int(preemptions), "outcome": outcome})
        inside = sorted(children.get(request_id, ()), key=lambda c: (c.start_ns, -c.end_ns))
        for name, start, end in phases:
            writer.begin(track, start, name)
            for child in inside:
                middle = (child.start_ns + child.end_ns) // 2
                if start <= middle < end or (middle == end and name == phases[-1][0]):
                    writer.begin(track, max(child.start_ns, start), child.name, child.args, child.flows_out)
                    if child.flows_in:
                        # The flows end at the token the stall delayed, not at the stalled slice's start: a victim's
                        # wait starts with the culprit's step, and the trace processor (and the UI) drops a flow
                        # whose end event has its start's timestamp but comes first in the trace.
                        writer.instant(track, min(child.end_ns, end), "token", child.flows_in)
                    writer.end(track, min(child.end_ns, end))
            writer.end(track, end)
        writer.end(track, finish)


def _phases(arrival: int, scheduled: int | None, first: int | None, finish: int) -> list[tuple[str, int, int]]:
    """queue [arrival, first scheduled), prefill [scheduled, first token), decode [first token, finish]."""
    scheduled = min(max(scheduled if scheduled is not None else arrival, arrival), finish)
    first = min(max(first if first is not None else finish, scheduled), finish)
    phases = [("queue", arrival, scheduled), ("prefill", scheduled, first), ("decode", first, finish)]
    return [p for p in phases if p[2] > p[1]]
