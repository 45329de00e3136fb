"""Prefill/decode disaggregation, as the requests of a store show it.

For each disaggregated model (`requests` rows with serving 'disaggregated'): how many requests, how many
could not be analysed because their legs did not match (and why), the KV transfer's time and its share of
the client's TTFT, and the decode worker's queue and first decode.

For each model served colocated on CPU-only hosts (hardware whose "device" is the host, e.g. `CPU-host`): a
prompt there is prefilled at the host's few TFLOP/s, so long prompts take minutes and queue behind each other.
The fix is one GPU prefill host in front of the model's CPU hosts: prefill there, move the KV over a link, decode
on the CPU host that served the request. `gpu_prefill_estimates` predicts, per such model, the client TTFT with
that fix, from each request's own gateway time, arrival and prompt, replayed through a model of that GPU host:

- the GPU host takes every prompt the CPU hosts received (answered or not), in arrival order, as the engine
  schedules unchunked prefills: at each step it takes the waiting prompts from the head of the queue while their
  uncached tokens fit the step budget (the CPU hosts' own `max_num_batched_tokens`: the GPU host is assumed to
  run with the same settings), and every prompt of the step gets its KV when the step ends;
- a step's time is the roofline prefill time (`roofline.prefill_step_seconds`) of each of its prompts, summed,
  with the per-step overhead paid once (at these sizes the linear layers are compute-bound, so batching saves
  nothing else);
- the KV of each prompt (`2·layers·kv_heads·head_dim·dtype_bytes` bytes per prompt token) then crosses one link,
  one transfer at a time in the order the prefills end (a FIFO queue, Lindley's recursion), at the link's
  bandwidth plus its latency;
- and the CPU host runs one decode step at the request's context (the roofline: every weight and the request's
  KV read once from host memory).

The GPU host's utilization (its busy time over the arrivals' span) says how much of the answer is queueing;
at 1 or more it would saturate too and nothing is predicted. Not modelled: the GPU host's KV capacity (a step
waits for none), the wait for a CPU host's running decode step to end before the first decode joins it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infertrace.analyzers import query_text
from infertrace.analyzers.roofline import (
    HARDWARE,
    MODELS,
    Accelerator,
    Efficiency,
    ModelShape,
    prefill_step_seconds,
)
from infertrace.store.store import Store

GPU_PREFILL_HARDWARE = "L4"
LINK_GB_S = 12.5  # 100 Gbit/s
LINK_LATENCY_MS = 0.5
DEFAULT_STEP_BUDGET = 16384  # prompt tokens per step when the engine's spans do not say (the engine's default)


@dataclass(frozen=True)
class DisaggregatedModel:
    model: str
    requests: int  # rows of `requests` for the model served disaggregated
    unmatched: dict[str, int]  # leg problem → requests (kept, with what could be known)
    kv_transfer_p50_ns: int | None
    kv_transfer_p99_ns: int | None
    kv_share_of_ttft: float | None  # Σ KV transfer / Σ client TTFT over matched requests
    decode_queue_p50_ns: int | None
    first_decode_p50_ns: int | None
    links: tuple[str, ...]


@dataclass(frozen=True)
class GpuPrefillEstimate:
    """A model prefilled on CPU-only hosts, and what one GPU prefill host in front of them all would give."""

    model: str
    instances: tuple[str, ...]  # the model's CPU-only engines, which the GPU host would serve together
    hardware: str
    requests: int  # answered requests (the statistics); the GPU host's queue also takes the unanswered ones
    prompts: int  # every prompt the GPU host would prefill
    ttft_p50_ns: int  # observed client TTFT
    prefill_p50_ns: int  # observed queue + prefill on the CPU host
    gpu_hardware: str
    link_gb_s: float
    link_latency_ms: float
    step_budget_tokens: int  # prompt tokens one step of the GPU host may take
    predicted_ttft_p50_ns: int | None  # None: the GPU host would saturate too (utilization ≥ 1)
    predicted_prefill_p50_ns: int  # on the GPU, without queueing
    predicted_wait_ns: int | None  # median wait at the GPU host (steps taken as the engine batches them)
    gpu_utilization: float
    kv_transfer_p50_ns: int  # link wait + transfer + latency
    decode_step_ns: int  # the CPU host's decode step at the median request's context: the first decode
    prefill_saved_p50_ns: int  # observed queue + prefill − predicted wait + prefill, at the median request

    @property
    def instance(self) -> str:
        """The engines, for display."""
        return ", ".join(self.instances)


@dataclass(frozen=True)
class DisaggregationAnalysis:
    models: tuple[DisaggregatedModel, ...]
    gpu_prefill: tuple[GpuPrefillEstimate, ...]
    not_estimated: tuple[str, ...]  # CPU-only engines without an estimate, and why


def _p(values: np.ndarray, q: float) -> int | None:
    values = values[~np.isnan(values)]
    return int(np.percentile(values, q)) if len(values) else None


def disaggregated_models(store: Store) -> tuple[DisaggregatedModel, ...]:
    df = store.sql("SELECT model, leg_problem, kv_transfer_ns, client_ttft_ns, decode_queue_ns, first_decode_ns, "
                   "kv_link FROM requests WHERE serving = 'disaggregated'").df()
    out = []
    for model, rows in df.groupby("model", sort=True):
        matched = rows[rows["leg_problem"].isna()]
        kv = matched["kv_transfer_ns"].to_numpy(dtype=float)
        ttft = matched["client_ttft_ns"].to_numpy(dtype=float)
        both = ~np.isnan(kv) & ~np.isnan(ttft)
        share = float(kv[both].sum() / ttft[both].sum()) if both.any() and ttft[both].sum() > 0 else None
        out.append(DisaggregatedModel(
            str(model), len(rows), {str(k): int(v) for k, v in rows["leg_problem"].value_counts().items()},
            _p(kv, 50), _p(kv, 99), None if share is None else round(share, 4),
            _p(matched["decode_queue_ns"].to_numpy(dtype=float), 50),
            _p(matched["first_decode_ns"].to_numpy(dtype=float), 50),
            tuple(sorted(rows["kv_link"].dropna().unique()))))
    return tuple(out)


def decode_step_seconds(model: ModelShape, hw: Accelerator, context: int, eff: Efficiency | None = None) -> float:
    """One decode step of one sequence at `context` tokens: every weight and the sequence's KV read once."""
    e = eff or Efficiency()
    weights = model.bytes_per_weight * (model.attention_params + model.num_experts * model.expert_params
                                        + model.head_params)
    return (weights + model.kv_bytes_per_token * context) / (hw.mem_bandwidth * e.memory) + e.step_overhead_s


def fifo_waits(arrival_ns: np.ndarray, service_ns: np.ndarray) -> np.ndarray:
    """Each job's wait at one server taking them in arrival order (Lindley's recursion)."""
    order = np.argsort(arrival_ns, kind="stable")
    waits = np.zeros(len(arrival_ns))
    free = -np.inf
    for i in order:
        start = max(float(arrival_ns[i]), free)
        waits[i] = start - float(arrival_ns[i])
        free = start + float(service_ns[i])
    return waits


def batched_prefills(arrival_ns: np.ndarray, tokens: np.ndarray, service_ns: np.ndarray, budget: int,
                     step_overhead_ns: float) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt's (wait, end of its prefill step) at one engine prefilling unchunked: a step starts when the
    engine is free and a prompt waits; it takes the waiting prompts in arrival order while their tokens fit
    `budget` (a prompt alone always goes), lasts the sum of their `service_ns` less `step_overhead_ns` for every
    prompt after the first, and ends for all of them together."""
    order = np.argsort(arrival_ns, kind="stable")
    waits, ends = np.zeros(len(order)), np.zeros(len(order))
    free, i = -np.inf, 0
    while i < len(order):
        start = max(free, float(arrival_ns[order[i]]))
        j, total = i + 1, int(tokens[order[i]])
        while j < len(order) and arrival_ns[order[j]] <= start and total + int(tokens[order[j]]) <= budget:
            total += int(tokens[order[j]])
            j += 1
        step = order[i:j]
        free = start + float(service_ns[step].sum()) - step_overhead_ns * (len(step) - 1)
        waits[step] = start - arrival_ns[step]
        ends[step] = free
        i = j
    return waits, ends


def cpu_only(hw: Accelerator) -> bool:
    """The accelerator is the host itself: no host link to a device."""
    return hw.host_link_bandwidth == 0


def gpu_prefill_estimates(store: Store, gpu: str = GPU_PREFILL_HARDWARE, link_gb_s: float = LINK_GB_S,
                          link_latency_ms: float = LINK_LATENCY_MS, step_budget: int | None = None
                          ) -> tuple[tuple[GpuPrefillEstimate, ...], tuple[str, ...]]:
    """Per model on CPU-only hosts, the estimate above, and the engines not estimated (and why). `step_budget`:
    the GPU host's prompt tokens per step instead of the CPU hosts' own (0: one prompt a step)."""
    rows = store.sql(query_text("cpu_host_prefills")).df()
    estimates, skipped = [], []
    gpu_hw, eff = HARDWARE[gpu], Efficiency()
    for (model, hardware), part in rows.groupby(["model", "hardware"], sort=True):
        hw = HARDWARE.get(str(hardware))
        if hw is None or not cpu_only(hw):
            continue
        instances = tuple(sorted(part["instance"].astype(str).unique()))
        spec: ModelShape | None = MODELS.get(str(model))
        if spec is None:
            skipped.append(f"{', '.join(instances)}: model {model} has no shape in the roofline table")
            continue
        part = part.sort_values(["arrival_ns", "request_id"], kind="stable").reset_index(drop=True)
        answered = ((part["outcome"] == "ok") & part["ttft_ns"].notna() & part["client_ttft_ns"].notna()).to_numpy()
        if not answered.any():
            skipped.append(f"{', '.join(instances)}: no answered request to compare with")
            continue
        budgets = part["max_num_batched_tokens"].dropna()
        budget = step_budget if step_budget is not None else int(budgets.min()) if len(budgets) \
            else DEFAULT_STEP_BUDGET
        uncached = (part["input_tokens"] - part["cached_tokens"].fillna(0)).clip(lower=1).to_numpy(dtype=int)
        service = np.array([prefill_step_seconds(spec, gpu_hw, int(u)) for u in uncached]) * 1e9
        arrival = part["arrival_ns"].to_numpy(dtype=np.int64)
        span_ns = float(arrival.max() - arrival.min())
        utilization = float(service[1:].sum() / span_ns) if len(part) > 1 and span_ns > 0 else 0.0
        wait, prefilled = batched_prefills(arrival, uncached, service, budget, eff.step_overhead_s * 1e9)
        inputs = part["input_tokens"].to_numpy(dtype=float)
        moving = spec.kv_bytes_per_token * inputs / (link_gb_s * 1e9) * 1e9
        transfer = fifo_waits(prefilled, moving) + moving + link_latency_ms * 1e6
        decode = np.array([decode_step_seconds(spec, hw, int(c)) for c in inputs]) * 1e9
        gateway = part["gateway_ns"].fillna(0).to_numpy(dtype=float)
        predicted = gateway + (prefilled - arrival) + transfer + decode
        observed_prefill = (part["queue_ns"] + part["prefill_ns"]).to_numpy(dtype=float)
        a = answered
        estimates.append(GpuPrefillEstimate(
            str(model), instances, str(hardware), int(a.sum()), len(part),
            int(np.median(part["client_ttft_ns"][a])), int(np.nanmedian(observed_prefill[a])), gpu, link_gb_s,
            link_latency_ms, budget, None if utilization >= 1 else int(np.median(predicted[a])),
            int(np.median(service[a])), int(np.median(wait[a])), round(utilization, 4),
            int(np.median(transfer[a])), int(np.median(decode[a])),
            int(np.nanmedian(observed_prefill[a] - wait[a] - service[a]))))
    return tuple(estimates), tuple(skipped)


def analyze_disaggregation(store: Store, gpu: str = GPU_PREFILL_HARDWARE, link_gb_s: float = LINK_GB_S,
                           link_latency_ms: float = LINK_LATENCY_MS) -> DisaggregationAnalysis:
    estimates, skipped = gpu_prefill_estimates(store, gpu, link_gb_s, link_latency_ms)
    return DisaggregationAnalysis(disaggregated_models(store), estimates, skipped)
