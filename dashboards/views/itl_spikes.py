"""ITL spikes: the steps that stalled decoding requests and the prefills that caused them
(`infertrace.analyzers.itl`); per engine, ITL over time as a heatmap with the stalls marked (click one to open
it) and the engine's load over time (runbook `itl_heatmap`, `engine_load_over_time`); for a stall, the culprit
prefill, a victim's token timeline and the engine's steps around it on a UTC time axis (runbook
`request_tokens`, `step_timeline_around`). Request ids link to their waterfall.

Deep link: `/itl?engine=<instance>&step=<step index>` opens the stall of that engine step."""

from __future__ import annotations

import altair as alt
import charts
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
extent = results.slo(root, snap)

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
worst = sorted(stalls, key=lambda s: (-s.added_ns, s.end_ns, s.instance))

# ---------------------------------------------------------------------------------- ITL over time
st.subheader("ITL over time")
names = [e.instance for e in engines]
if not names:
    st.info("No engine steps for this selection: ITL over time needs the engine's step spans.")
    st.stop()
default_engine = wanted_engine if wanted_engine in names else (worst[0].instance if worst else names[0])
engine = st.selectbox("Engine", names, index=names.index(default_engine), key="itl_engine")
span_s = ((extent.end_ns or 0) - (extent.start_ns or 0)) / 1e9
bucket_s = next((b for b in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600) if span_s / b <= 150), 900)
heat = results.runbook(root, snap, "itl_heatmap", (("bucket_s", str(bucket_s)), ("instance", engine)))
marks = pd.DataFrame([{
    "time": charts.utc(s.end_ns), "worst victim itl ms": max(s.victim_itls_ns, default=s.duration_ns) / 1e6,
    "step": s.step_index, "added ms": s.added_ns / 1e6, "victims": len(s.victims), "causes": ", ".join(s.causes),
    "culprits": ", ".join(c.request_id for c in s.culprits),
} for s in stalls if s.instance == engine], columns=["time", "worst victim itl ms", "step", "added ms", "victims",
                                                      "causes", "culprits"])
itl_scale = alt.Scale(type="log", base=2)
cells = alt.Chart(heat).mark_rect().encode(
    x=charts.time_x("bucket_start"), x2=charts.time_x2("bucket_end"),
    y=alt.Y("band_low_ms:Q", scale=itl_scale, title="ITL ms (log scale)"), y2="band_high_ms:Q",
    color=alt.Color("tokens:Q", scale=alt.Scale(type="log", scheme="blues"), title="tokens"),
    tooltip=[charts.time_tooltip("bucket_start", "from (UTC)"), "band_low_ms", "band_high_ms", "tokens",
             "max_itl_ms"])
pick = alt.selection_point(name="stall_pick", fields=["step"], on="click")
points = alt.Chart(marks).mark_point(shape="triangle-down", size=90, filled=True, color="#dc2626").encode(
    x=charts.time_x("time"), y=alt.Y("worst victim itl ms:Q", scale=itl_scale),
    opacity=alt.condition(pick, alt.value(1.0), alt.value(0.5)),
    tooltip=[charts.time_tooltip("time", "stall end (UTC)"), "step", "added ms", "victims", "causes",
             "culprits"]).add_params(pick)
event = st.altair_chart(alt.layer(cells, points).properties(height=300), width="stretch", key="itl_heatmap",
                        on_select="rerun", selection_mode=["stall_pick"])
picked = (event.selection.get("stall_pick") or [{}])[0] if event and event.selection else {}
new_pick = picked.get("step") is not None and (engine, picked["step"]) != st.session_state.get("itl_last_pick")
if new_pick:  # the selection stays on the chart; only a new click moves the page to a stall
    st.session_state["itl_last_pick"] = (engine, picked["step"])
    wanted_engine, wanted_step = engine, str(picked["step"])
    st.query_params["engine"], st.query_params["step"] = wanted_engine, wanted_step
st.caption(f"Tokens of {engine} per {bucket_s} s and ITL band (bands double); red marks: stalled steps at "
           f"their worst victim's ITL. Click a mark to open that stall below.")

load = results.runbook(root, snap, "engine_load_over_time", (("bucket_s", str(bucket_s)), ("instance", engine)))
if not load.empty:
    queue = load.melt(id_vars=["bucket_start"], value_vars=["running_mean", "waiting_max"], var_name="series",
                      value_name="requests")
    queue["series"] = queue["series"].map({"running_mean": "running (mean)", "waiting_max": "waiting (peak)"})
    left, right = st.columns(2)
    left.altair_chart(alt.Chart(queue).mark_line(interpolate="step-after").encode(
        x=charts.time_x("bucket_start"), y=alt.Y("requests:Q", title="requests"),
        color=alt.Color("series:N", title=None, legend=alt.Legend(orient="top")),
        tooltip=[charts.time_tooltip("bucket_start", "from (UTC)"), "series", "requests"],
    ).properties(height=200), width="stretch", key="itl_load_queue")
    kv = alt.Chart(load).mark_line(interpolate="step-after", color="#7c3aed").encode(
        x=charts.time_x("bucket_start"), y=alt.Y("kv_use_max:Q", title="KV use (peak share)", axis=alt.Axis(
            format="%", titleColor="#7c3aed")),
        tooltip=[charts.time_tooltip("bucket_start", "from (UTC)"), "kv_use_max", "preemptions", "busy_share"])
    preempted = alt.Chart(load).mark_bar(color="#f97316", opacity=0.7).encode(
        x=charts.time_x("bucket_start"), y=alt.Y("preemptions:Q", title="preemptions",
                                                 axis=alt.Axis(titleColor="#f97316", orient="right", format="d",
                                                                               tickMinStep=1)))
    right.altair_chart(alt.layer(preempted, kv).resolve_scale(y="independent").properties(height=200),
                       width="stretch", key="itl_load_kv")
    st.caption(f"Engine load of {engine} per {bucket_s} s: requests running and waiting at step ends, the KV "
               f"cache's share of blocks in use, preemptions.")

if not stalls:
    st.info("No stalled steps for this selection.")
    st.stop()
shown = worst[:200]
if wanted_engine and wanted_step is not None:
    linked = [s for s in stalls if s.instance == wanted_engine and str(s.step_index) == str(wanted_step)]
    if linked and linked[0] not in shown:
        shown = [linked[0], *shown]
    elif not linked:
        st.warning(f"No stall at step {wanted_step} of {wanted_engine}; showing the worst.")
st.subheader(f"Stalled steps ({len(stalls)}; worst first)")
st.dataframe(pd.DataFrame([{
    "end (UTC)": iso(s.end_ns), "engine": s.instance, "step": s.step_index, "duration ms": s.duration_ns / 1e6,
    "decode-only ms": s.decode_only_ns / 1e6, "added ms": s.added_ns / 1e6, "causes": ", ".join(s.causes),
    "culprit": charts.request_url(s.culprits[0].request_id) if s.culprits else None,
    "culprits": ", ".join(c.request_id for c in s.culprits), "victims": len(s.victims),
} for s in shown[:50]]), hide_index=True, width="stretch", key="itl_stalls",
             column_config={"culprit": charts.request_link_column("culprit (waterfall)"),
                            **{c: st.column_config.NumberColumn(format="%.1f")
                               for c in ("duration ms", "decode-only ms", "added ms")}})


def label(s: object) -> str:
    return (f"{s.instance} step {s.step_index} · +{s.added_ns / 1e6:.1f} ms · "  # type: ignore[attr-defined]
            f"{len(s.victims)} victims")  # type: ignore[attr-defined]


default = 0
if wanted_engine and wanted_step is not None:
    default = next((i for i, s in enumerate(shown) if s.instance == wanted_engine
                    and str(s.step_index) == str(wanted_step)), 0)
    if new_pick:  # a click on the heatmap opens that stall
        st.session_state["itl_stall"] = shown[default]
stall = st.selectbox("Stall", shown, index=default, format_func=label, key="itl_stall")

st.subheader("Culprit")
if stall.culprits:
    for c in stall.culprits:
        kind = "recomputing a preempted request" if c.recompute else "prefill"
        st.markdown(f"**Culprit prefill: `{c.request_id}`** ({kind}) · tenant `{c.tenant}` · "
                    f"{c.chunk_tokens} tokens computed, {c.computed_tokens} already cached · "
                    f"{c.share:.0%} of the step's excess ({c.excess_ns / 1e6:.1f} ms) · "
                    f"[waterfall]({charts.request_url(c.request_id)})")
if "host_pause" in stall.causes:
    st.markdown(f"**Host pause** of {stall.pause_ns / 1e6:.1f} ms inside the step.")
st.caption(f"Step {stall.step_index} on {stall.instance} ({stall.policy}) took {stall.duration_ns / 1e6:.1f} ms "
           f"against a decode-only step of {stall.decode_only_ns / 1e6:.1f} ms; it added "
           f"{stall.added_ns / 1e6:.1f} ms to each of its {len(stall.victims)} victims' ITL "
           f"(threshold {stall.threshold_ns / 1e6:.1f} ms).")

victim = st.selectbox("Victim", list(stall.victims), key="itl_victim")
st.markdown(f"[Waterfall of {victim}]({charts.request_url(victim)})")
tokens = results.runbook(root, snap, "request_tokens", (("request_id", victim),))
st.subheader(f"Token timeline of {victim}")
marker = pd.DataFrame({"time": [charts.utc(stall.end_ns)]})
token_chart = alt.Chart(tokens).mark_line(interpolate="step-before", point=True).encode(
    x=charts.time_x("time", fmt="%H:%M:%S.%L"), y=alt.Y("itl_ms:Q", title="ITL ms (gap before the token)"),
    tooltip=["token_index", charts.time_tooltip("time"), "itl_ms", "step_index"])
rule = alt.Chart(marker).mark_rule(color="#dc2626", strokeWidth=2).encode(x=charts.time_x("time"))
st.altair_chart(alt.layer(token_chart, rule).properties(height=260), width="stretch", key="itl_tokens")
st.caption("Each token's gap to the one before it, held over that gap; the red line is the stalled step's end.")

st.subheader(f"Engine steps of {stall.instance} around the stall")
steps = results.runbook(root, snap, "step_timeline_around",
                        (("instance", stall.instance), ("at", str(stall.end_ns)),
                         ("window_ms", str(round(stall.duration_ns / 1e6 + 200)))))
steps["stall"] = steps["step_index"] == stall.step_index
st.altair_chart(alt.Chart(steps).mark_bar().encode(
    x=charts.time_x("step_start", fmt="%H:%M:%S.%L"), x2=charts.time_x2("step_end"),
    y=alt.Y("duration_ms:Q", title="step ms"),
    color=alt.Color("stall:N", scale=alt.Scale(domain=[False, True], range=["#94a3b8", "#dc2626"])),
    tooltip=["step_index", charts.time_tooltip("step_start", "start (UTC)"), "duration_ms", "prefill_tokens",
             "decode_tokens", "num_decodes", "waiting"],
).properties(height=220), width="stretch", key="itl_steps")
st.caption("Each bar spans its step's start to end; the stalled step in red.")
