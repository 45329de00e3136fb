"""What a runbook query's answer could not draw on, from what the store holds: so that "no rows" never reads as
"nothing wrong", and a partial answer says which of its columns had nothing to come from.

A query reads some of the store's relations (found by DuckDB's own parser, `json_serialize_sql`, so a query
added or changed needs nothing declared); each relation is filled by certain spans (`FILLED_BY`). `notes` says:

- which relations the query reads hold nothing in this store, what would have filled them, and whose engine spans
  the store does hold (SGLang, TGI and vLLM export no engine step spans) — with rows or without, since the columns
  a query takes from an empty relation are empty too (of relations the query names as alternative sources of its
  rows, its `either` line, only when all of them are empty);
- with no rows only: a parameter naming a request, engine instance, model or tenant that the store does not hold
  (with the closest it does), a window outside the store's time range; else that the inputs are there and nothing
  matched the query's conditions.

    for note in notes(store, query, query.bind(values), len(frame)):
        print(note)
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

import duckdb

from infertrace.runbook.catalog import Query

if TYPE_CHECKING:
    from infertrace.store.store import Store

_STEP_SPANS = ("engine_step spans (one per engine step; this project's engine emits them, vLLM, SGLang and TGI "
               "export none)")
_TOKEN_TIMES = ("per-token times: engine_step spans, or SGLang's decode_loop or TGI's send_generation spans (vLLM "
                "exports none; `infertrace ingest --client-tokens` adds a streaming client's)")
# What fills each relation a query may read (infertrace/store/relations/*.sql say how).
FILLED_BY: dict[str, str] = {
    "spans": "spans of any kind",
    "requests": ("engines' request spans (llm_request, vLLM's, SGLang's, TGI's); a gateway's entry span adds the "
                 "client's view of a request that reached an engine, and makes no row alone"),
    "request_legs": "engines' request spans (llm_request, vLLM's, SGLang's, TGI's)",
    "steps": _STEP_SPANS,
    "step_membership": _STEP_SPANS,
    "token_runs": _TOKEN_TIMES,
    "tokens": _TOKEN_TIMES,
    "component_calls": ("spans of the components around the engines: a gateway's entry span and the calls made "
                        "beside the engine (auth, rate limiter, router, queue) and KV transfers, in the requests' "
                        "traces"),
    "client_tokens": "a streaming client's token times (`infertrace ingest --client-tokens`)",
    "iteration_log": "vLLM's iteration log (`infertrace ingest` of its log files)",
}
# Parameters that name something the store holds: where to look for it, and what to call it.
NAMED: dict[str, tuple[str, str]] = {
    "request_id": ("SELECT DISTINCT request_id FROM requests", "request"),
    "instance": ("SELECT DISTINCT instance FROM request_legs UNION SELECT DISTINCT instance FROM steps",
                 "engine instance"),
    "model": ("SELECT DISTINCT model FROM requests", "model"),
    "tenant": ("SELECT DISTINCT tenant FROM requests", "tenant"),
}


@cache
def relations_read(sql: str) -> tuple[str, ...]:
    """The relations (tables and views, not the query's own CTEs) that `sql` reads, sorted."""
    tree = json.loads(duckdb.connect().execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if tree.get("error"):
        raise ValueError(f"cannot parse the query: {tree.get('error_message')}")
    tables: set[str] = set()
    ctes: set[str] = set()
    for node in _nodes(tree):
        if node.get("type") == "BASE_TABLE" and node.get("table_name"):
            tables.add(node["table_name"])
        if isinstance(node.get("cte_map"), dict):
            ctes.update(entry["key"] for entry in node["cte_map"].get("map", []))
    return tuple(sorted(tables - ctes))


def _nodes(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


def notes(store: Store, query: Query, bound: Mapping[str, Any], rows: int) -> list[str]:
    """What the answer (`rows` rows of `query` run with `bound`, its parameters as `Query.bind` gives them) could
    not draw on in this store, and with no rows why not, as far as the store can tell; [] when nothing is amiss."""
    read = relations_read(query.sql)
    window = _window(store)
    empty = [r for r in read if not _has_rows(store, r)]
    if query.either and not set(query.either) <= set(empty):  # one of the alternative sources has rows
        empty = [r for r in empty if r not in query.either]
    said: list[str] = []  # with no rows: the likelier causes first (a mistyped name, a window off the data)
    inputs: list[str] = []
    if empty:
        by_filler: dict[str, list[str]] = {}
        for r in empty:
            by_filler.setdefault(FILLED_BY.get(r, "its own spans"), []).append(r)
        fillers = (f"{'it is' if len(empty) == 1 else 'they are'} filled by {next(iter(by_filler))}"
                   if len(by_filler) == 1 else
                   "; ".join(f"{_join(names)} by {filler}" for filler, names in by_filler.items()))
        inputs.append(f"{_join(empty)} {'is' if len(empty) == 1 else 'are'} empty in this store"
                      + (f", so the answer draws nothing from {'it' if len(empty) == 1 else 'them'}" if rows else "")
                      + f": {fillers}." + _engine_sources(store))
    if rows:
        return [*window, *inputs]
    for name, (sql, what) in NAMED.items():
        value = bound.get(name)
        if value is None:
            continue
        known = [str(v[0]) for v in store.sql(sql).fetchall() if v[0] is not None]
        if str(value) not in known:
            close = difflib.get_close_matches(str(value), known, n=3, cutoff=0.5)
            listed = f": {', '.join(sorted(known)[:5])}{', …' if len(known) > 5 else ''}" if known else ""
            hint = f"; did you mean {', '.join(close)}?" if close else f"; it holds {len(known)}{listed}"
            said.append(f"{name} {value!r}: no {what} of that name in this store{hint}")
    for need in query.needs:
        if need.relation not in empty and not _has_rows(store, need.relation, need.condition):
            inputs.append(f"this store holds none of what the query summarises, {need.description}: no row of "
                          f"`{need.relation}` has {need.condition}")
    since, until = bound.get("since"), bound.get("until")
    if since is not None or until is not None:
        lo, hi = store.sql("SELECT min(start_ns), max(end_ns) FROM spans").fetchall()[0]
        if lo is not None and ((until is not None and until <= lo) or (since is not None and since > hi)):
            from infertrace.report.model import iso

            said.append(f"the window {iso(since) or '…'} to {iso(until) or '…'} holds none of the store's spans, "
                        f"which run from {iso(lo)} to {iso(hi)}")
    said += inputs
    if not said:
        said.append(f"{_join(list(read))} {'holds' if len(read) == 1 else 'hold'} rows in this store and the "
                    f"parameters name what {'it holds' if len(read) == 1 else 'they hold'}, but nothing matched the "
                    "query's conditions")
    return [*said, *window]


def _window(store: Store) -> list[str]:
    """What an analysis window left out of the store the query read (`Store.open(window_s=…)`), else []."""
    window_s = getattr(store, "window_s", None)
    if window_s is None:
        return []
    from infertrace.store.store import window_phrase

    return [f"queried an analysis window, {window_phrase(window_s)}: {store.segments_left_out()} older segments "
            "left out, so nothing before it is in this answer"]


def _has_rows(store: Store, relation: str, condition: str = "true") -> bool:
    return bool(store.sql(f"SELECT EXISTS (SELECT 1 FROM {relation} WHERE {condition})").fetchall()[0][0])


def _engine_sources(store: Store) -> str:
    """' This store's engine spans are from SGLang (12 request spans).' (or that it holds none)."""
    from infertrace.sources.capabilities import SOURCE_TITLES

    counts = store.sql("SELECT source, count(*) FROM request_legs GROUP BY source ORDER BY count(*) DESC, source"
                       ).fetchall()
    if not counts:
        return " This store holds no engine request span."
    return " This store's engine spans are from " + ", ".join(
        f"{SOURCE_TITLES.get(str(s), str(s))} ({n} request span{'' if n == 1 else 's'})" for s, n in counts) + "."


def _join(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
