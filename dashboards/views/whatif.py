"""What if: replays of a captured window under other engine configs, kept in the store by `infertrace replay`
(infertrace.replay.saved). Pick an incident (its window and models), pick a kept replay and the variants to
compare, and see their TTFT, ITL and E2E distributions beside the capture's. The dashboard never runs the engine:
for an incident without a replay it shows the command that makes one."""

from __future__ import annotations

import altair as alt
import pandas as pd
import results
import streamlit as st

from infertrace.replay.compare import COLUMNS
from infertrace.replay.saved import load_whatifs
from infertrace.report.model import iso

root, snap = results.current()
st.title("What if")
docs = load_whatifs(root)
report = results.rca(root, snap)

incident = None
if report.diagnoses:
    incident = st.selectbox("Incident", [None, *report.diagnoses], key="whatif_incident",
                            format_func=lambda d: "any window" if d is None else d.incident.sentence())
if incident is not None:
    lo, hi = incident.window_ns
    overlapping = [d for d in docs if d["model"] in incident.incident.models
                   and (d["window"]["since_ns"] or lo) < hi and (d["window"]["until_ns"] or hi) > lo]
    if not overlapping:
        st.info("No replay kept for this incident's window yet. Replay its traffic (each model in turn) with:")
        for model in incident.incident.models:
            st.code(f"infertrace replay --store {root} --model {model} --since {iso(lo)} --until {iso(hi)} "
                    "--set chunk=512 --set replicas=2", language="bash")
    docs = overlapping or docs

if not docs:
    st.warning("This store keeps no what-if replay: nothing to compare. Run `infertrace replay --store "
               f"{root} --model MODEL --set chunk=512` (it keeps its result here).")
    st.stop()

doc = st.selectbox("Replay", docs, key="whatif_replay", format_func=lambda d: (
    f"{d['model']}, {iso(d['window']['since_ns']) or 'start'} to {iso(d['window']['until_ns']) or 'end'}, "
    f"{d['requests']} requests, {len(d['variants'])} variants"))
trust = doc["trust"]
if trust["trustworthy"]:
    st.success(trust["sentence"])
else:
    st.warning(trust["sentence"])
st.caption(("Calibrated cost model. " if doc["calibrated"] else "Uncalibrated roofline cost model. ")
           + f"Captured config (from the {doc['config_source']}): {doc['baseline']['label']}")

names = [v["name"] for v in doc["variants"]]
chosen = st.multiselect("Variants", names, default=names, key="whatif_variants")
rows = [("captured", doc["observed"]), ("baseline replay", doc["baseline"]["predicted"])]
rows += [(v["name"], v["predicted"]) for v in doc["variants"] if v["name"] in chosen]
for v in doc["variants"]:
    if v["name"] in chosen and v.get("untrustworthy"):
        st.warning(f"{v['name']}: {v['untrustworthy']}")

table = pd.DataFrame([{"config": name, **{label: d[key] for label, key in COLUMNS},
                       "output tok/s": d["output_tokens_per_s"], "KV peak": d["kv_peak"],
                       "preemptions": d["preemptions"]} for name, d in rows])
st.dataframe(table, hide_index=True, width="stretch")

metric = st.radio("Distribution", ["itl", "ttft", "e2e"], horizontal=True, key="whatif_metric",
                  format_func=str.upper)
points = pd.DataFrame([{"config": name, "quantile": q, "ms": v}
                       for name, d in rows
                       for q, v in zip(doc["quantiles"], d["quantiles_ms"].get(metric, []), strict=False)])
if points.empty:
    st.info(f"The capture holds no {metric.upper()} samples to plot (e.g. no engine step spans for ITL).")
else:
    st.altair_chart(alt.Chart(points).mark_line(point=True).encode(
        x=alt.X("ms:Q", scale=alt.Scale(type="log"), title=f"{metric.upper()} (ms, log scale)"),
        y=alt.Y("quantile:Q", title="share of " + ("tokens" if metric == "itl" else "requests") + " at or below"),
        color=alt.Color("config:N", title=None), tooltip=["config", "quantile", "ms"],
    ), width="stretch", key="whatif_cdf")
for note in doc["notes"]:
    st.caption(f"note: {note}")
