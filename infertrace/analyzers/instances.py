"""Engine instances whose spans are not one engine's run (analyzers/sql/instance_collisions.sql).

The store tells engines apart by `service.instance.id`, and the analyses find an engine's steps by their index on
it. Two mistakes break that without an error anywhere: one id written into every replica's
OTEL_RESOURCE_ATTRIBUTES (several engines under one id: their steps interleave, and ITL stalls, culprits and
victims are found across engines), and an engine restarted under the same id (a container restarted in its pod:
its step indexes start over, and steps of both runs share an index). The signs: spans of several processes
under one id; engine_step spans that overlap in time (one engine runs one step at a time); step indexes that come
again.

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

    @property
    def several_engines(self) -> bool:
        return self.processes > 1 or self.overlapping > 0

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
        return (f"{self.instance}: its step indexes start over ({self.repeated} of its {self.step_spans} engine_step "
                "spans repeat an earlier one's, none overlapping: the engine restarted under the same id). The ITL "
                "analysis finds steps by their index on an instance, so it can mix the two runs' steps.")


def instance_problems(store: Store) -> tuple[InstanceProblem, ...]:
    """The instances whose spans are not one engine's run, as far as the store shows it."""
    return tuple(InstanceProblem(str(instance), int(processes), int(steps), int(overlapping), int(repeated))
                 for instance, processes, steps, overlapping, repeated
                 in store.sql(query_text("instance_collisions")).fetchall())
