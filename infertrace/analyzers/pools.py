"""The prefill pool and the decode pool of each disaggregated model, as root-cause candidates of their own.

A disaggregated model's engines are two pools that fail differently: a saturated prefill pool delays every
request's prefill (the prefill legs queue), a slow decode pool stretches every token after the first. Ranking
the model's engines as one candidate hides which; ranking each pool names it. A pool is the model's engines of
one role (`request_legs` role prefill or decode, seen in `request_paths` as prefill_worker / decode_worker);
the pool's own signals are its legs' (`engine_requests` reads `request_legs`): the prefill pool's TTFT is its
legs' prefill, the decode pool's TTFT its legs' queue and first decode. The KV link between them is already a
candidate (a component of kind link). Blame follows the legs (`blame.py`, `pool_of`): a request's time to its
first token rose in the prefill pool, the decode pool or both, and each part is passed on from there (to the pool
when its steps slowed for the same work; when it only queued, to the load that filled it): a tenant's surge of
long prompts is named as load, queueing at the prefill pool, not at the model's engines as a whole.

A prefill pool's work is the prompt tokens it is given, so a pool is judged saturating on its own account only
by its steps being slower for their work (`signals.step_time_signal`), never by how much it queued, and a
tenant's load on it by its prompt tokens as well as its requests (`signals.work_signal`: a surge of long prompts
may less than double a tenant's requests and still multiply the pool's work). A prompt the engine refuses as
longer than it accepts (`prompt_too_long`) is the request's error, not the pool failing (`engine_requests`).
"""

from __future__ import annotations

from dataclasses import dataclass

from infertrace.analyzers.topology import Topology

POOL_KINDS = {"prefill_worker": "prefill pool", "decode_worker": "decode pool"}


@dataclass(frozen=True)
class Pool:
    id: str  # "<model> prefill pool" or "<model> decode pool"
    model: str
    role: str  # prefill_worker or decode_worker
    instances: tuple[str, ...]


def pools(topology: Topology) -> list[Pool]:
    """Each disaggregated model's prefill and decode pools (a model with only one of them has no pools)."""
    out = []
    for model in topology.models:
        found = {kind: tuple(n.instance for n in topology.nodes if n.kind == kind and model in n.models)
                 for kind in POOL_KINDS}
        if all(found.values()):
            out += [Pool(f"{model} {name}", model, kind, found[kind]) for kind, name in POOL_KINDS.items()]
    return out


def pool_of(topology: Topology) -> dict[str, Pool]:
    """Each engine instance of a disaggregated model -> its pool."""
    return {instance: p for p in pools(topology) for instance in p.instances}
