"""infertrace dashboard: `infertrace dashboard --store DIR` (or `streamlit run dashboards/app.py -- --store DIR`).

Pages render analyzer and runbook results (dashboards/results.py caches them per store snapshot); while a
collector writes, the sidebar's watcher notices new segments and refreshes the page.
"""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

import results

st.set_page_config(page_title="infertrace", layout="wide")

root = results.store_dir()
try:
    results.window_s()
except ValueError as e:
    st.error(str(e))
    st.stop()
if root is not None and root.is_dir():
    st.session_state["store_dir"] = str(root)
    st.session_state["snapshot"] = results.snapshot(root)

VIEWS = Path(__file__).resolve().parent / "views"
pages = [
    st.Page(VIEWS / "fleet.py", title="Fleet overview", default=True),  # served at /
    st.Page(VIEWS / "itl_spikes.py", title="ITL spikes", url_path="itl"),
    st.Page(VIEWS / "incidents.py", title="Incidents", url_path="incidents"),
    st.Page(VIEWS / "prefix_cache.py", title="Prefix cache", url_path="cache"),
    st.Page(VIEWS / "disaggregation.py", title="Disaggregation", url_path="pd"),
    st.Page(VIEWS / "runbook.py", title="Runbook", url_path="runbook"),
    st.Page(VIEWS / "request.py", title="Request waterfall", url_path="request"),
    st.Page(VIEWS / "whatif.py", title="What if", url_path="whatif"),
]
page = st.navigation(pages)

with st.sidebar:
    if root is None or not root.is_dir():
        st.error(f"No store directory: {root or 'give --store DIR'}")
    else:
        st.caption(f"Store `{root}` · {len(st.session_state['snapshot'])} segments")
        if (window := results.window_note(root, st.session_state["snapshot"])) is not None:
            st.caption(window)
        if (lag := results.behind(root, st.session_state["snapshot"])) is not None:
            st.info(lag)
        live = st.toggle("Refresh when new traces arrive", value=True)
        if live:
            @st.fragment(run_every=5)
            def watch_segments() -> None:
                if results.snapshot(root) != st.session_state.get("snapshot"):
                    st.rerun()

            watch_segments()

page.run()
