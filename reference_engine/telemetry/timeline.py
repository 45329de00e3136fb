"""What each request lived through, step by step: the engine steps it took part in and the time of each token it
received. The emulations of other engines' telemetry (SGLang's per-iteration slices, TGI's per-batch spans) and a
streaming client's token times are rendered from it when the request ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reference_engine.engine.llm_engine import StepReport


@dataclass(slots=True)
class StepSeen:
    """One engine step as one request saw it."""

    index: int
    start_ns: int
    end_ns: int
    prefill_tokens: int  # the request's own chunk (0 for a decode)
    batch_size: int  # requests in the step
    has_prefill: bool  # the step computed some prefill (its own or another request's)
    batch: int  # a number shared by every request of the step (the emulations turn it into their batch id)


@dataclass(slots=True)
class Journey:
    steps: list[StepSeen] = field(default_factory=list)
    token_ns: list[int] = field(default_factory=list)  # each generated token, at the end of the step that made it
    preempted_ns: list[int] = field(default_factory=list)


class Timeline:
    """Journeys of the requests in flight, keyed by request id; `pop` hands one over when its request ends."""

    def __init__(self, with_steps: bool = True) -> None:
        self.with_steps = with_steps
        self.journeys: dict[str, Journey] = {}
        self.batches = 0

    def _journey(self, request_id: str) -> Journey:
        journey = self.journeys.get(request_id)
        if journey is None:
            journey = self.journeys[request_id] = Journey()
        return journey

    def on_step(self, report: StepReport) -> None:
        batch = report.batch
        for seq in batch.preempted:
            self._journey(seq.request_id).preempted_ns.append(report.start_ns)
        size = len(batch.prefills) + len(batch.decodes)
        has_prefill = bool(batch.prefills)
        ends = report.start_ns + report.durations.cumsum()
        starts = ends - report.durations
        first = self.batches
        self.batches += len(ends)
        for seq, chunk in batch.prefills:
            journey = self._journey(seq.request_id)
            if self.with_steps:
                journey.steps.append(StepSeen(report.index, report.start_ns, report.end_ns, chunk, size, True, first))
            if not seq.is_prefilling:  # the chunk completed the prompt: a token at the step's end
                journey.token_ns.append(report.end_ns)
        for seq in batch.decodes:
            journey = self._journey(seq.request_id)
            journey.token_ns.extend(int(t) for t in ends)
            if self.with_steps:
                journey.steps.extend(StepSeen(report.index + i, int(starts[i]), int(ends[i]), 0, size, has_prefill,
                                              first + i) for i in range(len(ends)))

    def pop(self, request_id: str) -> Journey:
        return self.journeys.pop(request_id, None) or Journey()
