"""Runbook: run any named query (RUNBOOK.md) with its parameters; values are bound, never formatted into
the SQL."""

from __future__ import annotations

import charts
import results
import streamlit as st

from infertrace.runbook import RunbookError, load_queries

root, snap = results.current()
queries = load_queries()
st.title("Runbook")
name = st.selectbox("Query", list(queries), format_func=lambda n: f"{n}: {queries[n].title}", key="query")
q = queries[name]
st.markdown(f"**Question.** {q.question}\n\n**When.** {q.when}")
examples = q.example_values()
values: dict[str, str] = {}
with st.form(f"params-{name}"):
    for p in q.parameters:
        default = examples.get(p.name, "" if p.required or p.default == "null" else p.default)
        text = st.text_input(f"{p.name} ({p.type}{', required' if p.required else ''})", value=default,
                             help=p.description, key=f"param-{name}-{p.name}")
        if text.strip():
            values[p.name] = text.strip()
    submitted = st.form_submit_button("Run")
if submitted or not q.parameters:
    try:
        frame = results.runbook(root, snap, name, tuple(sorted(values.items())))
    except RunbookError as e:
        st.error(str(e))
    else:
        st.caption(f"{len(frame)} rows; times in UTC")
        for note in results.runbook_notes(root, snap, name, tuple(sorted(values.items())), len(frame)):
            (st.warning if frame.empty else st.info)(note)
        links = {}
        if "request_id" in frame.columns:  # each request opens its waterfall
            frame = frame.assign(waterfall=[charts.request_url(r) if r else None for r in frame["request_id"]])
            links = {"waterfall": charts.request_link_column("waterfall")}
        st.dataframe(frame, hide_index=True, width="stretch", key="runbook_result", column_config=links)
with st.expander("SQL"):
    st.code(q.sql, language="sql")
