"""The fleet's traffic: each tenant's requests (synthetic or replayed from a public trace), spread over its
models, plus what workload-side faults change (a surge of requests, cache-busting prompts, runaway
generations after an assistant prefill), and which requests an assistant-prefill fault in "fail" mode breaks."""

from __future__ import annotations

import numpy as np

from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request
from reference_engine.fleet.config import FleetSpec, TenantSpec
from reference_engine.workload import (
    DEFAULT_EPOCH_NS,
    SyntheticWorkload,
    azure_requests,
    mooncake_requests,
    synthetic_requests,
)

CACHE_BUSTING_TOKENS = 12  # e.g. "Current time: 2026-01-01T00:03:17Z" placed before the system prompt


def _replay(tenant: TenantSpec, duration_s: float, epoch_ns: int) -> list[Request]:
    """The trace's requests from `offset_s` on, wrapping around to its start, over `duration_s`."""
    assert tenant.path is not None
    if tenant.workload == "azure":
        requests = azure_requests(tenant.path, None, tenant.speedup, model="", tenant=tenant.name,
                                  id_prefix=tenant.name)
    else:
        requests = mooncake_requests(tenant.path, None, tenant.speedup, model="", tenant=tenant.name,
                                     id_prefix=tenant.name)
    if not requests:
        return []
    first = requests[0].arrival_ns
    span = requests[-1].arrival_ns - first + 1
    offset, end = round(tenant.offset_s * 1e9) % span, round(duration_s * 1e9)
    out = []
    for lap in range(int(end // span) + 2):
        for r in requests:
            t = r.arrival_ns - first - offset + lap * span
            if 0 <= t < end:
                out.append((t, r))
    out.sort(key=lambda x: x[0])
    replayed = []
    for i, (t, r) in enumerate(out):
        rid = f"{tenant.name}-{i:06d}"
        replayed.append(Request(rid, epoch_ns + t, Prompt(((f"user-{rid}", r.prompt.num_tokens),)), r.output_tokens,
                                r.max_tokens, tenant=tenant.name))
    return replayed


def _assign_models(requests: list[Request], models: dict[str, float], rng: np.random.Generator) -> None:
    names = list(models)
    weights = np.array([models[m] for m in names], dtype=np.float64)
    picks = rng.choice(len(names), size=len(requests), p=weights / weights.sum())
    for r, i in zip(requests, picks, strict=True):
        r.model = names[i]


def fleet_requests(spec: FleetSpec, duration_s: float, seed: int, epoch_ns: int = DEFAULT_EPOCH_NS) -> list[Request]:
    """Every request of the fleet in arrival order, with workload faults applied."""
    requests: list[Request] = []
    for k, tenant in enumerate(spec.tenants):
        tenant_seed = seed * 1_000 + k
        if tenant.workload == "synthetic":
            mine = synthetic_requests(tenant.synthetic, duration_s, tenant_seed, start_ns=epoch_ns,
                                      id_prefix=tenant.name)
        else:
            mine = _replay(tenant, duration_s, epoch_ns)
        _assign_models(mine, tenant.models, np.random.default_rng(tenant_seed + 500))
        requests += mine
    rng = np.random.default_rng(seed + 7)
    for i, fault in enumerate(spec.faults):
        start, end = fault.window_ns(epoch_ns)
        if fault.kind == "request_surge":
            tenant = str(fault.params.get("tenant", ""))
            surge = SyntheticWorkload(
                rate=fault.param("rate"), prompt_mean=fault.param("prompt_mean"),
                prompt_sigma=fault.param("prompt_sigma"), output_mean=fault.param("output_mean"),
                output_sigma=fault.param("output_sigma"), max_tokens=int(fault.param("max_tokens")),
                max_prompt_tokens=int(max(fault.param("prompt_mean") * 4, 1)), tenants=(tenant,),
                system_prompt_fraction=0.0, assistant_prefill_fraction=0.0)
            requests += synthetic_requests(surge, fault.duration_s, seed * 1_000 + 900 + i, start_ns=start,
                                           model=fault.target, id_prefix=f"{tenant}-surge{i}")
        elif fault.kind == "cache_busting":
            for r in requests:
                if r.tenant == fault.target and start <= r.arrival_ns < end and r.system_prompt_id is not None:
                    r.prompt = Prompt(((f"stamp-{r.request_id}", CACHE_BUSTING_TOKENS), *r.prompt.segments))
        elif fault.kind == "assistant_prefill_runaway" and fault.params.get("mode", "runaway") == "runaway":
            p = fault.param("probability")
            for r in requests:
                if (r.model == fault.target and r.assistant_prefill_tokens and start <= r.arrival_ns < end
                        and rng.random() < p):
                    r.output_tokens = r.max_tokens
    requests.sort(key=lambda r: (r.arrival_ns, r.request_id))
    return requests


def prefill_failures(spec: FleetSpec, requests: list[Request], seed: int, epoch_ns: int = DEFAULT_EPOCH_NS) -> set[str]:
    """Ids of the requests whose output an assistant-prefill fault in "fail" mode breaks: each request of the
    model with an assistant prefill, arriving in the window, with the fault's probability (drawn in arrival
    order from the seed, so the fleet and the ground truth agree)."""
    failing: set[str] = set()
    for i, fault in enumerate(spec.faults):
        if fault.kind != "assistant_prefill_runaway" or fault.params.get("mode", "runaway") != "fail":
            continue
        start, end = fault.window_ns(epoch_ns)
        rng = np.random.default_rng(seed * 1_000 + 950 + i)
        p = fault.param("probability")
        for r in sorted(requests, key=lambda r: (r.arrival_ns, r.request_id)):
            if r.model == fault.target and r.assistant_prefill_tokens and start <= r.arrival_ns < end \
                    and rng.random() < p:
                failing.add(r.request_id)
    return failing
