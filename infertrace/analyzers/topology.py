"""The fleet's topology as the traces show it: which models and tenants pass through which component
instances (auth, rate limiter, router, global queue, KV link, or whatever a gateway's spans show) and which
engines serve each model. Read from the spans alone (`sql/request_paths.sql`): components are found in the
trace tree, whatever their spans are called; a `--components` file (infertrace.sources.components) may name
their kinds. A component that served no request in the period does not appear.

    topology = read_topology(store)
    topology.node("router-0").models      # ('llama-3-8b', 'qwen-2.5-1.5b')
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from infertrace.analyzers import query_text
from infertrace.sources.components import name_components, registered
from infertrace.store.store import Store

ENGINE_KINDS = ("engine", "prefill_worker", "decode_worker")
# Shared gateway components, as opposed to a model's own data path (its engines and KV links); `component` is a
# component found in a gateway's traces whose kind nothing named.
SHARED_KINDS = ("auth", "rate_limiter", "router", "scheduler", "gateway", "component")


@dataclass(frozen=True)
class Node:
    """One serving instance and what passed through it."""

    kind: str  # auth, rate_limiter, router, scheduler, link, engine, prefill_worker, decode_worker, component
    instance: str
    models: tuple[str, ...]
    tenants: tuple[str, ...]
    requests: int
    names: tuple[str, ...] = ()  # service and operation of its spans, e.g. "router /v1/route"


@dataclass(frozen=True)
class Edge:
    """Requests of one model that passed through one instance."""

    model: str
    instance: str
    requests: int


@dataclass(frozen=True)
class Topology:
    nodes: tuple[Node, ...]  # by kind, then instance
    edges: tuple[Edge, ...]

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({e.model for e in self.edges}))

    def node(self, instance: str) -> Node:
        for n in self.nodes:
            if n.instance == instance:
                return n
        raise KeyError(f"no instance {instance!r} in the traces")

    def engines(self, model: str) -> tuple[str, ...]:
        """Engine instances (including prefill and decode workers) that served the model."""
        return tuple(n.instance for n in self.nodes if n.kind in ENGINE_KINDS and model in n.models)

    def components(self) -> tuple[Node, ...]:
        """Every instance that is not an engine: gateway components and links."""
        return tuple(n for n in self.nodes if n.kind not in ENGINE_KINDS)

    def sentences(self) -> list[str]:
        return [f"{n.instance} ({n.kind}) serves {', '.join(n.models)} for {len(n.tenants)} tenant(s), "
                f"{n.requests} requests" for n in self.nodes]

    @property
    def has_components(self) -> bool:
        """Whether any gateway component (not an engine, not a KV link) is in the traces."""
        return any(n.kind not in (*ENGINE_KINDS, "link") for n in self.nodes)


def load_paths(store: Store) -> pd.DataFrame:
    """The `request_paths` rows, one per (request trace, instance it passed through), with each component's kind
    settled by the store connection's `--components` rules (`infertrace.sources.components.register`)."""
    return name_components(store.sql(query_text("request_paths")).df(), registered(store))


def topology_from_paths(paths: pd.DataFrame) -> Topology:
    if paths.empty:
        return Topology((), ())
    known = paths.dropna(subset=["instance"])
    nodes = []
    for (kind, instance), part in known.groupby(["kind", "instance"], sort=True):
        operations = part[["service", "operation"]].dropna().drop_duplicates()
        names = tuple(sorted({f"{service} {op}" for service, op in zip(operations["service"], operations["operation"],
                                                                       strict=True)}))
        nodes.append(Node(str(kind), str(instance), tuple(sorted(part["model"].dropna().unique())),
                          tuple(sorted(part["tenant"].dropna().unique())), int(part["trace_id"].nunique()), names))
    counts = known.dropna(subset=["model"]).groupby(["model", "instance"], sort=True)["trace_id"].nunique()
    edges = tuple(Edge(str(m), str(i), int(n)) for (m, i), n in counts.items())
    return Topology(tuple(nodes), edges)


def read_topology(store: Store) -> Topology:
    """Which models and tenants pass through which instances, from the spans in the store."""
    return topology_from_paths(load_paths(store))
