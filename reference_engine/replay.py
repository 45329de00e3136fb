"""Replay captured requests on one model's deployment: the engine side of `infertrace replay`.

The toolkit reconstructs each request from the store (arrival at the engine, prompt and output lengths,
tenant, shared system prompt, assistant prefill) and describes a deployment (the captured engine config, or a
variant of it); this module turns them into the engine's requests and a one-model fleet (a router with the
captured policy and no latency of its own in front of the replicas, or prefill and decode workers over a link),
runs it on the simulated clock, and returns what each request saw.

Each request's prompt comes as the toolkit rebuilt it, content segments (`ReplayRequest.segments`): a segment
shared by several requests is a prefix the prefix cache can share.
"""

from __future__ import annotations

import functools
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from reference_engine.engine.cost_model import CostParams
from reference_engine.engine.llm_engine import LLMEngine, StepReport
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request, Sequence
from reference_engine.fleet.config import DisaggregationSpec, FleetSpec, LinkSpec, ModelDeployment, RouterSpec
from reference_engine.fleet.fleet import Fleet
from reference_engine.fleet.gateway import Router
from reference_engine.stats import SimulationStats, weighted_percentiles
from reference_engine.telemetry.tracer import step_facts


class CapturedRequest(Protocol):
    """A request as the toolkit rebuilt it from the store (infertrace.replay.capture.ReplayRequest): its prompt
    as content segments (a segment id shared by several requests is a shared prefix), its output, and the
    attributes the engine's spans carry."""

    request_id: str
    arrival_ns: int
    tenant: str
    output_tokens: int
    max_tokens: int
    system_prompt_id: str | None
    system_prompt_tokens: int
    assistant_prefill_tokens: int
    shared_prefix_id: str | None  # a prefix shared with other requests, where no system prompt says it
    shared_prefix_tokens: int
    route_ns: int | None  # when the router took it; None: on arrival

    @property
    def segments(self) -> tuple[tuple[str, int], ...]: ...


class Deployment(Protocol):
    """A model's deployment (infertrace.replay.deployment.Deployment)."""

    model: str
    hardware: str
    tensor_parallel: int
    replicas: int
    policy: str
    max_num_batched_tokens: int
    max_num_seqs: int
    chunked_prefill: bool
    prefix_caching: bool
    prefill_microbatch: int
    num_kv_blocks: int
    router_policy: str
    prefill_replicas: int
    decode_replicas: int
    decode_hardware: str
    link_gb_s: float
    link_latency_ms: float
    cost: dict[str, float]


@dataclass
class ReplayRun:
    """What the replayed requests saw: per request (served ones), ITL over every token gap (disaggregated: the
    gap between the prefill worker's token and the decode worker's first one included, as the caller sees it) as
    distinct gaps with how many tokens had each, and the engines' KV use and preemptions."""

    ttft_ns: np.ndarray
    e2e_ns: np.ndarray
    itl_values_ns: np.ndarray
    itl_counts: np.ndarray
    output_tokens: int
    requests: int
    rejected: int  # by an engine (e.g. a prompt longer than its KV)
    preemptions: int
    first_arrival_ns: int
    last_finish_ns: int
    kv_peak: float  # highest share of KV blocks in use at a step's end, over the engines
    kv_mean: float  # mean over steps
    steps: int
    per_request: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (ttft, e2e) ns

    def itl_percentile_ns(self, q: float) -> float | None:
        """The q-th percentile (0–100) of ITL over every token, None without a token gap."""
        return self._itl_percentiles(q) if self._itl_percentiles is not None else None

    @functools.cached_property
    def _itl_percentiles(self) -> Callable[[float], float] | None:
        """The gaps sorted once for every percentile asked (a distribution asks for dozens)."""
        return weighted_percentiles(self.itl_values_ns, self.itl_counts) if len(self.itl_values_ns) else None


def _routed_ns(r: CapturedRequest) -> int:
    return r.route_ns if r.route_ns is not None else r.arrival_ns


def engine_requests(requests: list[CapturedRequest], model: str) -> list[Request]:
    """The engine's requests, arriving when the router took them (the router hands each to an engine after its
    captured routing time)."""
    out = []
    for r in sorted(requests, key=lambda r: (_routed_ns(r), r.request_id)):
        output = max(r.output_tokens, 1)
        out.append(Request(r.request_id, _routed_ns(r), Prompt(r.segments), output, max(r.max_tokens, output),
                           tenant=r.tenant, model=model, system_prompt_id=r.system_prompt_id,
                           system_prompt_tokens=r.system_prompt_tokens,
                           assistant_prefill_tokens=r.assistant_prefill_tokens))
    return out


def fleet_of(d: Deployment) -> FleetSpec:
    """A one-model fleet: a latency-free router with the captured policy before the replicas, or prefill and
    decode workers over a link."""
    engine: dict[str, Any] = {
        "tensor_parallel": d.tensor_parallel, "policy": d.policy, "max_num_batched_tokens": d.max_num_batched_tokens,
        "max_num_seqs": d.max_num_seqs, "chunked_prefill": d.chunked_prefill or d.policy == "decode_first",
        "enable_prefix_caching": d.prefix_caching, "prefill_microbatch": d.prefill_microbatch,
        "num_kv_blocks": d.num_kv_blocks, "cost": CostParams(**d.cost)}
    links: tuple[LinkSpec, ...] = ()
    disaggregation = None
    if d.prefill_replicas and d.decode_replicas:
        links = (LinkSpec("replay-link", d.link_gb_s, d.link_latency_ms),)
        # Decode workers batch each arriving request's one recomputed token with the running decodes: decode-first
        # with chunks, as a fleet file's decode workers default to.
        decode = {"policy": "decode_first", "chunked_prefill": True,
                  "max_num_batched_tokens": max(d.max_num_batched_tokens, d.max_num_seqs)}
        disaggregation = DisaggregationSpec(d.prefill_replicas, d.decode_replicas, "replay-link",
                                            d.decode_hardware or d.hardware, "replay", decode)
    model = ModelDeployment(d.model, d.replicas, d.hardware, "replay", engine, disaggregation)
    router = RouterSpec("replay-router", (d.model,), d.router_policy, latency_ms=0.0)
    return FleetSpec("replay", "replay", (model,), (), routers=(router,), links=links, timeout_s=1e9)


class _CapturedRouter(Router):
    """The router as captured: it decides when it took each request and hands it on after the time it took then
    (keyed by decision time and tenant); the choice itself follows its policy and the replayed loads."""

    def __init__(self, router: Router, latency: dict[tuple[int, str], int]) -> None:
        super().__init__(router.spec, [], 0)
        self.emitter = router.emitter
        self.latency = latency

    def route(self, t: int, tenant: str = "", waiting_since: int | None = None) -> tuple[int, int, int]:
        """(latency ns, wait ns, status): the captured time, its wait included, and 200."""
        return self.latency.get((t, tenant), 0), 0, 200


# A step's shape as the cost model reads it: (prefill chunks as (new, computed before) tokens, decodes, their
# summed context, sampled positions).
StepShape = tuple[tuple[tuple[int, int], ...], int, int, int]


class StepRecorder:
    """Every step of a replay (all engines, one numbering) and what each request's measured times cover: the steps
    that computed its prompt (with its place among the step's chunks), and, per phase, every step of its engine
    from the phase's start to its end. A request's time in prefill (first scheduled to first token) and in decode
    (first token to last) are wall-clock spans: they include the steps it sat out (a prefill-first engine's
    prefill-only steps stall its decodes; a chunk that found the budget spent waits a step), so a fit to them must
    count those steps too."""

    def __init__(self) -> None:
        self.steps: list[StepShape] = []
        self.prefill_steps: dict[str, list[tuple[int, int]]] = {}  # (step, the request's place in its chunks)
        self._engine_steps: dict[str, list[int]] = {}  # engine -> its steps, in order
        self._prefill: dict[str, tuple[str, int, int | None]] = {}  # (engine, first step, first-token step)
        self._decode: dict[str, tuple[str, int, int]] = {}  # (engine, first step after its first token, last step)

    def on_step(self, role: str, report: StepReport, engine: str = "") -> None:
        facts = step_facts(report)
        first, decodes = len(self.steps), len(facts.decode_ids)
        if facts.prefills:
            chunks = tuple((n, before) for _, n, before, _ in facts.prefills)
            self.steps.append((chunks, decodes, facts.decode_context_tokens,
                               decodes + sum(samples for *_, samples in facts.prefills)))
            for place, (rid, _, _, done) in enumerate(facts.prefills):
                if role == "decode_worker":  # its one recomputed token opens the request's decode here
                    if self._decode.get(rid, ("",))[0] != engine:
                        self._decode[rid] = (engine, first, first)
                    continue
                self.prefill_steps.setdefault(rid, []).append((first, place))
                start = self._prefill.setdefault(rid, (engine, first, None))
                if done and start[2] is None:
                    self._prefill[rid] = (engine, start[1], first)
                    self._decode.setdefault(rid, (engine, first + 1, first))
        else:
            self.steps += [((), decodes, facts.decode_context_tokens + k * decodes, decodes)
                           for k in range(len(facts.durations))]
        last = len(self.steps) - 1
        self._engine_steps.setdefault(engine, []).extend(range(first, last + 1))
        for rid in facts.decode_ids:
            engine_of, start, _ = self._decode.get(rid, (engine, first, first))
            self._decode[rid] = (engine_of, start, last)

    def _span(self, engine: str, first: int, last: int) -> list[int]:
        steps = self._engine_steps.get(engine, [])
        return steps[bisect_left(steps, first):bisect_right(steps, last)]

    def prefill_run(self, request_id: str) -> list[int]:
        """Every step of the request's engine from its first scheduling to its first token (empty: none)."""
        if (span := self._prefill.get(request_id)) is None or span[2] is None:
            return []
        return self._span(*span)  # type: ignore[arg-type]

    def decode_run(self, request_id: str) -> list[int]:
        """Every step of the engine that decoded the request after its first token, to its last token."""
        span = self._decode.get(request_id)
        return self._span(*span) if span is not None else []


class _Observer:
    """Per engine: token gaps (SimulationStats), KV use; per request: first token and finish."""

    def __init__(self, instance: str, role: str, engine: LLMEngine, run: _Collector,
                 recorder: StepRecorder | None) -> None:
        self.instance, self.role, self.engine, self.run, self.recorder = instance, role, engine, run, recorder
        self.stats = SimulationStats()
        run.stats.append(self.stats)

    def on_step(self, report: StepReport) -> None:
        self.stats.on_step(report)
        if report.kv_total_blocks:
            self.run.kv.append(report.kv_used_blocks / report.kv_total_blocks)
        if self.recorder is not None:
            self.recorder.on_step(self.role, report, self.instance)

    def on_finish(self, seq: Sequence) -> None:
        self.stats.on_finish(seq)
        run, rid = self.run, seq.request.request_id
        run.preemptions += seq.preemptions
        if seq.error is not None:
            run.rejected.add(rid)
            return
        if self.role != "decode_worker" and seq.first_token_ns is not None:
            run.first_token[rid] = seq.first_token_ns
        if self.role == "prefill_worker":
            run.handed_over[rid] = seq.first_token_ns or self.engine.now_ns
        elif self.role == "decode_worker" and seq.first_token_ns is not None and rid in run.handed_over:
            # the caller's second token: the decode worker's first, after the KV transfer
            run.transfer_gaps.append(seq.first_token_ns - run.handed_over.pop(rid))
        if self.role != "prefill_worker":
            run.finish[rid] = seq.finish_ns or self.engine.now_ns
            run.output_tokens += seq.num_output_tokens


class _Collector:
    def __init__(self) -> None:
        self.stats: list[SimulationStats] = []
        self.kv: list[float] = []
        self.first_token: dict[str, int] = {}
        self.finish: dict[str, int] = {}
        self.rejected: set[str] = set()
        self.handed_over: dict[str, int] = {}  # disaggregated: the prefill worker's first token
        self.transfer_gaps: list[int] = []
        self.preemptions = 0
        self.output_tokens = 0


def replay(requests: list[CapturedRequest], deployment: Deployment, seed: int = 0,
           recorder: StepRecorder | None = None) -> ReplayRun:
    """Serve the captured requests on the deployment; what each saw (and every step, to `recorder`)."""
    if not requests:
        raise ValueError("nothing to replay: no requests reached an engine in that window")
    spec = fleet_of(deployment)
    roles = dict(spec.engine_instances(deployment.model))
    collector = _Collector()

    def observe(instance: str, engine: LLMEngine) -> list[_Observer]:
        return [_Observer(instance, roles[instance], engine, collector, recorder)]

    engine_reqs = engine_requests(requests, deployment.model)
    arrival = {r.request_id: r.arrival_ns for r in requests}  # at the engine, as captured
    fleet = Fleet(spec, None, seed, epoch_ns=engine_reqs[0].arrival_ns, observers=observe)
    latency = {(_routed_ns(r), r.tenant): r.arrival_ns - _routed_ns(r) for r in requests}
    routers = fleet.gateway.router[deployment.model]
    fleet.gateway.router[deployment.model] = [_CapturedRouter(r, latency) for r in routers]
    fleet.run(engine_reqs)
    served = [rid for rid in arrival if rid in collector.finish and rid in collector.first_token]
    ttft = np.array([collector.first_token[rid] - arrival[rid] for rid in served], dtype=np.int64)
    e2e = np.array([collector.finish[rid] - arrival[rid] for rid in served], dtype=np.int64)
    gaps = [s.itl_counts() for s in collector.stats]
    transfer = np.asarray(collector.transfer_gaps, np.int64)
    itl_values = np.concatenate([*(values for values, _ in gaps), transfer])
    itl_counts = np.concatenate([*(counts for _, counts in gaps), np.ones(len(transfer), np.int64)])
    kv = np.asarray(collector.kv)
    return ReplayRun(
        ttft_ns=ttft, e2e_ns=e2e, itl_values_ns=itl_values, itl_counts=itl_counts,
        output_tokens=collector.output_tokens, requests=len(engine_reqs),
        rejected=len(collector.rejected), preemptions=collector.preemptions,
        first_arrival_ns=min(arrival.values()),
        last_finish_ns=max(collector.finish.values(), default=max(arrival.values())),
        kv_peak=float(kv.max()) if len(kv) else 0.0, kv_mean=float(kv.mean()) if len(kv) else 0.0,
        steps=sum(s.steps for s in collector.stats),
        per_request={rid: (int(t), int(e)) for rid, t, e in zip(served, ttft, e2e, strict=True)})
