"""Blame along a disaggregated request's legs: the time to the first token that rose in the prefill pool is
passed on from that pool (to the pool itself when its steps slowed, to the load that filled it when it only
queued), not from the model's engines as a whole. Hand-built rows through the real blame rules; the work a
tenant gives a prefill pool (its prompt tokens), and what counts as the pool failing, on a simulated fleet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from infertrace.analyzers import query_text
from infertrace.analyzers.blame import BlameContext, blame_requests
from infertrace.analyzers.pools import Pool, pool_of
from infertrace.analyzers.signals import traffic_signal, work_signal
from infertrace.analyzers.topology import Edge, Node, Topology
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from tests.fleet_traces import fleet_from_toml, simulate_fleet

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


def _prompts(rng: np.random.Generator, n: int, mean: float) -> np.ndarray:
    return rng.lognormal(np.log(mean), 0.2, n).round()


def test_a_tenant_sending_much_longer_prompts_gives_the_prefill_pool_more_work_though_not_twice_the_requests() -> None:
    # baseline 300 s: the tenant 2 requests/s of ~512 tokens, everybody else 4/s; the 200 s window: the tenant
    # 3.8/s, half of them 12k-token prompts (a long-prompt surge), everybody else as before
    rng = np.random.default_rng(0)
    mine_before, others_before = _prompts(rng, 600, 512), _prompts(rng, 1200, 512)
    mine_during = np.concatenate([_prompts(rng, 400, 512), _prompts(rng, 360, 12000)])
    others_during = _prompts(rng, 800, 512)
    calls = traffic_signal("t", len(mine_before), len(others_before), len(mine_during), len(others_during), 300, 200)
    assert calls is not None and not calls.significant and calls.factor < 2  # ×1.9 requests: not a surge by count
    work = work_signal("t's prompt tokens", mine_before, float(others_before.sum()), mine_during,
                       float(others_during.sum()), (len(others_before), len(others_during)), 300, 200, "m")
    assert work is not None and work.significant and work.factor > 10, work
    assert work.about == "m" and "prompt tokens/s" in work.phrase()


def test_prompt_work_that_rose_for_every_tenant_alike_is_not_one_tenants_load() -> None:
    rng = np.random.default_rng(1)
    mine_before, others_before = _prompts(rng, 600, 512), _prompts(rng, 1200, 512)
    mine_during, others_during = _prompts(rng, 400, 2048), _prompts(rng, 800, 2048)  # everybody's prompts ×4
    work = work_signal("t's prompt tokens", mine_before, float(others_before.sum()), mine_during,
                       float(others_during.sum()), (len(others_before), len(others_during)), 300, 200)
    assert work is not None and not work.significant and work.factor < 1.5, work


REJECTS_LONG_PROMPTS = """
[[router]]
id = "router-0"

[[link]]
id = "lan"
bandwidth_gb_s = 12.5
latency_ms = 0.5

[[model]]
name = "llama-3-8b"
hardware = "H100-SXM"
engine = { max_num_batched_tokens = 4096 }
disaggregation = { prefill_replicas = 1, decode_replicas = 1, decode_hardware = "H200", link = "lan" }

[[tenant]]
name = "acme"
rate = 4.0
prompt_mean = 3000.0
prompt_sigma = 0.4
output_mean = 20.0
system_prompt_fraction = 0.0
"""


def test_a_prompt_longer_than_the_engine_accepts_is_the_requests_error_not_a_failure_of_the_pool(
        tmp_path: Path) -> None:
    # the prefill worker prefills unchunked: a prompt whose longest context exceeds its step budget is refused
    # (vLLM answers 400: the request can never be served as made); that is not the pool failing
    simulate_fleet(fleet_from_toml(REJECTS_LONG_PROMPTS), tmp_path / "traces.jsonl", 20.0, seed=3)
    ingest_paths(tmp_path / "store", [tmp_path / "traces.jsonl"])
    with Store.open(tmp_path / "store") as store:
        legs = store.sql("SELECT trace_id, instance, error_type FROM request_legs WHERE outcome = 'error'").df()
        rows = store.sql(query_text("engine_requests")).df()
    assert len(legs) > 0 and set(legs["error_type"]) == {"prompt_too_long"}, legs
    assert set(legs["instance"]) == {"llama-3-8b-prefill-0"}
    refused = rows[rows["trace_id"].isin(legs["trace_id"])]
    assert len(refused) == len(legs) and not refused["failed"].any()
