"""Incidents (`infertrace.analyzers.rca`): the models × time heatmap of anomaly scores, the topology the
traces show, and each incident's candidate components ranked with their evidence."""

from __future__ import annotations

import altair as alt
import charts
import pandas as pd
import results
import streamlit as st

from infertrace.report.layout import no_incident_sentence, unchecked_sentence
from infertrace.report.model import ReportOptions, incidents_section

root, snap = results.current()
report = results.rca(root, snap)
anomalies = report.anomalies

st.title("Incidents")
coverage = results.coverage(root, snap)
st.caption(coverage.analysis("incidents").detail)
if not (components := coverage.analysis("rca_components")).supported:
    st.info(components.detail)
bucket_ns = round(anomalies.config.bucket_s * 1e9)
cells = pd.DataFrame([{"time": charts.utc(b.bucket_start_ns), "end": charts.utc(b.bucket_start_ns + bucket_ns),
                       "model": b.key, "score": b.score, "metric": b.metric, "requests": b.requests}
                      for b in anomalies.heatmap if b.scope == "model"])
if not cells.empty:
    # Each bucket a cell from its start to its end (x2): on a continuous time axis a rect needs both edges.
    st.altair_chart(alt.Chart(cells).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=charts.time_x("time"), x2=charts.time_x2("end"), y=alt.Y("model:N", title=None),
        color=alt.Color("score:Q", scale=alt.Scale(scheme="reds", domainMin=0), title="anomaly score"),
        tooltip=["model", charts.time_tooltip("time", "bucket start (UTC)"), "score:Q", "metric:N", "requests:Q"],
    ).properties(height=alt.Step(34)), width="stretch", key="incident_heatmap")
    st.caption(f"Robust anomaly score of each model's worst metric per {anomalies.config.bucket_s:g} s bucket; "
               f"a bucket is anomalous at {anomalies.config.threshold:g} or more.")

detection = incidents_section(report, ReportOptions())
caveat = unchecked_sentence(detection["unchecked"], len(detection["models"]))
if not report.diagnoses:
    (st.success if detection["checked"] else st.warning)(no_incident_sentence(detection["checked"]))
if caveat:
    st.warning(caveat)
if report.diagnoses:
    diagnosis = st.selectbox("Incident", list(report.diagnoses), format_func=lambda d: d.incident.sentence(),
                             key="incident")
    st.markdown(diagnosis.incident.sentence())
    for a in diagnosis.incident.anomalies:
        st.markdown(f"- {a.sentence()}")
    st.subheader("Ranked causes")
    if not diagnosis.explained:
        st.warning("Unexplained: no traced component, engine or tenant's load accounts for this incident's troubled "
                   "requests (every score is 0). The candidates below are what the requests passed through, not "
                   "causes; look at what the spans do not show (untraced dependencies, the network, the clients).")
    st.dataframe(pd.DataFrame([{
        "rank": c.rank, "candidate": c.candidate.id, "kind": c.candidate.kind, "score": c.score,
        "ochiai": c.ochiai, "own anomaly": c.own.score, "signal": c.own.what,
        "anomalous through": c.e_f, "anomalous elsewhere": c.n_f, "normal through": c.e_p,
        "serves": ", ".join(c.candidate.models),
    } for c in diagnosis.causes]), hide_index=True, width="stretch", key="causes")
    if diagnosis.causes:
        cause = st.selectbox("Evidence for", list(diagnosis.causes), key="cause",
                             format_func=lambda c: f"#{c.rank} {c.candidate.id}")
        for line in cause.evidence():
            st.markdown(f"- {line}")
    if diagnosis.commonality is not None and diagnosis.commonality.top() is not None:
        st.info(diagnosis.commonality.top().sentence())

st.subheader("Topology")
top = {d.causes[0].candidate.id for d in report.diagnoses if d.explained}
# At most 12 × 4.5 inches (graphviz scales a larger graph down), drawn at its own size: it fits the page.
lines = ["digraph topology {", 'graph [rankdir=LR, size="12,4.5", nodesep=0.15, ranksep=1.2];',
         'node [shape=box, style="rounded,filled", fillcolor="#f8fafc", fontsize=11];',
         "edge [fontsize=9];"]
for node in report.topology.nodes:
    colour = "#fecaca" if node.instance in top else "#f8fafc"
    lines.append(f'"{node.instance}" [label="{node.instance}\\n{node.kind}", fillcolor="{colour}"];')
for model in report.topology.models:
    lines.append(f'"model:{model}" [label="{model}", shape=ellipse, fillcolor="#e0ecff"];')
for edge in report.topology.edges:
    lines.append(f'"model:{edge.model}" -> "{edge.instance}" [label="{edge.requests}"];')
lines.append("}")
st.graphviz_chart("\n".join(lines), width="content")
st.caption("Models (ellipses) and the instances their requests passed through, with request counts; "
           "the top-ranked cause of each incident in red.")
