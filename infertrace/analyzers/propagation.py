"""A gateway that does not pass its trace context on to the engines (analyzers/sql/trace_propagation.sql).

The store joins a request's gateway spans and engine spans by their trace. A gateway or proxy that does not
propagate the W3C `traceparent` header (an HTTP client without OpenTelemetry's instrumentation, a proxy that
drops the header, an engine started without trace extraction) makes every request two traces: the gateway's,
answered but with no engine in it, and the engine's, with no gateway in it. Nothing fails. But incident detection
then counts each request twice (once at the gateway, without a first token, once at its engine), the SLO summary
and the TTFT decomposition time it from the engine alone (no gateway time in it), and root-cause ranking cannot
follow it from the gateway's components to its engine.

The signs, both needed: answered gateway requests with no engine span in their trace, and, for the same models,
engine requests with no gateway span in theirs. One side alone is something else: a model the gateway sends to an
API that exports no spans, or engines that clients call directly. (A gateway that names the model by an alias the
engines do not use is matched only through its entries that name no model.)

    for finding in propagation_breaks(store):
        print(finding.sentence())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infertrace.analyzers import materialize_once, query_text

if TYPE_CHECKING:
    from infertrace.store.store import Store

MIN_REQUESTS = 10  # on each side, before a model's two halves are taken for one request stream
MIN_SHARE = 0.5  # of an engine's requests without a gateway span, and of the gateway's without an engine


@dataclass(frozen=True)
class PropagationBreak:
    """A model whose requests reach its engines in traces of their own, apart from the gateway's."""

    model: str
    instances: tuple[str, ...]  # its engines whose requests come without the gateway's trace
    gateway_alone: int  # answered gateway requests for the model with no engine span in their trace
    gateway_requests: int
    engine_alone: int  # requests of those engines with no gateway entry span in their trace
    engine_requests: int

    def sentence(self) -> str:
        engines = ", ".join(self.instances)
        return (f"{self.model}: {self.gateway_alone} of the gateway's {self.gateway_requests} answered requests have "
                f"no engine span in their trace, and {self.engine_alone} of the {self.engine_requests} requests of "
                f"{engines} no gateway span in theirs: the trace context (traceparent) is not passed on from the "
                "gateway to these engines. Incident detection counts each such request twice (at the gateway and "
                "at its engine), the SLO summary and the TTFT decomposition time it from the engine alone, and "
                "root-cause ranking cannot follow it from the gateway's components to its engine.")


def propagation_breaks(store: Store) -> tuple[PropagationBreak, ...]:
    """The models whose gateway requests and engine requests are in traces apart, as far as the store shows."""
    materialize_once(store, ("requests", "component_calls"))  # each is read twice
    gateway: dict[str | None, tuple[int, int]] = {}
    engines: dict[str, list[tuple[str, int, int]]] = {}
    for side, model, instance, alone, requests in store.sql(query_text("trace_propagation")).fetchall():
        if side == "gateway":
            gateway[model] = (int(alone), int(requests))
        elif model is not None and instance is not None:
            engines.setdefault(str(model), []).append((str(instance), int(alone), int(requests)))
    unnamed = gateway.get(None, (0, 0))  # entries that name no model: they may be any model's
    found = []
    for model, rows in sorted(engines.items()):
        broken = [(i, alone, n) for i, alone, n in rows if alone >= MIN_REQUESTS and alone >= MIN_SHARE * n]
        if not broken:
            continue
        alone, requests = gateway.get(model, (0, 0))
        alone, requests = alone + unnamed[0], requests + unnamed[1]
        if alone < MIN_REQUESTS or alone < MIN_SHARE * requests:
            continue
        found.append(PropagationBreak(model, tuple(i for i, _, _ in broken), alone, requests,
                                      sum(a for _, a, _ in broken), sum(n for _, _, n in broken)))
    return tuple(found)
