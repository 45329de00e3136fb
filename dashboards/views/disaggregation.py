"""Prefill/decode disaggregation: each disaggregated model's requests (counted once, legs joined), its KV
transfer and the transfer's share of the client TTFT, requests whose legs did not match; the prefill pool
against the decode pool; KV transfer time by link and size; and, for engines on a CPU-only host, the TTFT a GPU
prefill host would give (`infertrace.analyzers.disaggregation`, the runbook's P/D queries)."""

from __future__ import annotations

import pandas as pd
import results
import streamlit as st

root, snap = results.current()
analysis = results.ttft(root, snap).disaggregation

st.title("Prefill/decode disaggregation")
st.caption("A disaggregated request is one request: its prefill leg (prefill worker) and decode leg (decode "
           "worker) are joined, each TTFT phase taken from the leg it belongs to.")
if analysis.models:
    st.dataframe(pd.DataFrame([{
        "model": m.model, "requests": m.requests, "unmatched legs": sum(m.unmatched.values()),
        "kv p50 ms": None if m.kv_transfer_p50_ns is None else m.kv_transfer_p50_ns / 1e6,
        "kv p99 ms": None if m.kv_transfer_p99_ns is None else m.kv_transfer_p99_ns / 1e6,
        "kv share of ttft": m.kv_share_of_ttft,
        "decode queue p50 ms": None if m.decode_queue_p50_ns is None else m.decode_queue_p50_ns / 1e6,
        "first decode p50 ms": None if m.first_decode_p50_ns is None else m.first_decode_p50_ns / 1e6,
        "links": ", ".join(m.links)} for m in analysis.models]), hide_index=True, width="stretch", key="pd_models")
    for m in analysis.models:
        for why, n in m.unmatched.items():
            st.warning(f"{m.model}: {n} requests not fully analysed: {why}.")
    st.subheader("Prefill pool against decode pool")
    st.dataframe(results.runbook(root, snap, "pd_pool_load", ()), hide_index=True, width="stretch", key="pd_pools")
    st.subheader("KV transfer time by link and size")
    st.dataframe(results.runbook(root, snap, "kv_transfer_by_size", ()), hide_index=True, width="stretch",
                 key="pd_sizes")
else:
    st.info("No disaggregated model in this store (no request has a prefill or a decode leg).")
if analysis.gpu_prefill:
    st.subheader("CPU-only hosts: a GPU prefill host in front")
    st.dataframe(pd.DataFrame([{
        "engine": g.instance, "model": g.model, "requests": g.requests, "ttft p50 ms": g.ttft_p50_ns / 1e6,
        "queue + prefill p50 ms": g.prefill_p50_ns / 1e6, "gpu": g.gpu_hardware,
        "predicted ttft p50 ms": None if g.predicted_ttft_p50_ns is None else g.predicted_ttft_p50_ns / 1e6,
        "gpu utilization": g.gpu_utilization} for g in analysis.gpu_prefill]), hide_index=True, width="stretch",
        key="pd_gpu_prefill")
for why in analysis.not_estimated:
    st.warning(f"Not estimated: {why}.")
