"""ITL spikes: the steps that stalled decoding requests and the prefills that caused them
(`infertrace.analyzers.itl`), a victim's token timeline with the stall marked, and the engine's step
timeline around it (runbook queries `request_tokens`, `step_timeline_around`).

Deep link: `/itl?engine=<instance>&step=<step index>` opens the stall of that engine step."""

from __future__ import annotations

import altair as alt
import pandas as pd
import results
import streamlit as st

from infertrace.report.model import iso

root, snap = results.current()
st.title("ITL spikes")
if not (possible := results.coverage(root, snap).analysis("itl")).supported:
    st.warning(possible.detail)
    st.stop()
analysis = results.itl(root, snap)

models = sorted({e.model for e in analysis.engines if e.model})
params = st.query_params
wanted_engine, wanted_step = params.get("engine"), params.get("step")
preset = st.session_state.pop("itl_model", None)
if wanted_engine:
    preset = next((e.model for e in analysis.engines if e.instance == wanted_engine), preset)
options = ["all models", *models]
model = st.selectbox("Model", options, index=options.index(preset) if preset in options else 0, key="itl_model_box")

engines = [e for e in analysis.engines if model == "all models" or e.model == model]
st.dataframe(pd.DataFrame([{
    "engine": e.instance, "model": e.model, "policy": e.policy, "itl p50 ms": e.itl_p50_ns / 1e6,
    "itl p99 ms": e.itl_p99_ns / 1e6, "decode step ms": e.decode_step_p50_ns / 1e6,
    "prefill stalls": e.stalls.get("prefill", 0), "recompute stalls": e.stalls.get("recompute", 0),
    "host pauses": e.stalls.get("host_pause", 0), "prefill share of p99 tokens": e.prefill_share_of_p99,
    "p99 without prefill ms": e.itl_p99_without_prefill_ns / 1e6,
    f"p99 with {e.chunk_budget_tokens}-token budget ms": e.itl_p99_with_chunk_budget_ns / 1e6,
} for e in engines]), hide_index=True, width="stretch", key="itl_engines")

stalls = [s for s in analysis.stalls if model == "all models" or s.model == model]
if not stalls:
    st.info("No stalled steps for this selection.")
    st.stop()
worst = sorted(stalls, key=lambda s: (-s.added_ns, s.end_ns, s.instance))
shown = worst[:200]
if wanted_engine and wanted_step is not None:
    linked = [s for s in stalls if s.instance == wanted_engine and str(s.step_index) == str(wanted_step)]
    if linked and linked[0] not in shown:
        shown = [linked[0], *shown]
    elif not linked:
        st.warning(f"No stall at step {wanted_step} of {wanted_engine}; showing the worst.")
st.subheader(f"Stalled steps ({len(stalls)}; worst first)")
st.dataframe(pd.DataFrame([{
    "end": iso(s.end_ns), "engine": s.instance, "step": s.step_index, "duration ms": s.duration_ns / 1e6,
    "decode-only ms": s.decode_only_ns / 1e6, "added ms": s.added_ns / 1e6, "causes": ", ".join(s.causes),
    "culprits": ", ".join(c.request_id for c in s.culprits), "victims": len(s.victims),
} for s in shown[:50]]), hide_index=True, width="stretch", key="itl_stalls",
             column_config={c: st.column_config.NumberColumn(format="%.1f")
                            for c in ("duration ms", "decode-only ms", "added ms")})


def label(s: object) -> str:
    return (f"{s.instance} step {s.step_index} · +{s.added_ns / 1e6:.1f} ms · "  # type: ignore[attr-defined]
            f"{len(s.victims)} victims")  # type: ignore[attr-defined]


default = 0
if wanted_engine and wanted_step is not None:
    default = next((i for i, s in enumerate(shown) if s.instance == wanted_engine
                    and str(s.step_index) == str(wanted_step)), 0)
stall = st.selectbox("Stall", shown, index=default, format_func=label, key="itl_stall")

st.subheader("Culprit")
if stall.culprits:
    for c in stall.culprits:
        kind = "recomputing a preempted request" if c.recompute else "prefill"
        st.markdown(f"**Culprit prefill: `{c.request_id}`** ({kind}) · tenant `{c.tenant}` · "
                    f"{c.chunk_tokens} tokens computed, {c.computed_tokens} already cached · "
                    f"{c.share:.0%} of the step's excess ({c.excess_ns / 1e6:.1f} ms)")
if "host_pause" in stall.causes:
    st.markdown(f"**Host pause** of {stall.pause_ns / 1e6:.1f} ms inside the step.")
st.caption(f"Step {stall.step_index} on {stall.instance} ({stall.policy}) took {stall.duration_ns / 1e6:.1f} ms "
           f"against a decode-only step of {stall.decode_only_ns / 1e6:.1f} ms; it added "
           f"{stall.added_ns / 1e6:.1f} ms to each of its {len(stall.victims)} victims' ITL "
           f"(threshold {stall.threshold_ns / 1e6:.1f} ms).")

victim = st.selectbox("Victim", list(stall.victims), key="itl_victim")
tokens = results.runbook(root, snap, "request_tokens", (("request_id", victim),))
st.subheader(f"Token timeline of {victim}")
marker = pd.DataFrame({"time": [pd.Timestamp(iso(stall.end_ns))]})
token_chart = alt.Chart(tokens).mark_line(point=True).encode(
    x=alt.X("time:T", title=None, axis=alt.Axis(format="%H:%M:%S")), y=alt.Y("itl_ms:Q", title="ITL ms"),
    tooltip=["token_index", "itl_ms", "step_index"])
rule = alt.Chart(marker).mark_rule(color="#dc2626", strokeWidth=2).encode(x="time:T")
st.altair_chart(alt.layer(token_chart, rule).properties(height=260), width="stretch")

st.subheader(f"Engine steps of {stall.instance} around the stall")
steps = results.runbook(root, snap, "step_timeline_around",
                        (("instance", stall.instance), ("at", str(stall.end_ns)),
                         ("window_ms", str(round(stall.duration_ns / 1e6 + 200)))))
steps["stall"] = steps["step_index"] == stall.step_index
st.altair_chart(alt.Chart(steps).mark_bar().encode(
    x=alt.X("step_index:O", title="step"), y=alt.Y("duration_ms:Q", title="step ms"),
    color=alt.Color("stall:N", scale=alt.Scale(domain=[False, True], range=["#94a3b8", "#dc2626"])),
    tooltip=["step_index", "duration_ms", "prefill_tokens", "decode_tokens", "num_decodes", "waiting"],
).properties(height=220), width="stretch")
