"""What a streaming client records: when it sent each request and when each token arrived, one JSON line per
request (docs/sources.md, "Client token times"):

    {"request_id": "tenant-a-000042", "model": "llama-3-8b", "sent_ns": 1767225600100000000,
     "token_ns": [1767225600412000000, 1767225600431000000, ...]}

Times are integer nanoseconds since the epoch on the client's clock. A token reaches the client `delay_ms` after
the engine produced it (the network and any proxy, fixed per run) plus a jitter drawn uniformly in
[0, `jitter_ms`] per token; a stream delivers in order, so a token never arrives before the one before it.
A request that produced no token (rejected, failed) has no line.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import IO, TYPE_CHECKING

from reference_engine.telemetry.timeline import Timeline

if TYPE_CHECKING:
    from reference_engine.engine.llm_engine import StepReport
    from reference_engine.engine.sequence import Request, Sequence


class ClientTokenLog:
    """The file, shared by every engine of a run; `observer(role)` gives each engine its recorder."""

    def __init__(self, path: Path, delay_ms: float = 2.0, jitter_ms: float = 1.0, seed: int = 0) -> None:
        if delay_ms < 0 or jitter_ms < 0:
            raise ValueError(f"client delay and jitter must be ≥ 0 ms, got {delay_ms} and {jitter_ms}")
        self.path = path
        self.delay_ns = round(delay_ms * 1e6)
        self.jitter_ns = round(jitter_ms * 1e6)
        self._rng = random.Random(f"client-{seed}")
        self._file: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._sent: dict[str, int] = {}
        self.lines = 0

    def expect(self, requests: list[Request]) -> None:
        """The requests as the client sends them (before any gateway or engine changes their times)."""
        for r in requests:
            self._sent.setdefault(r.request_id, r.arrival_ns - self.delay_ns)

    def observer(self, role: str = "engine") -> ClientTokenRecorder:
        return ClientTokenRecorder(self, role)

    def received(self, seq: Sequence, token_ns: list[int], role: str) -> None:
        rid = seq.request_id
        if role == "prefill_worker" or not token_ns:  # a prefill worker's one token goes to the proxy, not the client
            return
        arrived, last = [], 0
        for t in token_ns:
            last = max(last, t + self.delay_ns + round(self._rng.uniform(0, self.jitter_ns)))
            arrived.append(last)
        sent = self._sent.get(rid, seq.request.arrival_ns - self.delay_ns)
        self._file.write(json.dumps({"request_id": rid, "model": seq.request.model, "sent_ns": sent,
                                     "token_ns": arrived}, separators=(",", ":")) + "\n")
        self.lines += 1

    def close(self) -> None:
        self._file.close()


class ClientTokenRecorder:
    """One engine's tokens, handed to the client log when each request ends there."""

    def __init__(self, log: ClientTokenLog, role: str) -> None:
        self.log, self.role = log, role
        self.timeline = Timeline(with_steps=False)

    def on_step(self, report: StepReport) -> None:
        self.timeline.on_step(report)

    def on_finish(self, seq: Sequence) -> None:
        self.log.received(seq, self.timeline.pop(seq.request_id).token_ns, self.role)
