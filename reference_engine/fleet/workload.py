"""The fleet's traffic: each tenant's requests (synthetic or replayed from a public trace), spread over its
models and following the fleet's diurnal curve, plus what workload-side faults change (a surge of requests, a
tenant sending several times its traffic, cache-busting prompts, runaway generations after an assistant
prefill), and which requests an assistant-prefill fault in "fail" mode breaks."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request
from reference_engine.fleet.config import FaultSpec, FleetSpec, TenantSpec
from reference_engine.workload import (
    DEFAULT_EPOCH_NS,
    SyntheticWorkload,
    azure_requests,
    mooncake_requests,
    synthetic_requests,
)

CACHE_BUSTING_TOKENS = 12  # e.g. "Current time: 2026-01-01T00:03:17Z" placed before the system prompt


_TraceRows = tuple[tuple[int, int, int, int], ...]  # arrival ns, prompt tokens, output tokens, max tokens


@functools.lru_cache(maxsize=8)
def _trace_rows(workload: str, path: Path, speedup: float, mtime_ns: int, size: int) -> _TraceRows:
    """A trace's requests as plain rows, read once for all the tenants that replay it (the file's modification
    time and size are part of the key: a rewritten file is read again)."""
    read = azure_requests if workload == "azure" else mooncake_requests
    return tuple((r.arrival_ns, r.prompt.num_tokens, r.output_tokens, r.max_tokens)
                 for r in read(path, None, speedup, model=""))


def _replay(tenant: TenantSpec, duration_s: float, epoch_ns: int) -> list[Request]:
    """The trace's requests from `offset_s` on, wrapping around to its start, over `duration_s`."""
    assert tenant.path is not None
    path = Path(tenant.path)
    stat = path.stat() if path.is_file() else None
    rows = _trace_rows(tenant.workload, path, tenant.speedup, stat.st_mtime_ns if stat else 0,
                       stat.st_size if stat else 0)
    if not rows:
        return []
    first = rows[0][0]
    span = rows[-1][0] - first + 1
    offset, end = round(tenant.offset_s * 1e9) % span, round(duration_s * 1e9)
    out = []
    for lap in range(int(end // span) + 2):
        for r in rows:
            t = r[0] - first - offset + lap * span
            if 0 <= t < end:
                out.append((t, r))
    out.sort(key=lambda x: x[0])
    replayed = []
    for i, (t, (_, prompt_tokens, output_tokens, max_tokens)) in enumerate(out):
        rid = f"{tenant.name}-{i:06d}"
        replayed.append(Request(rid, epoch_ns + t, Prompt(((f"user-{rid}", prompt_tokens),)), output_tokens,
                                max_tokens, tenant=tenant.name))
    return replayed


def _assign_models(requests: list[Request], models: dict[str, float], rng: np.random.Generator) -> None:
    names = list(models)
    weights = np.array([models[m] for m in names], dtype=np.float64)
    picks = rng.choice(len(names), size=len(requests), p=weights / weights.sum())
    for r, i in zip(requests, picks, strict=True):
        r.model = names[i]


def _thinned(requests: list[Request], keep: Callable[[float], float], peak: float, seed: int,
             epoch_ns: int) -> list[Request]:
    """Requests drawn at a peak rate, each kept with probability keep(t) / peak (t in seconds from the start):
    a Poisson stream whose rate follows keep(t)."""
    draws = np.random.default_rng(seed).random(len(requests)) * peak
    return [r for r, u in zip(requests, draws, strict=True) if u < keep((r.arrival_ns - epoch_ns) / 1e9)]


def _tenant_traffic(spec: FleetSpec, tenant: TenantSpec, duration_s: float, tenant_seed: int,
                    epoch_ns: int) -> list[Request]:
    if tenant.workload != "synthetic":
        return _replay(tenant, duration_s, epoch_ns)
    diurnal = spec.diurnal
    if diurnal is None or not diurnal.amplitude:
        return synthetic_requests(tenant.synthetic, duration_s, tenant_seed, start_ns=epoch_ns, id_prefix=tenant.name)
    peak = 1.0 + diurnal.amplitude
    drawn = synthetic_requests(replace(tenant.synthetic, rate=tenant.synthetic.rate * peak), duration_s, tenant_seed,
                               start_ns=epoch_ns, id_prefix=tenant.name)
    return _thinned(drawn, diurnal.factor, peak, tenant_seed + 700, epoch_ns)


def _traffic_surge(spec: FleetSpec, fault: FaultSpec, i: int, seed: int, epoch_ns: int) -> list[Request]:
    """The tenant's extra traffic in the fault's window: (factor - 1) times its own rate (to all its models, or
    to the one model named), the same mix of requests, following the diurnal curve and the fault's ramp."""
    k, tenant = next((k, t) for k, t in enumerate(spec.tenants) if t.name == fault.target)
    start, _ = fault.window_ns(epoch_ns)
    extra = fault.param("factor") - 1.0
    if extra <= 0 or tenant.workload != "synthetic":
        return []
    ramp, diurnal = fault.param("ramp_s"), spec.diurnal
    peak = 1.0 + (diurnal.amplitude if diurnal else 0.0)
    offset = (start - epoch_ns) / 1e9

    def keep(t: float) -> float:
        level = min(1.0, (t - offset) / ramp) if ramp > 0 else 1.0
        return level * (diurnal.factor(t) if diurnal else 1.0)

    model = str(fault.params.get("model", ""))
    share = tenant.models.get(model, 0.0) / sum(tenant.models.values()) if model else 1.0
    if share <= 0:
        return []
    workload = replace(tenant.synthetic, rate=tenant.synthetic.rate * share * extra * peak)
    drawn = synthetic_requests(workload, fault.duration_s, seed * 1_000 + 900 + i, start_ns=start,
                               id_prefix=f"{tenant.name}-surge{i}")
    surge = _thinned(drawn, keep, peak, seed * 1_000 + 910 + i, epoch_ns)
    _assign_models(surge, {model: 1.0} if model else tenant.models, np.random.default_rng(seed * 1_000 + 920 + k))
    return surge


def fleet_requests(spec: FleetSpec, duration_s: float, seed: int, epoch_ns: int = DEFAULT_EPOCH_NS) -> list[Request]:
    """Every request of the fleet in arrival order, with workload faults applied."""
    requests: list[Request] = []
    for k, tenant in enumerate(spec.tenants):
        tenant_seed = seed * 1_000 + k
        mine = _tenant_traffic(spec, tenant, duration_s, tenant_seed, epoch_ns)
        _assign_models(mine, tenant.models, np.random.default_rng(tenant_seed + 500))
        requests += mine
    rng = np.random.default_rng(seed + 7)
    for i, fault in enumerate(spec.faults):
        start, end = fault.window_ns(epoch_ns)
        if fault.kind == "traffic_surge":
            requests += _traffic_surge(spec, fault, i, seed, epoch_ns)
        elif fault.kind == "request_surge":
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
