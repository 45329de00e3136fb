"""A captured window of one model's traffic, read back from the store: the requests as a replay needs them, the
deployment they ran on (from the engines' resources), what they saw (TTFT, ITL, E2E, KV use), and what a
replay leaves out (requests the gateway answered without an engine).

Prefix sharing: a request naming a system prompt shares it with every other request naming it. A tenant whose
requests name system prompts but never hit the prefix cache on them while the engines had prefix caching on
(e.g. a timestamp before the system prompt) is replayed without that sharing. A request that reports cached
tokens but no system prompt (a source without the attribute) is given a prefix of its cached length shared with
the tenant's requests that report the same length: an approximation, said in the notes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from itertools import pairwise
from typing import Any

import numpy as np

from infertrace.replay.deployment import Deployment
from infertrace.store.store import Store

_ALL_TIME = (-(1 << 62), 1 << 62)
QUANTILES = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999)


def query_text(name: str) -> str:
    """The text of `infertrace/replay/sql/<name>.sql`."""
    return resources.files("infertrace.replay").joinpath("sql", f"{name}.sql").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """One request as the replay sends it (`reference_engine.replay.CapturedRequest`)."""

    request_id: str
    arrival_ns: int
    tenant: str
    input_tokens: int
    output_tokens: int
    max_tokens: int
    system_prompt_id: str | None = None
    system_prompt_tokens: int = 0
    shared_prefix_id: str | None = None
    shared_prefix_tokens: int = 0
    assistant_prefill_tokens: int = 0
    route_ns: int | None = None  # when the router took it (≤ arrival_ns); None: routed on arrival

    @property
    def segments(self) -> tuple[tuple[str, int], ...]:
        """The prompt as content segments: the system prompt (shared by every request naming it, so the prefix
        cache sees the captured sharing), the shared prefix (for sources that report cached tokens but no system
        prompt), the request's own text, and its assistant prefill."""
        segments = [(sid, n) for sid, n in ((self.system_prompt_id, self.system_prompt_tokens),
                                             (self.shared_prefix_id, self.shared_prefix_tokens)) if sid and n]
        own = self.input_tokens - sum(n for _, n in segments) - self.assistant_prefill_tokens
        segments.append((f"user-{self.request_id}", max(own, 1)))
        if self.assistant_prefill_tokens:
            segments.append((f"assistant-{self.request_id}", self.assistant_prefill_tokens))
        return tuple(segments)


@dataclass(frozen=True)
class Distribution:
    """What a set of requests saw: p50/p99 TTFT, ITL and E2E (ms), throughput, KV use, preemptions."""

    requests: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    output_tokens_per_s: float | None
    kv_peak: float | None  # share of KV blocks in use, highest at a step's end
    kv_mean: float | None
    preemptions: int | None
    rejected: int  # by an engine
    # TTFT, ITL and E2E (ms) at QUANTILES, for plotting the distributions side by side
    quantiles_ms: dict[str, tuple[float, ...]] = field(default_factory=dict)

    @staticmethod
    def from_arrays(ttft_ns: np.ndarray, itl_ns: np.ndarray | Percentile, e2e_ns: np.ndarray, output_tokens: int,
                    span_ns: int, kv: tuple[float, float] | None, preemptions: int | None,
                    rejected: int) -> Distribution:
        """`itl_ns`: every token's ITL, or its percentile function (a replay's gaps weighted by the tokens that had
        them); `kv`: (mean, peak) share of KV blocks in use, None when unknown."""
        at = {"ttft": _percentile(ttft_ns), "itl": itl_ns if callable(itl_ns) else _percentile(itl_ns),
              "e2e": _percentile(e2e_ns)}

        def ms(name: str, q: float) -> float | None:
            ns = at[name](q)
            return None if ns is None else ns / 1e6

        return Distribution(
            requests=len(ttft_ns) + rejected, ttft_p50_ms=ms("ttft", 50), ttft_p99_ms=ms("ttft", 99),
            itl_p50_ms=ms("itl", 50), itl_p99_ms=ms("itl", 99), e2e_p50_ms=ms("e2e", 50), e2e_p99_ms=ms("e2e", 99),
            output_tokens_per_s=output_tokens / (span_ns / 1e9) if span_ns > 0 else None,
            kv_peak=kv[1] if kv is not None else None, kv_mean=kv[0] if kv is not None else None,
            preemptions=preemptions, rejected=rejected,
            quantiles_ms={name: tuple(ms(name, q * 100) or 0.0 for q in QUANTILES)
                          for name in at if at[name](50) is not None})


# The q-th percentile (0–100, numpy's linear method) of a latency in ns; None when there is no value.
Percentile = Callable[[float], float | None]


def _percentile(values: np.ndarray) -> Percentile:
    """`np.percentile(values, q)`, the values sorted once: a distribution asks for dozens of quantiles, and numpy's
    selection is several times cheaper on sorted values (the order statistics, and so the result, are the same)."""
    if not len(values):
        return lambda q: None
    ordered = np.sort(values)
    return lambda q: float(np.percentile(ordered, q))


@dataclass(frozen=True)
class Capture:
    model: str
    since_ns: int | None
    until_ns: int | None
    requests: tuple[ReplayRequest, ...]
    deployment: Deployment
    observed: Distribution
    unserved: dict[int, int]  # HTTP status -> requests the gateway answered without an engine
    has_step_spans: bool
    config_source: str  # "spans" (the engines' resources) or "flags"
    notes: tuple[str, ...] = field(default_factory=tuple)
    # from a calibration to request timings: (linear-layer passes that were compute-bound under the fit, the most
    # tokens one pass carried, the compute efficiency under which the most demanding pass would have been) over the
    # capture's replayed steps; None: not calibrated that way
    linear_passes: tuple[int, int, float] | None = None
    cached_tokens_reported: bool = False  # the spans give requests' cached-token counts (not vLLM's)


def router_policy(routes: list[tuple[int, str, str | None]], replicas: int) -> str:
    """The router's policy as its choices show it (routes: (time, target, system prompt id) in routing order):
    `prefix_aware` when requests naming a system prompt almost always go to one replica per prompt,
    `round_robin` when consecutive choices almost always advance by one replica, else `least_loaded`."""
    if replicas < 2 or len(routes) < 10:
        return "least_loaded"
    by_prompt: dict[str, dict[str, int]] = {}
    for _, target, prompt in routes:
        if prompt:
            counts = by_prompt.setdefault(prompt, {})
            counts[target] = counts.get(target, 0) + 1
    named = sum(sum(c.values()) for c in by_prompt.values())
    if named >= 10 and sum(max(c.values()) for c in by_prompt.values()) >= 0.9 * named and len(by_prompt) > 1:
        return "prefix_aware"
    order = sorted({t for _, t, _ in routes})
    index = [order.index(t) for _, t, _ in routes]
    advances = sum((b - a) % len(order) == 1 for a, b in pairwise(index))
    if advances >= 0.9 * (len(index) - 1):
        return "round_robin"
    return "least_loaded"


def _deployment(model: str, engines: list[dict[str, Any]], overrides: dict[str, Any],
                notes: list[str], routes: list[tuple[int, str, str | None]]) -> tuple[Deployment, str]:
    """The captured deployment, from the engines' resource attributes where they carry it; `overrides` (flags)
    fill in what they do not say, or replace it."""
    values: dict[str, Any] = {"model": model}
    serving = [e for e in engines if e["role"] != "decode_worker"]
    decoders = [e for e in engines if e["role"] == "decode_worker"]
    source = "flags"
    first = serving[0] if serving else None
    if first is not None and first["policy"] is not None:
        source = "spans"
        keys = ("hardware", "tensor_parallel", "policy", "max_num_batched_tokens", "max_num_seqs", "chunked_prefill",
                "prefix_caching", "prefill_microbatch")
        values.update({k: first[k] for k in keys if first[k] is not None})
        differing = [k for k in keys if len({e[k] for e in serving}) > 1]
        if differing:
            notes.append(f"the engines of {model} differ in {', '.join(differing)}: the replay uses "
                         f"{first['instance']}'s settings for all of them")
        blocks = [e["kv_total_blocks"] for e in serving if e["kv_total_blocks"]]
        if blocks:
            values["num_kv_blocks"] = int(min(blocks))
    if decoders:
        values.update(prefill_replicas=len(serving), decode_replicas=len(decoders),
                      decode_hardware=decoders[0]["hardware"] or values.get("hardware", ""))
        notes.append("disaggregated capture: the KV link is replayed at "
                     f"{overrides.get('link_gb_s', 12.5)} GB/s and {overrides.get('link_latency_ms', 1.0)} ms "
                     "(link_gb_s, link_latency_ms) unless set")
    elif serving:
        values["replicas"] = len(serving)
    values.update(overrides)
    if "router_policy" not in overrides and routes:
        values["router_policy"] = router_policy(routes, len(serving))
    if source == "flags":
        notes.append(f"the spans of {model} carry no engine configuration: the replay's baseline is the flags' "
                     "(and the defaults')")
    return Deployment(**values), source


# What "the engine's clock" is for each source whose request span is an API server's (capture_requests.sql).
_CORE_NOTES = {
    "vllm-v1": "TTFT and E2E as vLLM's engine core measured them (time_in_queue + time_in_model_prefill, "
               "+ time_in_model_inference), each request reaching the engine after the API server's own latency (its "
               "span's TTFT less the core's; the replay does not model the API server)",
    "sglang": "TTFT and E2E as SGLang's scheduler saw them (from its thread span's start to the end of the "
              "request's first prefill_forward, and to the thread span's end), each request reaching the engine "
              "after the tokenizer's own latency (tokenize and dispatch, and the detokenized first token after; the "
              "replay does not model the tokenizer)",
    "tgi": "TTFT and E2E as TGI's batching task saw them (from the queue append to the first token sent and to the "
           "end of its schedule span), each request reaching the engine after the HTTP handler's own latency "
           "(validation and tokenisation; the replay does not model the router's handler)",
}


def read_capture(store: Store, model: str, since_ns: int | None = None, until_ns: int | None = None,
                 overrides: dict[str, Any] | None = None) -> Capture:
    """The window's traffic of `model` and what it saw. Raises ValueError when the window holds none."""
    params = {"model": model, "since_ns": since_ns if since_ns is not None else _ALL_TIME[0],
              "until_ns": until_ns if until_ns is not None else _ALL_TIME[1]}
    rows = store.sql(query_text("capture_requests"), params).fetchall()
    if not rows:
        known = [r[0] for r in store.sql("SELECT DISTINCT model FROM requests WHERE model IS NOT NULL "
                                         "ORDER BY 1").fetchall()]
        raise ValueError(f"no request of {model!r} reached an engine in that window; models in the store: "
                         f"{', '.join(known) or 'none'}")
    columns = ("request_id", "tenant", "arrival_ns", "input_tokens", "output_tokens", "max_tokens", "cached_tokens",
               "system_prompt_id", "system_prompt_tokens", "assistant_prefill_tokens", "engine_error", "ttft_ns",
               "e2e_ns", "preemptions", "timing_source", "instances", "route_ns", "core_ttft_ns", "core_e2e_ns",
               "source")
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    unsized = [r for r in records if r["input_tokens"] is None and r["engine_error"] is None]
    if unsized:
        sources = ", ".join(sorted({str(r["source"]) for r in unsized}))
        raise ValueError(f"{len(unsized)} of the {len(records)} requests of {model!r} in that window have no prompt "
                         f"length in their spans (source: {sources}; TGI's spans carry none, it sends token counts in "
                         "response headers): a replay cannot rebuild their prefills. It needs "
                         "gen_ai.usage.input_tokens (or .prompt_tokens) on the engine's request span or on a "
                         "gateway's span in the same trace (LiteLLM's proxy records the engine's usage there)")
    engine_rows = store.sql(query_text("capture_engines"), {"model": model}).fetchall()
    engine_cols = ("instance", "role", "hardware", "tensor_parallel", "policy", "max_num_batched_tokens",
                   "max_num_seqs", "chunked_prefill", "prefix_caching", "prefill_microbatch", "block_size",
                   "executor", "kv_total_blocks", "step_spans")
    engines = [dict(zip(engine_cols, row, strict=True)) for row in engine_rows]
    notes: list[str] = []
    routes = store.sql(query_text("capture_routes"), params).fetchall()
    deployment, source = _deployment(model, engines, dict(overrides or {}), notes, routes)
    block = next((e["block_size"] for e in engines if e["block_size"]), 16)
    served = [r for r in records if r["engine_error"] is None and r["ttft_ns"] is not None]
    core = bool(served) and all(r["core_ttft_ns"] is not None and r["core_e2e_ns"] is not None for r in served)
    if core:  # a replay serves requests on the engine's clock: compare it with the engine core's view
        notes += [_CORE_NOTES[source] for source in sorted({r["source"] for r in served})]
        for r in served:
            r["arrival_ns"] += max(r["ttft_ns"] - r["core_ttft_ns"], 0)
    requests = _requests(records, deployment, block, notes)

    ttft = np.array([r["core_ttft_ns" if core else "ttft_ns"] for r in served], dtype=np.int64)
    e2e = np.array([r["core_e2e_ns" if core else "e2e_ns"] for r in served], dtype=np.int64)
    itl = store.sql(query_text("capture_itl"), params).fetchnumpy()["itl_ns"].astype(np.int64)
    has_steps = any(e["step_spans"] for e in engines)
    if not has_steps:
        notes.append("no engine step spans: the captured KV use cannot be compared with the replay's" if len(itl) else
                     "no engine step spans and no per-token times: the captured ITL and KV use cannot be compared "
                     "with the replay's")
    first = min(r["arrival_ns"] for r in records)
    last = max(r["arrival_ns"] + (r["e2e_ns"] or 0) for r in records)
    kv_params = {**params, "since_ns": first, "until_ns": last + 1}
    kv = np.ma.filled(np.ma.asarray(store.sql(query_text("capture_kv"), kv_params).fetchnumpy()["used_fraction"],
                                    dtype=np.float64), np.nan)
    output = sum(r["output_tokens"] or 0 for r in served)
    kv_use = (float(kv.mean()), float(kv.max())) if has_steps and len(kv) else None
    observed = Distribution.from_arrays(ttft, itl, e2e, output, last - first, kv_use,
                                        int(sum(r["preemptions"] for r in records)),
                                        sum(r["engine_error"] is not None for r in records))
    unserved = {int(s or 0): int(n) for s, n in store.sql(query_text("capture_unserved"), params).fetchall()}
    if unserved:
        notes.append(f"{sum(unserved.values())} requests for {model} never reached an engine "
                     f"({', '.join(f'{n}× {s}' for s, n in sorted(unserved.items()))}): not replayed, their outcome "
                     "does not depend on the engines")
    return Capture(model, since_ns, until_ns, tuple(requests), deployment, observed, unserved, has_steps, source,
                   tuple(notes), cached_tokens_reported=any(r["cached_tokens"] is not None for r in records))


def _requests(records: list[dict[str, Any]], deployment: Deployment, block: int,
              notes: list[str]) -> list[ReplayRequest]:
    # Tenants whose system prompts never hit the cache though a block of them was cached before: no sharing.
    seen: set[str] = set()
    eligible: dict[str, int] = {}
    hits: dict[str, int] = {}
    for r in records:
        sp = r["system_prompt_id"]
        if sp and (r["system_prompt_tokens"] or 0) >= block:
            if sp in seen:
                eligible[r["tenant"]] = eligible.get(r["tenant"], 0) + 1
                hits[r["tenant"]] = hits.get(r["tenant"], 0) + ((r["cached_tokens"] or 0) >= block)
            seen.add(sp)
    unshared = {t for t, n in eligible.items()
                if deployment.prefix_caching and n >= 5 and hits.get(t, 0) <= 0.02 * n}
    if unshared:
        notes.append(f"tenant(s) {', '.join(sorted(unshared))} named shared system prompts but never hit the prefix "
                     "cache on them (a prefix that changes per request): replayed without that sharing")
    guessed = 0
    out = []
    for r in records:
        input_tokens = int(r["input_tokens"] or 1)
        sp, sp_tokens = r["system_prompt_id"], int(r["system_prompt_tokens"] or 0)
        if sp and r["tenant"] in unshared:
            sp = f"{sp}@{r['request_id']}"
        shared_id, shared_tokens = None, 0
        cached = int(r["cached_tokens"] or 0)
        if not sp and cached >= block:
            shared_tokens = min(cached, input_tokens - 1)
            shared_id = f"prefix-{r['tenant']}-{shared_tokens}"
            guessed += 1
        ap = int(r["assistant_prefill_tokens"] or 0)
        if sp_tokens + shared_tokens + ap >= input_tokens:  # inconsistent attributes: keep the prompt length
            sp, sp_tokens, ap = None, 0, 0
        output = int(r["output_tokens"] or 1)
        route = r["route_ns"] if r["route_ns"] is not None and r["route_ns"] <= r["arrival_ns"] else None
        out.append(ReplayRequest(r["request_id"], int(r["arrival_ns"]), r["tenant"] or "default", input_tokens,
                                 max(output, 1), int(r["max_tokens"] or output), sp, sp_tokens, shared_id,
                                 shared_tokens, ap, route))
    if guessed:
        notes.append(f"{guessed} requests reported cached tokens but no system prompt: each shares a prefix of its "
                     "cached length with the tenant's requests of the same cached length (an approximation)")
    return out


# A measured step: (prefill chunks as (new, cached) tokens, decodes, their summed context, sampled positions, ns).
MeasuredStep = tuple[tuple[tuple[int, int], ...], int, int, int, int]


def measured_steps(store: Store, model: str, since_ns: int | None = None, until_ns: int | None = None,
                   limit: int = 20_000) -> list[MeasuredStep]:
    """The model's engine steps as measured (its step spans; prefill and decode workers alike but decode workers,
    whose single recomputed token is no prefill), at most `limit`, spread evenly over the window."""
    params = {"model": model, "since_ns": since_ns if since_ns is not None else _ALL_TIME[0],
              "until_ns": until_ns if until_ns is not None else _ALL_TIME[1]}
    steps: list[MeasuredStep] = []
    for _, _, chunks, cached, samples, decodes, ctx, durations, pause in store.sql(
            query_text("capture_steps"), params).fetchall():
        last = len(durations) - 1
        if chunks:
            if not pause:
                sampled = decodes + sum(bool(s) for s in samples)
                steps.append((tuple(zip(chunks, cached, strict=True)), decodes, ctx, sampled, int(durations[0])))
            continue
        for k, ns in enumerate(durations):
            if k == last and pause:
                continue
            steps.append(((), decodes, ctx + k * decodes, decodes, int(ns)))
    if len(steps) > limit:
        steps = [steps[i] for i in np.linspace(0, len(steps) - 1, limit).astype(int)]
    return steps


@dataclass(frozen=True)
class LoggedSteps:
    """What vLLM's iteration logs of a model's engines measured (`measured_iterations`)."""

    steps: list[MeasuredStep]
    unplaced: int  # logs not placed on the spans' clock: of the model's engines, or named after no engine
    # request id -> the prompt tokens its engine computed, for the requests whose every prefill step the log
    # attributes to them alone (a step of one context request) and whose first token ended one of them
    computed: dict[str, int] = field(default_factory=dict)


def measured_iterations(store: Store, model: str, since_ns: int | None = None, until_ns: int | None = None,
                        limit: int = 20_000) -> LoggedSteps:
    """The model's engine steps as vLLM's iteration log measured them (`--enable-logging-iteration-details`: one
    line per step), at most `limit` spread evenly over the window; how many logs of the model's engines could not
    be placed on the spans' clock; and the prompt tokens each request's steps computed where the log tells them
    apart. A line counts a step's context (prefill) requests and tokens and its generation requests, and times the
    step without the scheduler's own time: each log is placed on the spans' clock (`itl_iterations.place_logs`,
    which also reads that scheduler time, added back), and what the line does not say is estimated from the request
    spans at the step's end: the summed context of its decodes (each decoding request's prompt and the tokens it had
    by then, its output spread evenly from its first token to its finish, times the line's count), and, for a step
    of one context request, whose prompt it computed (the request whose prefill holds the step, first token nearest
    its end) and what that prompt had before (its earlier chunks, and its prefix-cache hit where the log tells its
    request apart: its prompt less every token its steps computed). Several context requests share the tokens
    evenly, nothing before. Steps ending outside [since, until) are left out."""
    from infertrace.analyzers.itl_iterations import place_logs

    iterations = store.sql("SELECT * FROM iteration_log").df()
    if iterations.empty:
        return LoggedSteps([], 0)
    requests = store.sql(query_text("capture_iteration_requests")).df()
    instances = set(requests.loc[requests["model"] == model, "instance"].astype(str))
    placed, placements, _ = place_logs(iterations, requests)
    unplaced = sum(1 for p in placements if p.offset_ns is None and (p.instance is None or p.instance in instances))
    lo, hi = (since_ns if since_ns is not None else _ALL_TIME[0]), (until_ns if until_ns is not None else _ALL_TIME[1])
    tol, edge = 3_000_000, 1_000_000  # a placed end's tolerance; the spans' first tokens are late by the API server
    steps: list[MeasuredStep] = []
    computed: dict[str, int] = {}  # tokens of a request's prompt the log's steps computed
    shared: set[str] = set()  # requests with a prompt step of several context requests: theirs are not known
    completed: set[str] = set()  # requests whose first token ended a step with context tokens
    owner: dict[str, str] = {}  # the log whose steps computed a request's prompt
    lone: list[tuple[int, str]] = []  # (index in `steps`, request) of the steps of one context request
    prompts: dict[str, int] = {}
    for log in placed:
        if log.placement.instance not in instances:
            continue
        r = log.requests
        first = r["first_token_ns"].to_numpy(dtype=np.int64)
        finish = r["finish_ns"].fillna(r["first_token_ns"]).to_numpy(dtype=np.int64)
        sched = r["scheduled_ns"].fillna(r["first_token_ns"]).to_numpy(dtype=np.int64)
        prompt = r["input_tokens"].fillna(1).to_numpy(dtype=np.float64)
        output = r["output_tokens"].fillna(1).clip(lower=1).to_numpy(dtype=np.float64)
        typical = float(np.mean(prompt + output / 2)) if len(r) else 0.0
        ids = r["request_id"].astype(str).to_numpy()
        prompts.update(zip(ids.tolist(), prompt.astype(np.int64).tolist(), strict=True))
        overhead = round(log.overhead_ns)
        for i, row in enumerate(log.log.itertuples(index=False)):
            if row.dummy or not (row.context_tokens or row.generation_requests):
                continue
            end = int(log.ends[i])
            wall = int(row.elapsed_ns) + overhead
            decodes = int(row.generation_requests)
            ctx = 0
            if decodes:
                decoding = (first < end - edge) & (finish >= end - edge)
                if decoding.any():
                    share = np.clip((end - first[decoding]) / np.maximum(finish[decoding] - first[decoding], 1), 0, 1)
                    mean = float(np.mean(prompt[decoding] + 1 + (output[decoding] - 1) * share))
                else:
                    mean = typical
                ctx = round(mean * decodes)
            n, tokens = int(row.context_requests), int(row.context_tokens)
            held = np.flatnonzero((sched <= end - wall + tol) & (first >= end - tol))
            held = held[np.argsort(np.abs(first[held] - end), kind="stable")]
            if n == 1 and len(held):
                rid = str(ids[held[0]])
                chunks: tuple[tuple[int, int], ...] = ((tokens, computed.get(rid, 0)),)
                computed[rid] = computed.get(rid, 0) + tokens
                if owner.setdefault(rid, log.placement.log) != log.placement.log:
                    shared.add(rid)  # prefilled on two engines (a disaggregated decode worker recomputes a token)
            elif n:
                chunks = tuple((tokens // n + (k < tokens % n), 0) for k in range(n))
                shared.update(str(j) for j in ids[held[:n]])
            else:
                chunks = ()
            if n:
                completed.update(str(j) for j in ids[held[np.abs(first[held] - end) <= tol]])
            sampled = decodes + min(n, int((np.abs(first[held] - end) <= tol).sum()))
            if lo <= end < hi and wall > 0:
                if n == 1 and len(held):
                    lone.append((len(steps), rid))
                steps.append((chunks, decodes, ctx, sampled, wall))
    known = {rid: n for rid, n in computed.items() if rid in completed and rid not in shared}
    for index, rid in lone:  # a known request's chunks attend to its cached prefix too
        if (cached := prompts.get(rid, 0) - known.get(rid, prompts.get(rid, 0))) > 0:
            ((tokens, before),), *rest = steps[index]
            steps[index] = (((tokens, before + cached),), *rest)  # type: ignore[assignment]
    if len(steps) > limit:
        steps = [steps[i] for i in np.linspace(0, len(steps) - 1, limit).astype(int)]
    return LoggedSteps(steps, unplaced, known)


def measured_phase_times(store: Store, model: str, since_ns: int | None = None,
                         until_ns: int | None = None) -> dict[str, tuple[int | None, int | None]]:
    """Each request's measured (prefill ns, decode ns), from request-level telemetry (None: not measured)."""
    params = {"model": model, "since_ns": since_ns if since_ns is not None else _ALL_TIME[0],
              "until_ns": until_ns if until_ns is not None else _ALL_TIME[1]}
    return {rid: (None if p is None else int(p), None if d is None else int(d))
            for rid, p, d in store.sql(query_text("capture_phase_times"), params).fetchall()}
