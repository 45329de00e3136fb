"""Prefix cache: hit rates by tenant and by system prompt (runbook queries `prefix_cache_by_tenant` and
`prefix_cache_by_system_prompt`)."""

from __future__ import annotations

import altair as alt
import results
import streamlit as st

root, snap = results.current()
st.title("Prefix cache")

by_tenant = results.runbook(root, snap, "prefix_cache_by_tenant", ())
st.subheader("Hit rate by tenant and model")
st.altair_chart(alt.Chart(by_tenant).mark_bar().encode(
    x=alt.X("hit_rate:Q", title="share of prompt tokens from the prefix cache", scale=alt.Scale(domain=[0, 1])),
    y=alt.Y("tenant:N", title=None), color="model:N", yOffset="model:N",
    tooltip=["tenant", "model", "requests", "input_tokens", "cached_tokens", "hit_rate"],
).properties(height=60 + 24 * len(by_tenant)), width="stretch")
st.dataframe(by_tenant, hide_index=True, width="stretch", key="cache_by_tenant")

st.subheader("Hit rate by system prompt")
by_prompt = results.runbook(root, snap, "prefix_cache_by_system_prompt", ())
st.dataframe(by_prompt, hide_index=True, width="stretch", key="cache_by_prompt")
st.caption("A system prompt whose hit rate is far below its siblings' is being busted (fresh tokens before "
           "it, or a router that spreads its tenant over replicas).")
