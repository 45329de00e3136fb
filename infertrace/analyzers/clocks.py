"""Engine clocks that disagree with the gateway's (analyzers/sql/clock_offsets.sql).

Every span carries its own host's time. A request's gateway time (`requests.gateway_ns`: from the gateway's entry
span to the request's arrival at an engine) takes one end from each host, so an engine whose clock is off by 40 ms
moves 40 ms of every request's TTFT between "gateway" and "engine", and makes a healthy gateway look slow (or hides
a slow one). Two signs give such a clock away:

- a request reaching the engine before it entered the gateway: impossible, so the engine's clock is behind the
  gateway's by at least that much;
- a replica of a model whose floors of the two gaps around its span (entry start to engine arrival, engine finish
  to entry end: their 1st percentiles, past any queueing) stand apart from its siblings' behind the same gateway,
  one up and the other down by as much: its clock is apart from theirs by that much. Both up is a slower network
  path to it, not a clock, and is not reported here. With two replicas, which one is off cannot be told.

    for finding in clock_offsets(store):
        print(finding.sentence())
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infertrace.analyzers import query_text

if TYPE_CHECKING:
    from infertrace.store.store import Store

MIN_REQUESTS = 20  # replicas with fewer requests through the gateway are not compared (their floor is one request)
MIN_OFFSET_NS = 2_000_000  # offsets below this are not reported: NTP keeps hosts about this close
UNCHECKED = ("; no request's end to check it against (none colocated and served): a network path that much "
             "slower would look the same")


@dataclass(frozen=True)
class ClockOffset:
    model: str
    instances: tuple[str, ...]  # the engine whose clock is off; two when neither of two replicas can be blamed
    offset_ns: int  # that engine's clock less the gateway's (less the second replica's when there are two)
    at_least: bool  # a bound: the offset is at least this large (requests seen reaching the engine too early)
    requests: int  # the engine's requests with a gateway entry span
    evidence: str

    def sentence(self) -> str:
        if len(self.instances) == 2:
            first, second = self.instances
            return (f"{first} and {second} ({self.model}): their clocks differ by about {_ms(abs(self.offset_ns))} "
                    f"({self.evidence}); which one is off cannot be told from two replicas. The TTFT of one's requests "
                    "(the gateway's entry to the engine's first token: two clocks) and its gateway share are off by "
                    "as much.")
        direction = "ahead of" if self.offset_ns > 0 else "behind"
        size = f"at least {_ms(abs(self.offset_ns))}" if self.at_least else f"about {_ms(abs(self.offset_ns))}"
        return (f"{self.instances[0]} ({self.model}): its clock runs {size} {direction} the gateway's "
                f"({self.evidence}). The TTFT of its requests (the gateway's entry to its first token: two clocks) and "
                "its gateway share are off by as much.")


@dataclass(frozen=True)
class _Replica:
    instance: str
    requests: int
    start_floor_ns: int
    end_floor_ns: int | None


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms"


def _gaps(start_floor_ns: float, end_floor_ns: float | None) -> str:
    end = "" if end_floor_ns is None else f", engine finish to entry end {_ms(end_floor_ns)}"
    return f"entry start to engine arrival {_ms(start_floor_ns)}{end}"


def _checked(*ends: float | None) -> str:
    """What the evidence lacks when an end floor is unknown: then a slower path reads as a clock."""
    return UNCHECKED if any(end is None for end in ends) else ""


def _apart(replica: _Replica, start_ns: float, end_ns: float | None) -> float | None:
    """How far the replica's clock is from the reference floors' (a median replica's): its start floor up by what
    its end floor is down; None when its floors are not apart, or are apart in a way no clock explains (both up:
    a slower network path)."""
    up = replica.start_floor_ns - start_ns
    if abs(up) <= max(MIN_OFFSET_NS, abs(start_ns)):
        return None
    if replica.end_floor_ns is None or end_ns is None:
        return up
    down = end_ns - replica.end_floor_ns
    if up * down <= 0 or abs(up - down) > 0.5 * max(abs(up), abs(down)):
        return None
    return (up + down) / 2


def clock_offsets(store: Store) -> tuple[ClockOffset, ...]:
    """The engines whose clocks disagree with the gateway's, as far as the store's requests show it (none without
    gateway entry spans)."""
    found: list[ClockOffset] = []
    siblings: dict[str, list[_Replica]] = defaultdict(list)
    for model, instance, requests, early, start_floor, ended, end_floor in store.sql(
            query_text("clock_offsets")).fetchall():
        replica = _Replica(instance, int(requests), int(start_floor), int(end_floor) if ended else None)
        if early >= max(3, requests // 100) and start_floor < -MIN_OFFSET_NS:
            found.append(ClockOffset(
                model, (instance,), int(start_floor), True, int(requests),
                f"{early} of its {requests} requests reach it before they entered the gateway; 1st percentile of "
                f"the gap from entry start to engine arrival {_ms(start_floor)}"))
        elif requests >= MIN_REQUESTS:
            siblings[model].append(replica)
    for model, replicas in siblings.items():
        if len(replicas) == 2:
            a, b = replicas
            apart = _apart(a, b.start_floor_ns, b.end_floor_ns)
            if apart is not None:
                found.append(ClockOffset(model, (a.instance, b.instance), int(apart), False, a.requests,
                                         f"1st percentiles of the gaps around their spans: {a.instance}'s "
                                         f"{_gaps(a.start_floor_ns, a.end_floor_ns)}; {b.instance}'s "
                                         f"{_gaps(b.start_floor_ns, b.end_floor_ns)}"
                                         f"{_checked(a.end_floor_ns, b.end_floor_ns)}"))
        elif len(replicas) >= 3:
            start_ns = statistics.median(r.start_floor_ns for r in replicas)
            ends = [r.end_floor_ns for r in replicas if r.end_floor_ns is not None]
            end_ns = statistics.median(ends) if len(ends) == len(replicas) else None
            for replica in replicas:
                apart = _apart(replica, start_ns, end_ns)
                if apart is not None:
                    found.append(ClockOffset(
                        model, (replica.instance,), int(apart), False, replica.requests,
                        f"1st percentiles of the gaps around its spans: "
                        f"{_gaps(replica.start_floor_ns, replica.end_floor_ns)}; the median of {model}'s "
                        f"{len(replicas)} replicas: {_gaps(start_ns, end_ns)}{_checked(replica.end_floor_ns, end_ns)}"))
    return tuple(sorted(found, key=lambda f: (f.model, f.instances)))
