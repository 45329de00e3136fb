"""Fit the cost model to per-request timings alone, for telemetry without engine steps (vLLM's `llm_request`
spans: each request's time in model prefill, and its first and last token).

A request's prefill time (first scheduled to first token) is the sum of its engine's steps over that span, the
ones that computed its prompt and any a chunk of it sat out; its decode time (first token to last) the sum of the
steps after its first token to its last, those that stalled it included (a prefill-first engine's prefill-only
steps). Which steps those were is not in the telemetry, but the captured requests replayed on the captured
deployment rebuild them: the scheduler decides a step's members from arrivals and lengths, and step times only
shift that a little. So: replay and record every step's shape and each request's steps
(`reference_engine.replay.StepRecorder`), fit the cost parameters so that each request's summed step times match
its measured ones (prefill and decode weighted equally, `step_fit.RunDesign`), then replay with the fit (the
membership moves with the times) and fit again, `iterations` times. The error is the last replay's, per phase:
what the fitted deployment predicts for each request against what was measured.

Sums of steps leave some parameters unconstrained: a capture whose passes are all paced by their weight reads
(short chunks of a mixture of experts) bounds the compute efficiency from below only, and where no pass is
compute-bound a step's overhead and its weight reads show only as their total. The fit is therefore a maximum a
posteriori one, toward the roofline's datasheet values (`calibration.datasheet_prior`: a Gaussian on each
parameter's log whose weight against the measured rows falls as 1/√rows, so the data decide what they constrain);
the last replay counts the passes that were compute-bound under the fit (`linear_passes`), so a variant that runs
longer ones can say it extrapolates.

vLLM's spans carry no cached-token count, so a prefix-cache hit is invisible but in the time: a request that
prefilled clearly faster than its whole prompt costs in the fitted replay (under `HIT_EVIDENCE` of it) is given the
shared prefix that explains it, its length read off its own prefill steps (the latest steps that fit in the measured
time, the boundary step's share of its chunk by its marginal cost), rounded to a quarter of its power of two and
shared with the tenant's requests of the same inferred length (the same rounding groups one system prompt's
requests). Each such prefix is also given to the tenant's latest earlier request that showed no hit and whose prompt
holds it: the request that put it in the cache (else the prefix's first hit would miss in the replay). The hits are
looked for after each fit but the last, in the replay with those found so far: a prefill-first engine batches the
prompts waiting together into one step and each one's measured prefill is that step's time, so a request's hit
shows only once its step's other members are replayed with theirs (replayed without them, the request ran in
other steps than it was measured in; 023's baseline missed TTFT p99 by 24% for one such request in the tail).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
from scipy.sparse import csr_matrix

from reference_engine.compute.calibration import datasheet_prior, fit_design
from reference_engine.compute.real_executor import MeasuredStep
from reference_engine.compute.step_fit import RunDesign
from reference_engine.engine.cost_model import CostParams, StepCostModel
from reference_engine.engine.hardware import hardware as hardware_spec
from reference_engine.engine.models import model as model_spec
from reference_engine.replay import CapturedRequest, Deployment, StepRecorder, replay

BLOCK = 16
OUTLIER_ERROR = 0.02  # a request's phase off by more (preempted, a hit not inferred) weighs linearly, not squared
HIT_EVIDENCE = 0.75  # a measured prefill under this share of the replayed one says part of the prompt was cached


@dataclass(frozen=True)
class RequestFit:
    cost: dict[str, float]  # CostParams fields
    median_error: dict[str, float]  # per phase (prefill, decode) and overall, of the last replay
    phases: int  # measured request phases (a request's prefill, its decode) fitted
    steps: int  # steps of the last replay
    prefixes: dict[str, tuple[str, int]]  # request id -> inferred shared prefix (id, tokens)
    compute_bound_passes: int = 0  # linear-layer passes of the last replay that were compute-bound under the fit
    largest_pass_tokens: int = 0  # the most tokens one linear-layer pass of the last replay carried
    compute_floor: float = 0.0  # under it the replay's most demanding pass would have been compute-bound


def _runs(recorder: StepRecorder, measured: Mapping[str, tuple[int | None, int | None]]
          ) -> tuple[csr_matrix, np.ndarray, np.ndarray]:
    """(runs × steps 0/1 matrix, measured seconds per run, phase per run): a run is every step of the request's
    engine its measured time spans (`StepRecorder.prefill_run`, `decode_run`), those it sat out included."""
    rows, cols, seconds, phases = [], [], [], []
    for rid, (prefill_ns, decode_ns) in measured.items():
        for phase, ns, members in (("prefill", prefill_ns, recorder.prefill_run(rid)),
                                   ("decode", decode_ns, recorder.decode_run(rid))):
            if not ns or ns <= 0 or not members:
                continue
            rows += [len(seconds)] * len(members)
            cols += members
            seconds.append(ns / 1e9)
            phases.append(phase)
    matrix = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(seconds), len(recorder.steps)))
    return matrix, np.asarray(seconds), np.asarray(phases)


def _errors(predicted: np.ndarray, measured: np.ndarray, phases: np.ndarray) -> dict[str, float]:
    error = np.abs(predicted - measured) / measured
    out = {p: float(np.median(error[phases == p])) for p in ("prefill", "decode") if (phases == p).any()}
    out["all"] = float(np.median(error)) if len(error) else float("nan")
    return out


def _cost_model(deployment: Deployment, cost: dict[str, float]) -> StepCostModel:
    return StepCostModel(model_spec(deployment.model), hardware_spec(deployment.hardware),
                         tensor_parallel=deployment.tensor_parallel, prefill_microbatch=deployment.prefill_microbatch,
                         params=CostParams(**cost))


def _replayed(requests: Sequence[CapturedRequest], deployment: Deployment, cost: dict[str, float],
              seed: int) -> tuple[StepRecorder, np.ndarray]:
    """The replay's steps, and each step's time under `cost`."""
    recorder = StepRecorder()
    replay(list(requests), replace(deployment, cost=cost), seed, recorder)  # type: ignore[type-var]
    model = _cost_model(deployment, cost)
    seconds = np.array([model.step_seconds(list(chunks), decodes, ctx, sampled)
                        for chunks, decodes, ctx, sampled in recorder.steps])
    return recorder, seconds


def _fit(recorder: StepRecorder, measured: Mapping[str, tuple[int | None, int | None]],
         deployment: Deployment, hits_unknown: bool) -> dict[str, float]:
    """`hits_unknown`: the replay does not know the prefix-cache hits yet, so a prefill may be faster than it."""
    runs, seconds, phases = _runs(recorder, measured)
    if len(seconds) < 20:
        raise ValueError(f"need at least 20 measured request phases to fit the cost model, got {len(seconds)}")
    spec, hw = model_spec(deployment.model), hardware_spec(deployment.hardware)
    steps = [(MeasuredStep(chunks, decodes, ctx, sampled, 0), spec, deployment.tensor_parallel)
             for chunks, decodes, ctx, sampled in recorder.steps]
    params, _ = fit_design(RunDesign(steps, runs, hw, deployment.prefill_microbatch), seconds, phases, hw,
                           phases == "prefill" if hits_unknown else None, outlier_error=OUTLIER_ERROR,
                           prior=datasheet_prior())
    return {k: v for k, v in asdict(params).items() if v is not None}


def _computed_tokens(run: list[int], own: dict[int, int], recorder: StepRecorder, seconds: np.ndarray,
                     model: StepCostModel, measured_s: float) -> float:
    """How many of the request's replayed prefill tokens its measured prefill time holds: walking back from its
    first token over the steps its prefill spans (`own`: step -> the request's place among the step's chunks), the
    latest that fit in it, and of the boundary step, if one of its own, the share of its chunk that the time left
    pays for at its marginal cost."""
    computed, elapsed = 0.0, 0.0
    for i in reversed(run):
        chunks, decodes, ctx, sampled = recorder.steps[i]
        place = own.get(i)
        if elapsed + seconds[i] <= measured_s:
            computed += chunks[place][0] if place is not None else 0
            elapsed += seconds[i]
            continue
        if place is not None:
            others = [c for k, c in enumerate(chunks) if k != place]
            without = model.step_seconds(others, decodes, ctx, max(sampled - 1, decodes))
            marginal = max(seconds[i] - without, 1e-9)
            computed += chunks[place][0] * min(max((measured_s - elapsed - without) / marginal, 0.0), 1.0)
        break
    return computed


def _inferred_prefixes(requests: Sequence[CapturedRequest], recorder: StepRecorder, seconds: np.ndarray,
                       model: StepCostModel, measured: Mapping[str, tuple[int | None, int | None]]
                       ) -> dict[str, tuple[str, int]]:
    """Request id -> (shared prefix id, tokens) for the requests whose measured prefill shows a prefix-cache hit
    (those already replayed with a prefix are not looked at again)."""
    out: dict[str, tuple[str, int]] = {}
    for r in requests:
        prefill_ns = measured.get(r.request_id, (None, None))[0]
        run = recorder.prefill_run(r.request_id)
        if not prefill_ns or not run or r.system_prompt_id or r.shared_prefix_id:
            continue
        replayed = float(seconds[run].sum())
        if prefill_ns / 1e9 >= HIT_EVIDENCE * replayed:
            continue
        own = {i: place for i, place in recorder.prefill_steps.get(r.request_id, []) if i <= run[-1]}
        total = sum(recorder.steps[i][0][place][0] for i, place in own.items())
        cached = total - _computed_tokens(run, own, recorder, seconds, model, prefill_ns / 1e9)
        if cached < BLOCK:
            continue
        quantum = _quantum(int(cached))
        tokens = min(int(round(cached / quantum) * quantum), r.input_tokens - r.assistant_prefill_tokens - 1)
        if tokens >= BLOCK:
            out[r.request_id] = (f"inferred-prefix-{r.tenant}-{tokens}", tokens)
    return out


def _quantum(tokens: int) -> int:
    """The resolution of an inferred prefix length: a quarter of its power of two (a 2048-token prefix ± 256)."""
    return max(BLOCK, 2 ** (int(math.log2(max(tokens, 1))) - 2))


def _shared(requests: Sequence[CapturedRequest], hits: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """The hits that name a prefix some other request hit too. A prefix-cache hit reuses what an earlier request
    computed, and what a capture's requests share is a tenant's system prompt: a length inferred for one request
    alone is no evidence of one (a request measured in a step the replay formed otherwise reads as its whole prompt
    cached). So a length is kept where two or more of the tenant's requests were inferred it; a request whose length
    no other shares is given the longest kept one of its tenant that its prompt holds and that is at most a quantum
    above its own (it hit that prompt, and its step read the rest faster than replayed), else no hit."""
    tenant = {r.request_id: r.tenant for r in requests}
    prompt = {r.request_id: r.input_tokens - r.assistant_prefill_tokens - 1 for r in requests}
    hit_by: dict[tuple[str, int], list[str]] = {}  # (tenant, tokens) -> the requests inferred that length
    for rid, (_, tokens) in hits.items():
        hit_by.setdefault((tenant[rid], tokens), []).append(rid)
    shared = {key: hits[rids[0]] for key, rids in hit_by.items() if len(rids) >= 2}
    out: dict[str, tuple[str, int]] = {}
    for rid, (prefix, tokens) in hits.items():
        if (tenant[rid], tokens) in shared:
            out[rid] = (prefix, tokens)
            continue
        reach = min(prompt[rid], tokens + _quantum(tokens))
        held = [n for t, n in shared if t == tenant[rid] and n <= reach]
        if held:
            out[rid] = shared[tenant[rid], max(held)]
    return out


def _with_sources(requests: Sequence[CapturedRequest], hits: dict[str, tuple[str, int]],
                  sourced: frozenset[str] = frozenset()) -> dict[str, tuple[str, int]]:
    """The inferred hits, and for each shared prefix the request that computed it: some earlier request put it in
    the cache, else the first hit of it could not have hit, but it is not in the telemetry. Taken as the tenant's
    latest earlier request that showed no hit and whose prompt holds the prefix (no system prompt, no shared prefix of
    its own); without one, the prefix's first hit stays a miss in the replay. `sourced`: prefixes whose source is
    among `hits` already."""
    out = dict(hits)
    first: dict[str, CapturedRequest] = {}
    for r in sorted((r for r in requests if r.request_id in hits), key=lambda r: (r.arrival_ns, r.request_id)):
        first.setdefault(hits[r.request_id][0], r)
    ordered = sorted(requests, key=lambda r: (r.arrival_ns, r.request_id))
    for prefix, hit in first.items():
        if prefix in sourced:
            continue
        tokens = hits[hit.request_id][1]
        source = next((r for r in reversed(ordered) if r.arrival_ns < hit.arrival_ns and r.tenant == hit.tenant
                       and r.request_id not in out and not r.system_prompt_id and not r.shared_prefix_id
                       and r.input_tokens - r.assistant_prefill_tokens - 1 >= tokens), None)
        if source is not None:
            out[source.request_id] = (prefix, tokens)
    return out


def _combined(requests: Sequence[CapturedRequest], hits: dict[str, tuple[str, int]],
              known: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """The `known` prefixes (measured, their sources included) and the inferred `hits` of the other requests, kept
    as `_shared` keeps them with the known lengths as evidence too (a lone inferred length snaps to a known one of
    its tenant within reach and shares its prefix), the kept inferred ones given their sources."""
    kept = {rid: p for rid, p in _shared(requests, {**known, **hits}).items() if rid not in known}
    return _with_sources(requests, {**known, **kept}, frozenset(p for p, _ in known.values()))


def _applied(requests: Sequence[CapturedRequest], prefixes: dict[str, tuple[str, int]]) -> list[CapturedRequest]:
    return [replace(r, shared_prefix_id=prefixes[r.request_id][0],  # type: ignore[type-var]
                    shared_prefix_tokens=prefixes[r.request_id][1]) if r.request_id in prefixes else r
            for r in requests]


def measured_prefixes(requests: Sequence[CapturedRequest], computed: Mapping[str, int]) -> dict[str, tuple[str, int]]:
    """Request id -> (shared prefix id, tokens) from how many of each request's prompt tokens its engine computed
    (`computed`: vLLM's iteration log counts each step's prompt tokens, and a prompt whose steps were its own gives
    them per request): the rest of its prompt was a prefix-cache hit, of exactly that length, shared with the
    tenant's requests that hit as much; and, for each such prefix, the request that computed it
    (`_with_sources`). No length is inferred or rounded: the log measured it."""
    hits: dict[str, tuple[str, int]] = {}
    for r in requests:
        if r.request_id not in computed or r.system_prompt_id or r.shared_prefix_id:
            continue
        cached = r.input_tokens - computed[r.request_id]
        if BLOCK <= cached <= r.input_tokens - r.assistant_prefill_tokens - 1:
            hits[r.request_id] = (f"logged-prefix-{r.tenant}-{cached}", cached)
    return _with_sources(requests, hits)


def linear_passes(recorder: StepRecorder, model: StepCostModel) -> tuple[int, int, float]:
    """(linear-layer passes that were compute-bound, the most tokens of one pass, the compute efficiency under which
    the most demanding pass would have been) over the recorded steps: where none was compute-bound, the measured
    times bound the compute efficiency from below only, by that floor (a lower one would have made that pass slower
    than measured), and a variant with longer passes (no chunking, a larger budget) depends on what the fit could
    not see."""
    m, w = model.model, model.model.bytes_per_weight
    bound = largest = 0
    ratio = 0.0  # compute time / weight-read time of the most demanding pass
    for chunks, decodes, _ctx, sampled in recorder.steps:
        tokens = decodes + sum(n for n, _ in chunks)
        for count, n, share in model._microbatches(tokens, sampled):
            largest = max(largest, n)
            compute = (2 * n * m.active_block_params + 2 * share * m.head_params) / model._flop_rate
            reads = w * (m.num_layers * m.attention_params_per_layer + m.head_params
                         + model._experts_touched(n) * m.num_layers * m.expert_params_per_layer) / model._byte_rate
            bound += count * (compute > reads)
            ratio = max(ratio, compute / reads)
    return bound, largest, model.params.compute_efficiency * ratio


def fit_request_times(requests: Sequence[CapturedRequest], deployment: Deployment,
                      measured: Mapping[str, tuple[int | None, int | None]], iterations: int = 3,
                      seed: int = 0, infer_prefixes: bool = True,
                      fitted: dict[str, float] | None = None,
                      known: Mapping[str, tuple[str, int]] | None = None,
                      resolved: Collection[str] = ()) -> RequestFit:
    """CostParams for `deployment` from each request's measured (prefill ns, decode ns) (None: not measured), and
    the shared prefixes the measured prefills show. `infer_prefixes=False` where the spans report each request's
    cached tokens (SGLang's, this project's): the requests' prefixes are then already what the engine reported, and
    a prefill measured faster than replayed is not taken for a hit it did not report. `fitted`: CostParams already
    fitted to the engine's own steps (vLLM's iteration log): kept, and only the prefixes are inferred with them (the
    errors are still the last replay's against the measured requests). `known`: prefixes measured otherwise (the
    iteration log's, `measured_prefixes`), kept; `resolved`: the requests whose hit or its absence was measured so
    (none is inferred for them). Raises ValueError when too few requests were measured."""
    cost = dict(fitted if fitted is not None else deployment.cost)
    known = dict(known or {})
    prefixes: dict[str, tuple[str, int]] = dict(known)
    hits: dict[str, tuple[str, int]] = {}  # the inferred hits (`prefixes` adds the requests that computed them)
    current = _applied(requests, prefixes)
    for iteration in range(iterations):
        if fitted is None:
            recorder, _ = _replayed(current, deployment, cost, seed)
            cost = _fit(recorder, measured, deployment, hits_unknown=infer_prefixes and iteration == 0)
        if infer_prefixes and iteration < iterations - 1:
            # the hits, from the prefills replayed under this fit with the hits inferred so far: a request batched
            # with another's prefill shares its step, so its own hit shows only once the step's other members are
            # replayed with theirs (a request replayed alone where it was measured sharing a step looks slower)
            recorder, seconds = _replayed(current, deployment, cost, seed)
            hits.update((rid, hit) for rid, hit in _inferred_prefixes(current, recorder, seconds,
                                                                       _cost_model(deployment, cost), measured).items()
                        if rid not in resolved)
            prefixes = _combined(requests, hits, known)
            current = _applied(requests, prefixes)
    recorder, seconds = _replayed(current, deployment, cost, seed)
    runs, measured_s, phases = _runs(recorder, measured)
    compute_bound, largest, floor = linear_passes(recorder, _cost_model(deployment, cost))
    return RequestFit(cost, _errors(runs @ seconds, measured_s, phases), len(measured_s), len(recorder.steps),
                      prefixes, compute_bound, largest, floor)

