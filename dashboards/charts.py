"""What every chart shares: time axes and tooltips in UTC (the report's clock, not the browser's), and links to
a request's waterfall page. Formatting only: the numbers come from analyzer and runbook results."""

from __future__ import annotations

from urllib.parse import quote

import altair as alt
import pandas as pd
import streamlit as st

from infertrace.report.model import iso

TIME_FORMAT = "%H:%M:%S"
TOOLTIP_FORMAT = "%Y-%m-%d %H:%M:%S.%L UTC"


def utc(ns: int) -> pd.Timestamp:
    """A nanosecond epoch time as a UTC timestamp for a chart's data."""
    return pd.Timestamp(iso(ns))


def time_x(field: str = "time", title: str = "time (UTC)", fmt: str = TIME_FORMAT, **kwargs: object) -> alt.X:
    """A UTC time axis. Labels are formatted by an expression: the `format` property alone is overridden by
    Vega's own multi-format (12-hour, local) labels in Streamlit's renderer."""
    return alt.X(f"{field}:T", title=title, scale=alt.Scale(type="utc"),
                 axis=alt.Axis(labelExpr=f"utcFormat(datum.value, '{fmt}')", labelAngle=0, labelOverlap=True),
                 **kwargs)


def time_x2(field: str) -> alt.X2:
    return alt.X2(f"{field}:T")


def time_tooltip(field: str, title: str | None = None) -> alt.Tooltip:
    return alt.Tooltip(f"{field}:T", title=title or f"{field} (UTC)", format=TOOLTIP_FORMAT, formatType="utc")


def request_url(request_id: str) -> str:
    """The request page's URL for one request (relative: the same dashboard)."""
    return f"request?request_id={quote(str(request_id))}"


def request_link_column(title: str) -> st.column_config.LinkColumn:
    """A table column of request URLs, shown as the request ids; a click opens the request's waterfall."""
    return st.column_config.LinkColumn(title, display_text=r"request_id=(.*)$",
                                       help="Open the request's waterfall")
