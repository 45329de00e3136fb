"""A request's waterfall (runbook `request_waterfall`): its gateway component calls, then the engine request
with its queue, prefill chunks, preemptions, KV transfer and decode, one bar per stage on a UTC time axis, as
a trace viewer draws a trace; below it, the request's token timeline (runbook `request_tokens`).

Deep link: `/request?request_id=<id>`; every dashboard table that lists requests links here."""

from __future__ import annotations

import altair as alt
import charts
import results
import streamlit as st

root, snap = results.current()
st.title("Request waterfall")

wanted = st.query_params.get("request_id", "")
request_id = st.text_input("Request id", value=wanted, key="waterfall_request",
                           help="gen_ai.request.id; tables on the other pages link here").strip()
if not request_id:
    st.info("Give a request id, or open one from a table on the ITL spikes or runbook pages.")
    st.stop()
if request_id != wanted:
    st.query_params["request_id"] = request_id

stages = results.runbook(root, snap, "request_waterfall", (("request_id", request_id),))
if stages.empty:
    newer = (" The pages show an earlier snapshot while newer spans are analysed (sidebar): a request that arrived "
             "since appears once they are." if results.behind(root, snap) else "")
    st.warning(f"No spans of request `{request_id}` in the store (it may be outside it, or the id is mistyped).{newer}")
    st.stop()

stages["label"] = [f"{'› ' * int(d)}{s} · {i}" if i else f"{'› ' * int(d)}{s}"
                   for s, d, i in zip(stages["stage"], stages["depth"], stages["instance"], strict=True)]
total_ms = float((stages["end"].max() - stages["start"].min()).total_seconds() * 1e3)
st.caption(f"{len(stages)} stages over {total_ms:.1f} ms, from {stages['start'].min()} UTC.")
bars = alt.Chart(stages).mark_bar(cornerRadius=2, height={"band": 0.7}).encode(
    x=charts.time_x("start", fmt="%H:%M:%S.%L"),
    x2=charts.time_x2("end"),
    y=alt.Y("label:N", sort=alt.SortField("row"), title=None, axis=alt.Axis(labelLimit=320)),
    color=alt.Color("stage:N", title="stage"),
    tooltip=["stage", "instance", charts.time_tooltip("start"), charts.time_tooltip("end"),
             alt.Tooltip("start_ms:Q", title="starts at ms"), alt.Tooltip("duration_ms:Q", title="ms"), "detail"],
)
st.altair_chart(bars.properties(height=32 * len(stages) + 40), width="stretch", key="waterfall_chart")
moment = st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss.SSS")
st.dataframe(stages.drop(columns=["label"]), hide_index=True, width="stretch", key="waterfall_table",
             column_config={"start": moment, "end": moment})
st.caption("Times in UTC; depth 0 is the gateway and the engine request, › marks what ran inside them.")

tokens = results.runbook(root, snap, "request_tokens", (("request_id", request_id),))
if not tokens.empty:
    st.subheader("Token timeline")
    st.altair_chart(alt.Chart(tokens).mark_line(interpolate="step-before", point=True).encode(
        x=charts.time_x("time"), y=alt.Y("itl_ms:Q", title="ITL ms (gap before the token)"),
        tooltip=["token_index", charts.time_tooltip("time"), "itl_ms", "step_index"],
    ).properties(height=220), width="stretch", key="waterfall_tokens")
