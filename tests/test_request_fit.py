"""The request-level calibration (`reference_engine.compute.request_fit`): what the cost model is fitted to when the
telemetry has only each request's times (vLLM's `llm_request` spans), and the replay's reconstruction beneath it."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from infertrace.replay.capture import ReplayRequest
from infertrace.replay.deployment import Deployment
from reference_engine.compute.request_fit import _cost_model
from reference_engine.replay import StepRecorder, replay

MS = 1_000_000


def _requests(count: int, gap_ms: float, prompt: int, output: int) -> list[ReplayRequest]:
    rng = np.random.default_rng(0)
    return [ReplayRequest(f"r{i:03d}", int(i * gap_ms * MS), "t", int(prompt * rng.uniform(0.5, 1.5)),
                          int(output * rng.uniform(0.5, 1.5)), 1024) for i in range(count)]


def test_each_requests_recorded_runs_add_up_to_its_replayed_prefill_and_decode_times() -> None:
    """A prefill-first engine stalls every running decode for each prefill-only step: a request's time from first
    to last token (what vLLM's span measures) spans those steps, though it decodes in none of them."""
    deployment = Deployment("qwen-2.5-1.5b", policy="prefill_first", max_num_batched_tokens=16384,
                            cost={"step_overhead_s": 0.003})
    requests = _requests(40, 30.0, 1500, 60)
    recorder = StepRecorder()
    run = replay(list(requests), deployment, 0, recorder)  # type: ignore[arg-type]
    model = _cost_model(deployment, deployment.cost)
    seconds = np.array([model.step_seconds(list(c), d, ctx, s) for c, d, ctx, s in recorder.steps])
    stalled = 0
    for r in requests:
        ttft, e2e = run.per_request[r.request_id]
        decode = recorder.decode_run(r.request_id)
        stalled += sum(bool(recorder.steps[i][0]) for i in decode)  # prefill-only steps inside its decode
        assert abs(seconds[decode].sum() * 1e9 - (e2e - ttft)) <= 10 * len(decode), r.request_id
        prefill = recorder.prefill_run(r.request_id)
        # no chunks: the prompt in one step, its first token at that step's end
        assert prefill == [i for i, _ in recorder.prefill_steps[r.request_id]] and len(prefill) == 1
    assert stalled > 20  # the workload does interleave prefills with running decodes


def test_a_disaggregated_requests_decode_run_is_on_its_decode_worker() -> None:
    deployment = Deployment("qwen-2.5-1.5b", prefill_replicas=1, decode_replicas=1, cost={"step_overhead_s": 0.003})
    requests = _requests(10, 50.0, 800, 30)
    recorder = StepRecorder()
    run = replay(list(requests), deployment, 0, recorder)  # type: ignore[arg-type]
    model = _cost_model(replace(deployment), deployment.cost)
    seconds = np.array([model.step_seconds(list(c), d, ctx, s) for c, d, ctx, s in recorder.steps])
    for r in requests:
        ttft, e2e = run.per_request[r.request_id]
        decode = recorder.decode_run(r.request_id)
        assert decode and recorder.prefill_run(r.request_id)
        assert not set(decode) & set(recorder.prefill_run(r.request_id))
        # first token to last: the KV transfer, then the decode worker's steps
        assert seconds[decode].sum() * 1e9 < e2e - ttft


def test_an_inferred_prefix_is_also_given_to_the_earlier_request_that_computed_it() -> None:
    """A prefix's first hit hit because an earlier request put it in the cache: the replay must have that request
    compute it, else the hit becomes a miss (the first of every inferred group was replayed as a miss)."""
    from reference_engine.compute.request_fit import _with_sources

    requests = [ReplayRequest("a0", 0, "a", 2000, 10, 10), ReplayRequest("b0", 1, "b", 2000, 10, 10),
                ReplayRequest("a1", 2, "a", 300, 10, 10), ReplayRequest("a2", 3, "a", 2100, 10, 10),
                ReplayRequest("a3", 4, "a", 2200, 10, 10), ReplayRequest("a4", 5, "a", 2300, 10, 10)]
    hits = {"a3": ("p-a-1024", 1024), "a4": ("p-a-1024", 1024)}
    out = _with_sources(requests, hits)
    # the tenant's latest earlier request without a hit whose prompt holds the prefix (a1's is too short; b0 is
    # another tenant's)
    assert out == {**hits, "a2": ("p-a-1024", 1024)}
    assert _with_sources(requests[:1] + requests[3:4], {"a2": ("p", 1024)}) == {"a0": ("p", 1024), "a2": ("p", 1024)}
    assert _with_sources([requests[3]], {"a2": ("p", 1024)}) == {"a2": ("p", 1024)}  # no earlier request: stays


def test_an_inferred_prefix_needs_two_requests_and_a_lone_length_joins_its_tenants_shared_one() -> None:
    """A prefix-cache hit reuses what another request computed: a length inferred for one request alone (a request
    measured in a step the replay formed otherwise reads as its whole prompt cached) is not a shared prefix. Such a
    request is given its tenant's shared prefix where its prompt holds it and its own length is within the
    inference's resolution above it, else no hit."""
    from reference_engine.compute.request_fit import _shared

    requests = [ReplayRequest("a0", 0, "a", 2500, 10, 10), ReplayRequest("a1", 1, "a", 2600, 10, 10),
                ReplayRequest("a2", 2, "a", 2357, 10, 10), ReplayRequest("a3", 3, "a", 700, 10, 10),
                ReplayRequest("a4", 4, "a", 1900, 10, 10), ReplayRequest("b0", 5, "b", 2357, 10, 10)]
    hits = {"a0": ("p-a-2048", 2048), "a1": ("p-a-2048", 2048), "a2": ("p-a-2356", 2356),
            "a3": ("p-a-640", 640), "a4": ("p-a-1792", 1792), "b0": ("p-b-2356", 2356)}
    out = _shared(requests, hits)
    assert out["a0"] == out["a1"] == ("p-a-2048", 2048)
    assert out["a2"] == ("p-a-2048", 2048)  # its whole prompt, alone: the tenant's shared prefix
    assert "a3" not in out  # 640 alone, far below 2048: no evidence of a shared prefix it could have hit
    assert "a4" not in out  # its prompt (1900 tokens) cannot hold the 2048-token prefix
    assert "b0" not in out  # the only hit of its tenant
    assert _shared(requests[:2], {"a0": ("p-a-2048", 2048)}) == {}


def _measured_times(requests: list[ReplayRequest], deployment: Deployment) -> tuple[dict[str, tuple[int, int]],
                                                                                    StepRecorder]:
    """Each request's (prefill ns, decode ns) as vLLM's span reports them: its replayed steps under the
    deployment's own (hidden) cost."""
    recorder = StepRecorder()
    replay(list(requests), deployment, 0, recorder)  # type: ignore[arg-type]
    model = _cost_model(deployment, deployment.cost)
    seconds = np.array([model.step_seconds(list(c), d, ctx, s) for c, d, ctx, s in recorder.steps])
    return {r.request_id: (int(seconds[recorder.prefill_run(r.request_id)].sum() * 1e9),
                           int(seconds[recorder.decode_run(r.request_id)].sum() * 1e9)) for r in requests}, recorder


HIDDEN = {"compute_efficiency": 0.45, "memory_efficiency": 0.6, "attention_efficiency": 0.35,
          "step_overhead_s": 0.003}


@pytest.mark.slow
def test_a_capture_never_compute_bound_keeps_the_datasheets_compute_efficiency() -> None:
    """Chunks of 128 tokens of llama-3-8b are paced by the weight reads at any plausible compute efficiency: the
    requests' times bound it from below only. The fit takes the datasheet's (not whatever bound the optimiser ran
    into) and counts no compute-bound pass."""
    from reference_engine.compute.request_fit import fit_request_times
    from reference_engine.engine.cost_model import CostParams

    deployment = Deployment("llama-3-8b", policy="decode_first", chunked_prefill=True, max_num_batched_tokens=128,
                            max_num_seqs=64, cost=HIDDEN)
    requests = _requests(24, 40.0, 300, 16)
    measured, _ = _measured_times(requests, deployment)
    fit = fit_request_times(requests, replace(deployment, cost={}), measured, iterations=2)
    assert fit.compute_bound_passes == 0 and fit.largest_pass_tokens <= 128
    # what the times do say: the engine's efficiency is at least the floor under which a pass would have been slower
    assert 0 < fit.compute_floor < HIDDEN["compute_efficiency"]
    assert fit.cost["compute_efficiency"] == pytest.approx(CostParams().compute_efficiency, rel=0.01)
    assert fit.median_error["all"] < 0.02


def test_a_variant_with_longer_passes_than_any_compute_bound_one_of_the_capture_is_not_trustworthy() -> None:
    from infertrace.replay.capture import Capture, Distribution
    from infertrace.replay.compare import compute_floor_variant, variant_caveat

    ttft = np.array([10 * MS, 20 * MS])
    d = Distribution.from_arrays(ttft, np.zeros(0, np.int64), ttft * 10, 20, 10**9, None, None, 0)
    base = Deployment("mixtral-8x7b", tensor_parallel=2, policy="decode_first", chunked_prefill=True,
                      max_num_batched_tokens=512)
    capture = Capture("mixtral-8x7b", None, None, (ReplayRequest("r", 0, "t", 100, 10, 10),), base, d, {}, False,
                      "flags", linear_passes=(0, 512, 0.37))
    caveat = variant_caveat(capture, replace(base, policy="prefill_first", chunked_prefill=False,
                                             max_num_batched_tokens=16384), True)
    assert caveat is not None and caveat.startswith("not trustworthy: no step of the capture ran its linear layers "
                                                    "compute-bound (at most 512 tokens")
    assert "(≥ 0.37)" in caveat
    # the variant at the lowest compute efficiency the capture allows: the other end of what it can say
    unchunked = replace(base, policy="prefill_first", chunked_prefill=False, max_num_batched_tokens=16384,
                        cost={"compute_efficiency": 0.7, "memory_efficiency": 0.8})
    floor = compute_floor_variant(capture, unchunked)
    assert floor is not None and floor.cost == {"compute_efficiency": 0.37, "memory_efficiency": 0.8}
    assert compute_floor_variant(capture, replace(base, max_num_seqs=64)) is None
    assert variant_caveat(capture, replace(base, prefill_microbatch=256), True) is None  # passes no longer
    assert variant_caveat(capture, replace(base, max_num_seqs=64), True) is None
    # a capture with compute-bound passes constrains the compute efficiency
    assert variant_caveat(replace(capture, linear_passes=(12, 512, 0.3)), replace(base, max_num_batched_tokens=8192),
                          True) is None
    assert compute_floor_variant(replace(capture, linear_passes=(12, 512, 0.3)), unchunked) is None
    assert variant_caveat(replace(capture, linear_passes=None), replace(base, max_num_batched_tokens=8192),
                          True) is None


def _hit(recorder: StepRecorder, request_id: str) -> bool:
    """Whether the request's first prefill chunk started from cached tokens."""
    steps = recorder.prefill_steps.get(request_id, [])
    return bool(steps) and recorder.steps[steps[0][0]][0][steps[0][1]][1] > 0


@pytest.mark.slow
def test_prefix_hits_of_requests_that_shared_a_prefill_step_are_inferred() -> None:
    """Without chunks a prefill-first engine batches the prompts waiting together into one step, and each one's
    measured prefill is that step's time: a request replayed without the hits of its step's other members is
    replayed in other steps than it ran in, and its own hit does not show. The hits are inferred again on each
    fit's replay with those found so far, so these show once their partners' do."""
    from reference_engine.compute.request_fit import fit_request_times

    deployment = Deployment("qwen-2.5-1.5b", policy="prefill_first", max_num_batched_tokens=16384, cost=HIDDEN)
    rng = np.random.default_rng(3)
    requests = []
    arrivals = np.cumsum(rng.exponential(30.0, 160)) * MS
    for i in range(160):
        tenant = f"t{i % 2}"
        system = int(rng.integers(0, 3))  # two system prompts a tenant, and requests without one
        tokens = 2048 if tenant == "t0" else 1024
        requests.append(ReplayRequest(f"r{i:03d}", int(arrivals[i]), tenant, tokens * (system > 0)
                                      + int(rng.integers(300, 3000)), int(rng.integers(20, 80)), 1024,
                                      f"sys-{tenant}-{system}" if system else None, tokens if system else 0))
    measured, recorder = _measured_times(requests, deployment)
    hits = {r.request_id for r in requests if _hit(recorder, r.request_id)}
    shared = {r.request_id for r in requests if r.request_id in hits
              and len(recorder.steps[recorder.prefill_steps[r.request_id][0][0]][0]) > 1}
    assert len(shared) >= 20  # the workload does batch prompts that hit with others
    blind = [replace(r, system_prompt_id=None, system_prompt_tokens=0) for r in requests]
    fit = fit_request_times(blind, replace(deployment, cost={}), measured)
    inferred = {rid for rid in fit.prefixes if rid in hits}
    assert len(inferred & shared) >= 0.9 * len(shared), (len(inferred & shared), len(shared))
    # every inferred prefix is one that two or more requests were inferred (a hit reuses what another computed); a
    # hit whose step the replay formed otherwise, so that no other request shows its length, goes without (here 88
    # of 106 hits are inferred and 17 requests without one are given one; 102 and 30 when any length was kept)
    groups = Counter(prefix for prefix, _ in fit.prefixes.values())
    assert groups and min(groups.values()) >= 2
    assert len(inferred) >= 0.8 * len(hits)
    assert len(set(fit.prefixes) - hits) <= 0.2 * len(fit.prefixes)
