"""Prefix cache (`infertrace.analyzers.prefix_cache`): hit rates by tenant, model and system prompt,
cache-busting tenants, and what prompt caching saved in billed tokens."""

from __future__ import annotations

import altair as alt
import pandas as pd
import results
import streamlit as st

from infertrace.report.model import iso

root, snap = results.current()
st.title("Prefix cache")
if not (possible := results.coverage(root, snap).analysis("prefix_cache")).supported:
    st.warning(possible.detail)
    st.stop()
cache = results.prefix_cache(root, snap)

b = cache.billing
left, middle, right = st.columns(3)
left.metric("Prompt tokens from the cache", f"{b.cached_tokens / b.input_tokens:.1%}" if b.input_tokens else "-")
middle.metric("Cost with cache discounts", f"${b.cost:,.2f}", f"-${b.savings:,.2f} vs no cache", delta_color="inverse")
right.metric("Cost without the cache", f"${b.cost_without_cache:,.2f}")


def groups(items: tuple, key: str) -> pd.DataFrame:
    return pd.DataFrame([{key: g.key, "requests": g.requests, "input tokens": g.input_tokens,
                          "cached tokens": g.cached_tokens, "hit rate": g.hit_rate} for g in items])


by_tenant = groups(cache.by_tenant, "tenant")
st.subheader("Hit rate by tenant")
st.altair_chart(alt.Chart(by_tenant).mark_bar().encode(
    x=alt.X("hit rate:Q", scale=alt.Scale(domain=[0, 1]), title="share of prompt tokens from the prefix cache"),
    y=alt.Y("tenant:N", title=None), tooltip=list(by_tenant.columns),
).properties(height=40 + 28 * len(by_tenant)), width="stretch")
st.dataframe(by_tenant, hide_index=True, width="stretch")

st.subheader("Cache busting")
if cache.busting_unchecked:
    st.warning(f"Cache busting not checked: {cache.busting_unchecked}.")
elif cache.busting:
    st.dataframe(pd.DataFrame([{
        "tenant": x.tenant, "system prompt": x.system_prompt_id, "prompt tokens": x.system_prompt_tokens,
        "from": iso(x.start_ns), "to": iso(x.end_ns), "requests": x.requests, "full-hit rate": x.full_hit_rate,
        "others' full-hit rate": x.other_tenants_full_hit_rate, "lost cached tokens": x.lost_cached_tokens,
        "lost savings $": x.lost_savings} for x in cache.busting]), hide_index=True, width="stretch")
    for x in cache.busting:
        st.warning(f"Tenant {x.tenant}: only {x.full_hits} of {x.requests} requests read the whole "
                   f"{x.system_prompt_tokens}-token system prompt {x.system_prompt_id} from the cache.")
else:
    st.success("No tenant busts the prefix cache.")

left, right = st.columns(2)
left.subheader("By model")
left.dataframe(groups(cache.by_model, "model"), hide_index=True, width="stretch")
right.subheader("By system prompt")
if cache.by_system_prompt:
    right.dataframe(groups(cache.by_system_prompt, "system prompt"), hide_index=True, width="stretch")
else:
    right.info("No request names a system prompt.")

if cache.by_tier:  # engines with a KV tier behind the GPU, or reuse accounting on
    st.subheader("Hit rate by KV tier")
    st.dataframe(pd.DataFrame([{
        "engine": t.instance, "model": t.model, "requests": t.requests, "hit rate": t.hit_rate,
        "GPU": t.device_hit_rate, "host tier": t.host_hit_rate, "remote tier": t.remote_hit_rate,
        "host tier blocks": t.host_tier_blocks, "remote tier blocks": t.remote_tier_blocks, "copy s": t.load_s,
        "evicted tokens recomputed": t.evicted_tokens} for t in cache.by_tier]), hide_index=True, width="stretch")
    st.caption("What more KV capacity would buy (an LRU estimate from the evicted prompt tokens)")
    st.dataframe(pd.DataFrame([{
        "engine": c.instance, "extra blocks": "unbounded" if c.extra_blocks is None else str(c.extra_blocks),
        "extra GB": c.extra_gb, "hit rate": c.hit_rate} for c in cache.capacity]), hide_index=True, width="stretch")
    for note in cache.tiers_not_analysed:
        st.warning(note)
