"""Fleet overview: TTFT, ITL and E2E percentiles per model (whole store and over time) against the SLO
targets, from `infertrace.analyzers.slo`; drill down into a model's ITL spikes."""

from __future__ import annotations

import altair as alt
import charts
import pandas as pd
import results
import streamlit as st

from infertrace.analyzers.slo import UNCHECKED
from infertrace.report.layout import slo_source

SEVERITY_COLOURS = {"ok": "#dcfce7", "warning": "#fef3c7", "critical": "#fde2e1"}

root, snap = results.current()
summary = results.slo(root, snap)
coverage = results.coverage(root, snap)

st.title("Fleet overview")
missing = [a for a in coverage.analyses if not a.supported]
# what the spans get wrong (clocks, instance ids, trace context, environments, …): shown, not folded away
problems = coverage.problems()
with st.expander("What this store can answer" + (f" ({len(missing)} analyses not possible)" if missing else ""),
                 expanded=bool(missing or problems)):
    for line in coverage.sentences():
        (st.warning if line in problems else st.markdown)(line)
    for a in missing:
        st.warning(f"{a.title}: {a.detail}")
source = slo_source({m.model: m.gateway_requests for m in summary.models}, {f.model for f in coverage.propagation})
st.caption(f"TTFT and E2E {source}; ITL between consecutive tokens. Targets: "
           + ", ".join(f"{t.key} ≤ {t.threshold:g}" for t in summary.targets)
           + f"; critical at {summary.critical_ratio:g}× a target.")
if not summary.models:
    st.info(coverage.analysis("slo").detail if coverage.entries_without_model else "No requests in the store yet.")
    st.stop()

table = pd.DataFrame([{
    "model": m.model, "slo": m.severity, "requests": m.gateway_requests,
    "ttft p50 ms": m.ttft.p50_ms, "ttft p95 ms": m.ttft.p95_ms, "ttft p99 ms": m.ttft.p99_ms,
    "itl p50 ms": m.itl.p50_ms, "itl p95 ms": m.itl.p95_ms, "itl p99 ms": m.itl.p99_ms,
    "e2e p50 ms": m.e2e.p50_ms, "e2e p95 ms": m.e2e.p95_ms, "e2e p99 ms": m.e2e.p99_ms,
    "error rate": m.error_rate, "429 rate": m.rejected_rate,
} for m in summary.models])
milliseconds = {c: st.column_config.NumberColumn(format="%.1f") for c in table.columns if c.endswith(" ms")}
rates = {c: st.column_config.NumberColumn(format="%.4f") for c in ("error rate", "429 rate")}
st.dataframe(table.style.map(lambda v: f"background-color: {SEVERITY_COLOURS.get(v, '')}", subset=["slo"]),
             hide_index=True, width="stretch", key="slo_table", column_config={**milliseconds, **rates})
breaches = [f"{m.model}: {c.target.key} {c.observed:.4g} > {c.target.threshold:g} ({c.severity})"
            for m in summary.models for c in m.checks if c.severity in ("warning", "critical")]
for line in breaches:
    st.warning(line)
unchecked: dict[str, list[str]] = {}  # why -> "model: key"
for m in summary.models:
    for c in m.unchecked:
        unchecked.setdefault(UNCHECKED[c.target.metric], []).append(f"{m.model} {c.target.key}")
for why, what in unchecked.items():
    st.info(f"Not checked ({why}): {', '.join(what)}. The slo column is the worst of the checks made.")

left, right = st.columns(2)
metric = left.selectbox("Metric", ["ttft", "itl", "e2e"], format_func=str.upper, key="fleet_metric")
quantile = right.selectbox("Percentile", ["p99", "p95", "p50"], key="fleet_quantile")
key = f"{metric}_{quantile}_ms"
series = pd.DataFrame([{"time": charts.utc(b.start_ns), "model": b.model, "ms": b.percentiles_ms.get(key),
                        "requests": b.requests, "over SLO": key in b.breached} for b in summary.buckets])
target = next((t.threshold for t in summary.targets if t.key == key), None)
lines = alt.Chart(series).mark_line().encode(x=charts.time_x("time"), y=alt.Y("ms:Q", title=key),
                                             color="model:N")
points = alt.Chart(series).mark_circle(size=50).encode(
    x=charts.time_x("time"), y="ms:Q", color=alt.Color("over SLO:N", scale=alt.Scale(domain=[False, True],
                                                                                      range=["#9ca3af", "#dc2626"])),
    tooltip=["model", charts.time_tooltip("time", "bucket start (UTC)"), "ms:Q", "requests:Q", "over SLO:N"])
layers = [lines, points]
if target is not None:
    layers.append(alt.Chart(pd.DataFrame({"target": [target]})).mark_rule(strokeDash=[4, 4], color="#dc2626")
                  .encode(y="target:Q"))
st.altair_chart(alt.layer(*layers).resolve_scale(color="independent").properties(height=320), width="stretch")
st.caption(f"{summary.bucket_ns / 1e9:g} s buckets; red points exceed the target.")

st.subheader("Drill down")
model = st.selectbox("Model", [m.model for m in summary.models], key="drill_model")
if st.button("ITL spikes of this model →", key="drill_itl"):
    st.session_state["itl_model"] = model
    st.switch_page("views/itl_spikes.py")
