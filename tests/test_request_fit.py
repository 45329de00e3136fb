"""The request-level calibration (`reference_engine.compute.request_fit`): what the cost model is fitted to when the
telemetry has only each request's times (vLLM's `llm_request` spans), and the replay's reconstruction beneath it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

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
