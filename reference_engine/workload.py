"""Workloads: synthetic traffic, and replay of the public traces in ../shared/workloads.

Synthetic: Poisson or gamma arrivals; log-normal prompt and output lengths; per-tenant shared system
prompts; a fraction of requests with an assistant prefill. Replay: the Azure LLM inference trace
(arrivals and lengths) and the Mooncake trace (arrivals, lengths and 512-token prefix block hashes, which
become shared prompt segments).
"""

from __future__ import annotations

import csv
import functools
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request

DEFAULT_EPOCH_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z: synthetic traffic starts here
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class SyntheticWorkload:
    rate: float = 4.0  # requests per second
    arrival: str = "poisson"  # or "gamma"
    arrival_cv: float = 1.0  # gamma: coefficient of variation of inter-arrival times (> 1 is bursty)
    prompt_mean: float = 1024.0  # user tokens (after any system prompt), log-normal
    prompt_sigma: float = 0.8
    output_mean: float = 200.0
    output_sigma: float = 0.8
    max_prompt_tokens: int = 16384
    max_tokens: int = 1024
    tenants: tuple[str, ...] = ("tenant-a", "tenant-b", "tenant-c")
    system_prompts_per_tenant: int = 2
    system_prompt_tokens: int = 1024
    system_prompt_fraction: float = 0.6  # requests that start with one of their tenant's system prompts
    assistant_prefill_fraction: float = 0.05
    assistant_prefill_tokens: int = 24

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.arrival not in ("poisson", "gamma"):
            raise ValueError(f"arrival must be poisson or gamma, got {self.arrival!r}")
        for name in ("system_prompt_fraction", "assistant_prefill_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not self.tenants:
            raise ValueError("need at least one tenant")


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    mu = np.log(mean) - sigma**2 / 2  # so that the distribution's mean is `mean`
    return rng.lognormal(mu, sigma, size)


def synthetic_requests(workload: SyntheticWorkload, duration_s: float, seed: int,
                       start_ns: int = DEFAULT_EPOCH_NS, model: str = "", id_prefix: str = "req") -> list[Request]:
    w = workload
    rng = np.random.default_rng(seed)
    expected = int(w.rate * duration_s * 1.5) + 16
    if w.arrival == "poisson":
        gaps = rng.exponential(1 / w.rate, expected)
    else:
        shape = 1 / w.arrival_cv**2
        gaps = rng.gamma(shape, 1 / (w.rate * shape), expected)
    arrivals = np.cumsum(gaps)
    arrivals = arrivals[arrivals < duration_s]
    n = len(arrivals)
    prompt_lens = np.clip(np.rint(_lognormal(rng, w.prompt_mean, w.prompt_sigma, n)), 1, w.max_prompt_tokens)
    output_lens = np.clip(np.rint(_lognormal(rng, w.output_mean, w.output_sigma, n)), 1, w.max_tokens)
    tenant_idx = rng.integers(0, len(w.tenants), n)
    uses_system = rng.random(n) < w.system_prompt_fraction
    system_idx = rng.integers(0, max(w.system_prompts_per_tenant, 1), n)
    with_prefill = rng.random(n) < w.assistant_prefill_fraction
    requests = []
    for i in range(n):
        rid = f"{id_prefix}-{i:06d}"
        tenant = w.tenants[tenant_idx[i]]
        segments: list[tuple[str, int]] = []
        system_id, system_tokens = None, 0
        if uses_system[i] and w.system_prompts_per_tenant > 0 and w.system_prompt_tokens > 0:
            system_id, system_tokens = f"sys-{tenant}-{system_idx[i]}", w.system_prompt_tokens
            segments.append((system_id, system_tokens))
        segments.append((f"user-{rid}", int(prompt_lens[i])))
        prefill = w.assistant_prefill_tokens if with_prefill[i] and w.assistant_prefill_tokens > 0 else 0
        if prefill:
            segments.append((f"assistant-{rid}", prefill))
        requests.append(Request(
            rid, start_ns + int(arrivals[i] * 1e9), Prompt(tuple(segments)), int(output_lens[i]), w.max_tokens,
            tenant=tenant, model=model, system_prompt_id=system_id, system_prompt_tokens=system_tokens,
            assistant_prefill_tokens=prefill))
    return requests


@functools.lru_cache(maxsize=4096)
def _utc_seconds(whole: str) -> int:
    """`2023-11-16 18:15:46` as seconds since the epoch (cached: a trace has several requests per second)."""
    return int(datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp())


def _azure_time_ns(text: str) -> int:
    """`2023-11-16 18:15:46.6805900`: 7 fractional digits, more than `%f` takes."""
    whole, _, fraction = text.strip().partition(".")
    return _utc_seconds(whole) * 10**9 + int((fraction or "0")[:9].ljust(9, "0"))


def azure_requests(path: str | Path, duration_s: float | None = None, speedup: float = 1.0,
                   max_tokens: int = 1024, model: str = "", tenant: str = "azure",
                   id_prefix: str = "azure") -> list[Request]:
    """Azure LLM inference trace (TIMESTAMP, ContextTokens, GeneratedTokens); arrivals compressed by
    `speedup`; only the first `duration_s` seconds (after compression) when given."""
    requests = []
    with open(path, newline="") as f:
        reader = csv.reader(f)  # rows as lists, read by the header's positions: a DictReader costs twice as much
        header = next(reader, [])
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(header)
        if missing:
            raise ValueError(f"{path}: not an Azure LLM trace, missing columns {sorted(missing)}")
        at_time, at_context, at_generated = (header.index(c) for c in ("TIMESTAMP", "ContextTokens",
                                                                        "GeneratedTokens"))
        start = None
        for line, row in enumerate((row for row in reader if row), start=2):  # blank lines skipped, as DictReader
            try:
                t = _azure_time_ns(row[at_time])
                context, generated = int(row[at_context]), int(row[at_generated])
            except (ValueError, TypeError, IndexError) as e:
                raise ValueError(f"{path}:{line}: bad row {dict(zip(header, row, strict=False))!r}: {e}") from None
            start = t if start is None else start
            offset = int((t - start) / speedup)
            if duration_s is not None and offset >= duration_s * 1e9:
                break
            rid = f"{id_prefix}-{line - 2:06d}"
            output = max(generated, 1)
            requests.append(Request(rid, start + offset, Prompt(((f"user-{rid}", max(context, 1)),)), output,
                                    max(max_tokens, output), tenant=tenant, model=model))
    return requests


def mooncake_requests(path: str | Path, duration_s: float | None = None, speedup: float = 1.0,
                      start_ns: int = DEFAULT_EPOCH_NS, max_tokens: int = 1024, model: str = "",
                      tenant: str = "mooncake", id_prefix: str = "mooncake") -> list[Request]:
    """Mooncake trace (timestamp ms, input_length, output_length, hash_ids of 512-token blocks): equal
    leading hash ids become equal prompt segments, so the prefix cache sees the trace's sharing."""
    requests = []
    with open(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ts, length, output = int(row["timestamp"]), int(row["input_length"]), int(row["output_length"])
                hash_ids = [int(h) for h in row["hash_ids"]]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{line_no}: bad Mooncake record: {e}") from None
            offset = int(ts * 1e6 / speedup)
            if duration_s is not None and offset >= duration_s * 1e9:
                break
            rid = f"{id_prefix}-{line_no - 1:06d}"
            segments = []
            remaining = max(length, 1)
            for h in hash_ids:
                take = min(MOONCAKE_BLOCK_TOKENS, remaining)
                if take <= 0:
                    break
                segments.append((f"mooncake-block-{h}", take))
                remaining -= take
            if remaining > 0:
                segments.append((f"user-{rid}", remaining))
            out = max(output, 1)
            requests.append(Request(rid, start_ns + offset, Prompt(tuple(segments)), out, max(max_tokens, out),
                                    tenant=tenant, model=model))
    return requests


def mooncake_reusable_tokens(path: str | Path, count: int) -> tuple[int, int]:
    """The trace's own infinite-cache bound over its first `count` records: the prompt tokens whose leading
    512-token blocks an earlier record already had (an engine always computes a prompt's last token), and all
    prompt tokens. Read from the hash ids alone, independently of any engine."""
    seen: set[int] = set()
    reusable = total = 0
    with open(path) as f:
        for line in (line for line in f if line.strip()):
            if count <= 0:
                break
            count -= 1
            row = json.loads(line)
            hashes, length = row["hash_ids"], int(row["input_length"])
            k = 0
            while k < len(hashes) and hashes[k] in seen:
                k += 1
            reusable += min(k * MOONCAKE_BLOCK_TOKENS, length - 1)
            total += length
            seen.update(hashes)
    return reusable, total
