"""The on-call runbook: named, parameterised SQL queries over the store's relations (one `.sql` file each
under `queries/`), runnable from `infertrace query` and the dashboard, documented in RUNBOOK.md."""

from infertrace.runbook.catalog import Parameter, Query, RunbookError, get_query, load_queries, parse_time_ns
from infertrace.runbook.runner import answer_notes, run_query

__all__ = ["Parameter", "Query", "RunbookError", "answer_notes", "get_query", "load_queries", "parse_time_ns",
           "run_query"]
