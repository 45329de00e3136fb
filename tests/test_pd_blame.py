"""Blame along a disaggregated request's legs: the time to the first token that rose in the prefill pool is
passed on from that pool (to the pool itself when its steps slowed, to the load that filled it when it only
queued), not from the model's engines as a whole. Hand-built rows through the real blame rules."""

from __future__ import annotations

import numpy as np
import pandas as pd

from infertrace.analyzers.blame import BlameContext, blame_requests
from infertrace.analyzers.pools import Pool, pool_of
from infertrace.analyzers.topology import Edge, Node, Topology

POOLS = {"m-prefill-0": Pool("m prefill pool", "m", "prefill_worker", ("m-prefill-0",)),
         "m-decode-0": Pool("m decode pool", "m", "decode_worker", ("m-decode-0",))}


def _slow_prefill_leg() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One slow request of model m: its prefill leg took 20 s more than usual, its decode leg as usual."""
    troubled = pd.DataFrame({"req": [0], "model": ["m"], "tenant": ["t"], "reason": ["ttft"], "http_status": [200],
                             "weight": [1.0]})
    hops = pd.DataFrame({"req": [0], "kind": ["router"], "instance": ["router-0"], "outcome": ["ok"],
                         "queue_ns": [np.nan], "latency_ns": [2e6]})
    engines = pd.DataFrame({"req": [0, 0], "instance": ["m-prefill-0", "m-decode-0"],
                            "engine_ttft_ns": [20.5e9, 40e6], "failed": [False, False]})
    return troubled, hops, engines


def _blame(ctx: BlameContext) -> pd.DataFrame:
    troubled, hops, engines = _slow_prefill_leg()
    return blame_requests(troubled, hops, engines, {"router-0": 2e6}, {"router-0": 0.0},
                          {"m-prefill-0": 0.5e9, "m-decode-0": 40e6}, lambda limiter, tenant: [(limiter, 1.0)],
                          ctx).rows


def test_a_surge_that_fills_the_prefill_pool_is_blamed_on_the_load_as_queueing_at_that_pool() -> None:
    ctx = BlameContext({"m": "m engines"}, significant={}, changed={"m prefill pool"}, loads={"load: t": 40.0},
                       load_models={"load: t": {"m"}}, pool_of=POOLS)
    rows = _blame(ctx)
    assert rows[["target", "how"]].values.tolist() == [["load: t", "engine queueing at m prefill pool"]]
    assert rows["weight"].sum() == 1.0


def test_a_prefill_pool_slower_for_the_same_work_is_blamed_itself_not_the_models_engines() -> None:
    # the model's engines as a whole changed too (the prefill pool's slowdown shows in them), the decode pool not
    ctx = BlameContext({"m": "m engines"}, significant={"m prefill pool": 0.6, "m engines": 0.3},
                       changed={"m prefill pool", "m engines"}, loads={"load: t": 40.0},
                       load_models={"load: t": {"m"}}, pool_of=POOLS)
    assert _blame(ctx)[["target", "how"]].values.tolist() == [["m prefill pool", "own"]]


def test_a_model_whose_prefill_and_decode_pools_both_slowed_is_blamed_as_its_engines() -> None:
    significant = {"m prefill pool": 0.6, "m decode pool": 0.5, "m engines": 0.55}
    ctx = BlameContext({"m": "m engines"}, significant=significant, changed=set(significant), pool_of=POOLS)
    assert _blame(ctx)[["target", "how"]].values.tolist() == [["m engines", "engine queueing at m prefill pool"]]


def test_a_colocated_models_engine_time_still_goes_to_its_engines() -> None:
    ctx = BlameContext({"m": "m engines"}, significant={"m engines": 0.6}, changed={"m engines"})
    assert _blame(ctx)[["target", "how"]].values.tolist() == [["m engines", "own"]]


def test_each_disaggregated_engine_instance_maps_to_its_pool() -> None:
    nodes = (Node("decode_worker", "m-decode-0", ("m",), ("t",), 10), Node("engine", "c-0", ("c",), ("t",), 10),
             Node("prefill_worker", "m-prefill-0", ("m",), ("t",), 10))
    edges = tuple(Edge(n.models[0], n.instance, n.requests) for n in nodes)
    assert pool_of(Topology(nodes, edges)) == POOLS
