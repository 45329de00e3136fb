"""Runs a runbook query on a store: values bound as DuckDB parameters, never formatted into the SQL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import duckdb
import pandas as pd
from rich.table import Table

from infertrace.runbook.catalog import Query, RunbookError, get_query
from infertrace.runbook.explain import notes
from infertrace.terminal import plain_text, rich_table

if TYPE_CHECKING:
    from infertrace.store.store import Store


def run_query(store: Store, query: str | Query, values: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The query's rows. `values` maps parameter names to command-line text or Python values; missing
    optional parameters take their defaults. Raises RunbookError for unknown names or bad values."""
    q = get_query(query) if isinstance(query, str) else query
    bound = q.bind(values or {})
    try:
        return store.sql(q.sql, params=bound).df()
    except duckdb.Error as e:
        raise RunbookError(f"query {q.name} failed: {e}") from e


def answer_notes(store: Store, query: str | Query, values: Mapping[str, Any] | None, rows: int) -> list[str]:
    """What the query's answer with `values` (`rows` rows) could not draw on in this store, and with no rows why
    not (`explain.notes`): to print beside the answer."""
    q = get_query(query) if isinstance(query, str) else query
    return notes(store, q, q.bind(values or {}), rows)


FORMATS = ("table", "markdown", "csv", "json")


def _cell(value: Any) -> Any:
    """A JSON-ready cell: timestamps as ISO 8601 (nanoseconds kept), missing values as None."""
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [_cell(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, str):  # numpy scalars and arrays
        return _cell(value.tolist())
    if value is None or (isinstance(value, float) and value != value) or value is pd.NA or value is pd.NaT:
        return None
    return value


def rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): _cell(v) for k, v in record.items()} for record in frame.to_dict(orient="records")]


def _text(value: Any) -> str:
    cell = _cell(value)
    if cell is None:
        return ""
    if isinstance(cell, list):
        return ", ".join(map(str, cell))
    return str(cell)


def frame_table(frame: pd.DataFrame) -> Table:
    """The rows as a rich table (numbers right-aligned), for printing on a terminal."""
    header = [str(c) for c in frame.columns]
    body = ([_text(v) for v in record] for record in frame.itertuples(index=False, name=None))
    return rich_table(header, body, [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns])


def format_frame(frame: pd.DataFrame, fmt: str) -> str:
    """The rows as `table` (a rich table as plain text), `markdown`, `csv` or `json` (a list of objects)."""
    import json

    if fmt == "json":
        return json.dumps(rows(frame), indent=1, default=str)
    if fmt == "csv":
        return frame.to_csv(index=False)
    header = [str(c) for c in frame.columns]
    body = [[_text(v) for v in record] for record in frame.itertuples(index=False, name=None)]
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |" for line in body]
        return "\n".join(lines)
    if fmt == "table":
        return plain_text([frame_table(frame)]).rstrip("\n")
    raise RunbookError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
