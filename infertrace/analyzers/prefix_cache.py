"""Prefix (KV) cache effectiveness, cache busting and what prompt caching saved in billed tokens.

Hit rate = prompt tokens served from the prefix cache / prompt tokens, per tenant, model and shared system
prompt (`gen_ai.usage.cache_read.input_tokens`, `infertrace.request.system_prompt.*`). A tenant busts the
cache when its requests carry a shared system prompt of at least one whole KV block, the engine has seen that
prompt before, and yet most of them read fewer cached tokens than the prompt's whole blocks: the prompts
share text but not whole leading blocks (e.g. a per-request timestamp placed before the system prompt).
Savings price cached input tokens at a discount: `PriceTable` per model, in dollars per million tokens.

KV tiers: an engine with a host-memory (or remote) KV tier behind its GPU, or with reuse accounting on, says on
each prefill span where the prompt's cached tokens came from and how many it recomputed because they had been
evicted from every tier (`infertrace.prefill.kv_*`). `by_tier` gives each such engine's hit rate per tier and the
time its steps spent copying KV back; `capacity` what more capacity would buy: the prompt tokens that would have
hit had the cache held that many more blocks (an evicted run is kept when the evictions since it left are at
most the extra blocks: LRU's stack-distance rule), for +½, +1, +2, +4 and +8 times the engine's KV capacity (GPU
and tiers) and without limit. It is an estimate: hits that more capacity adds do not change later evictions here.
Engines that do not report these attributes are listed in `tiers_not_analysed`, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from infertrace.analyzers import query_text
from infertrace.analyzers.roofline import MODELS
from infertrace.store.store import Store


@dataclass(frozen=True)
class Price:
    input_per_mtok: float = 3.0
    cached_input_per_mtok: float = 0.3  # e.g. a 90% discount on cache reads
    output_per_mtok: float = 15.0


@dataclass(frozen=True)
class PriceTable:
    default: Price = field(default_factory=Price)
    models: dict[str, Price] = field(default_factory=dict)

    def price(self, model: str) -> Price:
        return self.models.get(model, self.default)


@dataclass(frozen=True)
class CacheGroup:
    key: str  # tenant, model or system prompt id
    requests: int
    input_tokens: int
    cached_tokens: int
    hit_rate: float


@dataclass(frozen=True)
class CacheBusting:
    tenant: str
    system_prompt_id: str
    system_prompt_tokens: int
    start_ns: int  # the buckets in which it busted
    end_ns: int
    requests: int  # after the prompt was first seen
    full_hits: int  # requests that read at least the prompt's whole blocks from the cache
    full_hit_rate: float
    other_tenants_full_hit_rate: float | None  # the same measure for every other tenant's system prompts
    lost_cached_tokens: int  # whole-block system prompt tokens that were recomputed
    lost_savings: float  # dollars, under the price table


@dataclass(frozen=True)
class Billing:
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    cost: float  # dollars with cache discounts
    cost_without_cache: float
    savings: float


@dataclass(frozen=True)
class TierHits:
    """One engine's prefix hits by where they were found, over its requests' first scheduling."""

    instance: str
    model: str
    requests: int
    input_tokens: int
    device_tokens: int
    host_tokens: int
    remote_tokens: int
    hit_rate: float  # all tiers
    device_hit_rate: float
    host_hit_rate: float
    remote_hit_rate: float
    gpu_blocks: int
    host_tier_blocks: int  # 0: none
    remote_tier_blocks: int
    load_s: float  # steps' time copying KV back from the tiers
    evicted_tokens: int  # recomputed for lack of capacity


@dataclass(frozen=True)
class CapacityWhatIf:
    """Prompt tokens an engine would have read from its cache with more capacity (an LRU estimate)."""

    instance: str
    extra_blocks: int | None  # None: without limit
    extra_gb: float | None  # None: unknown model, or without limit
    added_hit_tokens: int
    hit_rate: float  # with that capacity


@dataclass(frozen=True)
class PrefixCacheAnalysis:
    by_tenant: tuple[CacheGroup, ...]
    by_model: tuple[CacheGroup, ...]
    by_system_prompt: tuple[CacheGroup, ...]
    busting: tuple[CacheBusting, ...]
    billing: Billing
    block_size: int
    by_tier: tuple[TierHits, ...] = ()
    capacity: tuple[CapacityWhatIf, ...] = ()
    tiers_not_analysed: tuple[str, ...] = ()  # engines without tier attributes, and why
    busting_unchecked: str | None = None  # why cache busting could not be looked for (None: it was)
    uncounted: tuple[tuple[str, int], ...] = ()  # per model, requests without a cached-token count (vLLM's, TGI's
    # spans have none): left out of the hit rates and busting, billed as uncached


def _groups(df: pd.DataFrame, column: str) -> tuple[CacheGroup, ...]:
    g = df.dropna(subset=[column]).groupby(column, sort=True)
    agg = g.agg(requests=("input_tokens", "size"), input_tokens=("input_tokens", "sum"),
                cached_tokens=("cached_tokens", "sum"))
    return tuple(CacheGroup(str(k), int(r.requests), int(r.input_tokens), int(r.cached_tokens),
                            float(round(r.cached_tokens / r.input_tokens, 4)) if r.input_tokens else 0.0)
                 for k, r in agg.iterrows())


def analyze_prefix_cache(store: Store, prices: PriceTable | None = None, block_size: int = 16,
                         busting_max_full_hit_rate: float = 0.5, min_requests: int = 5,
                         bucket_s: float = 60.0) -> PrefixCacheAnalysis:
    """Cache busting is looked for per time bucket (it may start mid-run); consecutive busted buckets of one
    tenant and system prompt are reported as one finding."""
    prices = prices or PriceTable()
    df = store.sql("SELECT request_id, model, tenant, instance, arrival_ns, input_tokens, "
                   "coalesce(cached_tokens, 0) AS cached_tokens, cached_tokens IS NOT NULL AS counted, "
                   "coalesce(output_tokens, 0) AS output_tokens, system_prompt_id, system_prompt_tokens "
                   "FROM requests WHERE outcome = 'ok' AND input_tokens IS NOT NULL ORDER BY arrival_ns").df()
    cost = cost_plain = 0.0
    for model, rows in df.groupby("model"):
        p = prices.price(str(model))
        inp, cached, out = rows["input_tokens"].sum(), rows["cached_tokens"].sum(), rows["output_tokens"].sum()
        cost += ((inp - cached) * p.input_per_mtok + cached * p.cached_input_per_mtok + out * p.output_per_mtok) / 1e6
        cost_plain += (inp * p.input_per_mtok + out * p.output_per_mtok) / 1e6
    billing = Billing(int(df["input_tokens"].sum()), int(df["cached_tokens"].sum()), int(df["output_tokens"].sum()),
                      float(round(cost, 6)), float(round(cost_plain, 6)), float(round(cost_plain - cost, 6)))

    uncounted = df[~df["counted"]].groupby("model", sort=True).size()
    counted = df[df["counted"]]  # a request whose spans give no cached-token count hit nothing known
    sp = counted.dropna(subset=["system_prompt_id"]).copy()
    sp = sp[sp["system_prompt_tokens"] >= block_size]
    sp["whole"] = (sp["system_prompt_tokens"] // block_size) * block_size
    # Only requests after the prompt was first seen on the same instance can hit.
    sp = sp[sp.duplicated(subset=["instance", "system_prompt_id"], keep="first")]
    sp["full_hit"] = sp["cached_tokens"] >= sp["whole"]
    width = round(bucket_s * 1e9)
    sp["bucket"] = sp["arrival_ns"] // width
    busting = []
    for (tenant, prompt), rows in sp.groupby(["tenant", "system_prompt_id"], sort=True):
        others = sp[sp["tenant"] != tenant]
        other_rate = float(others["full_hit"].mean()) if len(others) else None
        per_bucket = rows.groupby("bucket")["full_hit"].agg(["mean", "size"])
        bad = per_bucket[(per_bucket["size"] >= min_requests) & (per_bucket["mean"] <= busting_max_full_hit_rate)]
        if other_rate is not None and other_rate <= busting_max_full_hit_rate:
            bad = bad.iloc[0:0]  # nobody hits: a cold or disabled cache, not one tenant's prompts
        runs: list[list[int]] = []
        for b in bad.index:
            if runs and b == runs[-1][-1] + 1:
                runs[-1].append(int(b))
            else:
                runs.append([int(b)])
        for run in runs:
            hit = rows[rows["bucket"].isin(run)]
            lost = int((hit["whole"] - hit["cached_tokens"]).clip(lower=0).sum())
            price = prices.price(str(hit["model"].iloc[0]))
            busting.append(CacheBusting(
                str(tenant), str(prompt), int(hit["system_prompt_tokens"].iloc[0]), run[0] * width,
                (run[-1] + 1) * width, len(hit), int(hit["full_hit"].sum()), round(float(hit["full_hit"].mean()), 4),
                None if other_rate is None else round(other_rate, 4), lost,
                round(lost * (price.input_per_mtok - price.cached_input_per_mtok) / 1e6, 6)))
    by_tier, capacity = _tiers(store)
    silent = sorted(set(df["instance"].dropna()) - {t.instance for t in by_tier})
    notes = tuple(f"{i}: no KV tier and no reuse accounting; hits by tier and what capacity would buy are not "
                  f"reported (infertrace.prefill.kv_* attributes)" for i in silent)
    return PrefixCacheAnalysis(_groups(counted, "tenant"), _groups(counted, "model"),
                               _groups(counted, "system_prompt_id"), tuple(busting), billing, block_size, by_tier,
                               capacity, notes, _busting_unchecked(counted),
                               tuple((str(m), int(n)) for m, n in uncounted.items()))


def _busting_unchecked(df: pd.DataFrame) -> str | None:
    """Why cache busting could not be looked for in these requests: it compares a tenant's hits on a named system
    prompt with everybody else's, so a store whose spans name no system prompt, or no tenant, cannot show one."""
    named = df["system_prompt_id"].notna()
    if df.empty:
        return "it needs each request's cached-token count, and no span gives one"
    if not named.any():
        return ("it needs each request's system prompt (infertrace.request.system_prompt.id and .tokens), and no "
                "span names one")
    if not df.loc[named, "tenant"].notna().any():
        return "it needs each request's tenant, and no request naming a system prompt names one"
    return None


def _rate(part: float, whole: float) -> float:
    return float(round(part / whole, 4)) if whole else 0.0


def _tiers(store: Store) -> tuple[tuple[TierHits, ...], tuple[CapacityWhatIf, ...]]:
    rows = store.sql(query_text("prefix_cache_tiers")).df()
    by_tier, capacity = [], []
    for instance, r in rows.groupby("instance", sort=True):
        e = r.iloc[0]
        model, block_size = str(e["model"]), int(e["block_size"] or 16)
        inputs = int(r["input_tokens"].sum())
        device, host, remote = (int(r[c].sum()) for c in ("device_tokens", "host_tokens", "remote_tokens"))
        hits = device + host + remote
        blocks = [int(e[c] or 0) for c in ("gpu_blocks", "host_tier_blocks", "remote_tier_blocks")]
        by_tier.append(TierHits(str(instance), model, len(r), inputs, device, host, remote, _rate(hits, inputs),
                                _rate(device, inputs), _rate(host, inputs), _rate(remote, inputs), *blocks,
                                float(e["load_ns"]) / 1e9, int(r["evicted_tokens"].sum())))
        shape = MODELS.get(model)
        block_gb = shape.kv_bytes_per_token * block_size / 1e9 if shape else None
        total = sum(blocks)
        reuse, evicted = r["evicted_reuse_blocks"].to_numpy(), r["evicted_tokens"].to_numpy()
        for extra in [*(round(total * f) for f in (0.5, 1, 2, 4, 8)), None]:
            kept = evicted if extra is None else evicted[(reuse > 0) & (reuse <= extra)]
            added = int(kept.sum())
            capacity.append(CapacityWhatIf(str(instance), extra, None if extra is None or block_gb is None
                                           else round(extra * block_gb, 3), added, _rate(hits + added, inputs)))
    return tuple(by_tier), tuple(capacity)
