"""`infertrace report`: the analyzers' results over a store, as one document (schema `infertrace.report/2`)
rendered as a terminal table, markdown, HTML or JSON. See docs/report.md."""

from infertrace.report.model import SCHEMA_ID, SEVERITIES, ReportOptions, build_report, severity_at_least
from infertrace.report.render import FORMATS, render

__all__ = ["FORMATS", "SCHEMA_ID", "SEVERITIES", "ReportOptions", "build_report", "render", "severity_at_least"]
