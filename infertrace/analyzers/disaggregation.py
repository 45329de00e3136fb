"""Prefill/decode disaggregation, as the requests of a store show it.

For each disaggregated model (`requests` rows with serving 'disaggregated'): how many requests, how many
could not be analysed because their legs did not match (and why), the KV transfer's time and its share of
the client's TTFT, and the decode worker's queue and first decode.

For each model served colocated on a CPU-only host (hardware whose "device" is the host, e.g. `CPU-host`): a
prompt there is prefilled at the host's few TFLOP/s, so long prompts take minutes and queue behind each other.
The fix is a GPU prefill host in front of it: prefill there, move the KV over a link, decode on the CPU host.
`gpu_prefill_estimates` predicts, per such model, the client TTFT with that fix, from each request's own
gateway time and prompt: the roofline prefill time on the GPU (`roofline.prefill_step_seconds`), the wait at
the GPU host (its prefills one after another in arrival order, at the requests' observed arrival times: a
FIFO queue, Lindley's recursion), the KV transfer over the link (`2·layers·kv_heads·head_dim·dtype_bytes` bytes
per prompt token at the link's bandwidth, plus its latency) and one decode step of the CPU host at the
request's context (the roofline: every weight and the request's KV read once from host memory).
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
    """A model prefilled on a CPU-only host, and what a GPU prefill host in front of it would give."""

    model: str
    instance: str
    hardware: str
    requests: int
    ttft_p50_ns: int  # observed client TTFT
    prefill_p50_ns: int  # observed queue + prefill on the CPU host
    gpu_hardware: str
    link_gb_s: float
    link_latency_ms: float
    predicted_ttft_p50_ns: int | None  # None: the GPU host would saturate too (utilization ≥ 1)
    predicted_prefill_p50_ns: int  # on the GPU, without queueing
    predicted_wait_ns: int | None  # median wait at the GPU host (FIFO at the observed arrivals)
    gpu_utilization: float
    kv_transfer_p50_ns: int
    decode_step_ns: int  # the CPU host's decode step at the median request's context: the first decode
    prefill_saved_p50_ns: int  # observed queue + prefill − predicted wait + prefill, at the median request


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


def cpu_only(hw: Accelerator) -> bool:
    """The accelerator is the host itself: no host link to a device."""
    return hw.host_link_bandwidth == 0


def gpu_prefill_estimates(store: Store, gpu: str = GPU_PREFILL_HARDWARE, link_gb_s: float = LINK_GB_S,
                          link_latency_ms: float = LINK_LATENCY_MS) -> tuple[tuple[GpuPrefillEstimate, ...],
                                                                             tuple[str, ...]]:
    rows = store.sql(query_text("cpu_host_prefills")).df()
    estimates, skipped = [], []
    gpu_hw = HARDWARE[gpu]
    for (instance, model, hardware), part in rows.groupby(["instance", "model", "hardware"], sort=True):
        hw = HARDWARE.get(str(hardware))
        if hw is None or not cpu_only(hw):
            continue
        spec: ModelShape | None = MODELS.get(str(model))
        if spec is None:
            skipped.append(f"{instance}: model {model} has no shape in the roofline table")
            continue
        n = len(part)
        uncached = (part["input_tokens"] - part["cached_tokens"].fillna(0)).clip(lower=1).to_numpy(dtype=int)
        service = np.array([prefill_step_seconds(spec, gpu_hw, int(u)) for u in uncached]) * 1e9
        arrival = part["arrival_ns"].to_numpy(dtype=np.int64)
        span_ns = float(arrival.max() - arrival.min())
        utilization = float(service[1:].sum() / span_ns) if n > 1 and span_ns > 0 else 0.0
        wait = fifo_waits(arrival, service)
        inputs = part["input_tokens"].to_numpy(dtype=float)
        transfer = spec.kv_bytes_per_token * inputs / (link_gb_s * 1e9) * 1e9 + link_latency_ms * 1e6
        decode = np.array([decode_step_seconds(spec, hw, int(c)) for c in inputs]) * 1e9
        gateway = part["gateway_ns"].fillna(0).to_numpy(dtype=float)
        observed_prefill = (part["queue_ns"] + part["prefill_ns"]).to_numpy(dtype=float)
        predicted = gateway + wait + service + transfer + decode
        estimates.append(GpuPrefillEstimate(
            str(model), str(instance), str(hardware), n, int(np.median(part["client_ttft_ns"])),
            int(np.median(observed_prefill)), gpu, link_gb_s, link_latency_ms,
            None if utilization >= 1 else int(np.median(predicted)), int(np.median(service)),
            int(np.median(wait)), round(utilization, 4), int(np.median(transfer)), int(np.median(decode)),
            int(np.median(observed_prefill - wait - service))))
    return tuple(estimates), tuple(skipped)


def analyze_disaggregation(store: Store, gpu: str = GPU_PREFILL_HARDWARE, link_gb_s: float = LINK_GB_S,
                           link_latency_ms: float = LINK_LATENCY_MS) -> DisaggregationAnalysis:
    estimates, skipped = gpu_prefill_estimates(store, gpu, link_gb_s, link_latency_ms)
    return DisaggregationAnalysis(disaggregated_models(store), estimates, skipped)
