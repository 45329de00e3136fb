"""Engine instances whose spans are not one engine's run, or not all of it (analyzers/sql/instance_collisions.sql).

The store tells engines apart by `service.instance.id`, and the analyses find an engine's steps by their index on
it. Two mistakes break that without an error anywhere: one id written into every replica's
OTEL_RESOURCE_ATTRIBUTES (several engines under one id: their steps interleave, and ITL stalls, culprits and
victims are found across engines), and an engine restarted under the same id (a container restarted in its pod:
its step indexes start over, and steps of both runs share an index). The signs: spans of several processes
under one id; engine_step spans that overlap in time (one engine runs one step at a time); step indexes that come
again. And the spans of one run can be incomplete: an OpenTelemetry SDK drops spans when its export queue is full
(the engine's step spans, the most numerous, first), and samplers leave traces out. One run numbers its steps
without gaps, so the step indexes that no span covers are steps the store never got: a stall in them is not seen,
and the ITL percentiles miss their tokens. Request spans are lost the same way: a request that took part in an
instance's steps and left them (later steps go on without it, and it was not preempted) has finished, and its
request span should be there.

    for problem in instance_problems(store):
        print(problem.sentence())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infertrace.analyzers import query_text

if TYPE_CHECKING:
    from infertrace.store.store import Store


@dataclass(frozen=True)
class InstanceProblem:
    instance: str
    processes: int  # distinct host.name / process.pid / vllm.process_id among its spans that carry one
    step_spans: int
    overlapping: int  # step spans that start before an earlier one of the instance ended
    repeated: int  # step spans whose first step index an earlier one had
    first_step: int | None = None  # lowest step index its spans cover
    last_step: int | None = None  # highest
    steps: int = 0  # steps its spans cover
    unseen_requests: int = 0  # requests that took part in its steps and left them, without a request span

    @property
    def several_engines(self) -> bool:
        return self.processes > 1 or self.overlapping > 0

    @property
    def mixed(self) -> bool:
        """Its spans are several engines' or several runs': the analyses read them as one run."""
        return self.several_engines or self.repeated > 0

    @property
    def missing_steps(self) -> int:
        """Steps of its one run that no span covers (0 when its spans are mixed: then no run is known)."""
        if self.mixed or self.first_step is None or self.last_step is None:
            return 0
        return self.last_step - self.first_step + 1 - self.steps

    def sentence(self) -> str:
        if self.several_engines:
            signs = []
            if self.processes > 1:
                signs.append(f"its spans come from {self.processes} processes (host.name, process.pid)")
            if self.overlapping:
                signs.append(f"{self.overlapping} of its {self.step_spans} engine_step spans overlap earlier ones, "
                             "and one engine runs one step at a time")
            return (f"{self.instance}: several engines export this service.instance.id ({'; '.join(signs)}). Their "
                    "requests, steps and ITL stalls are read as one engine's: give each engine its own id (its pod "
                    "or host name).")
        if not self.repeated:
            lost = []
            if self.missing_steps:
                expected = self.steps + self.missing_steps
                lost.append(f"no engine_step span for {self.missing_steps} of its {expected} steps "
                            f"({self.missing_steps / expected:.1%}; indexes {self.first_step} to {self.last_step}): "
                            "a stall in those steps is not seen, ITL percentiles lack their tokens, and the first "
                            "token after a gap is timed across it")
            if self.unseen_requests:
                lost.append(f"no request span for {self.unseen_requests} requests that took part in its steps and "
                            "left them, not preempted: they are in no TTFT, E2E or SLO figure, and a stall names them "
                            "without a model, tenant or prompt")
            return (f"{self.instance}: the store holds {'; and '.join(lost)}. An exporter dropped those spans (a "
                    "full export queue) or a sampler left them out.")
        return (f"{self.instance}: its step indexes start over ({self.repeated} of its {self.step_spans} engine_step "
                "spans repeat an earlier one's, none overlapping: the engine restarted under the same id). The ITL "
                "analysis finds steps by their index on an instance, so it can mix the two runs' steps.")


def instance_problems(store: Store) -> tuple[InstanceProblem, ...]:
    """The instances whose spans are not one engine's run, as far as the store shows it."""
    return tuple(InstanceProblem(str(instance), int(processes), int(spans), int(overlapping), int(repeated),
                                 first, last, int(steps), int(unseen))
                 for instance, processes, spans, overlapping, repeated, first, last, steps, unseen
                 in store.sql(query_text("instance_collisions")).fetchall())
