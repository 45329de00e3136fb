"""The same spans in a local store and in ClickHouse's `otel_traces` (chdb, in this process), for the tests that
hold the two backends to the same answers.

chdb runs one embedded server per process on one data directory: every data set of the test session is a
database of its own in one directory, removed when the process exits.
"""

from __future__ import annotations

import functools
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from infertrace.analyzers import itl, query_text, slo
from infertrace.store.clickhouse.pushdown import plain_columns, relations_read
from infertrace.store.clickhouse.store import ClickHouseStore, export_rows
from infertrace.store.store import Store
from tests.incident_stores import sample_store

_CHDB = tempfile.TemporaryDirectory(prefix="infertrace-test-chdb-")


def chdb_dir() -> Path:
    """The session's chdb data directory (the one this process may use)."""
    return Path(_CHDB.name)


def chdb_url(name: str) -> str:
    """A chdb URL of its own database for a data set named `name`."""
    return f"chdb://{_CHDB.name}?database={re.sub(r'[^A-Za-z0-9_]', '_', name)}"


@functools.cache
def exported(store_dir: str, name: str) -> str:
    """The URL of a chdb database holding the spans of a local store, written as the exporter writes them."""
    url = chdb_url(name)
    with Store.open(store_dir) as store:
        export_rows(store, url)
    return url


def sample_in_clickhouse(sample: str) -> tuple[str, str]:
    """(local store directory, chdb URL) of a sample incident."""
    local = str(sample_store(sample).store)
    return local, exported(local, f"sample_{sample}")


_BANK = tempfile.TemporaryDirectory(prefix="infertrace-test-bank-")


@functools.cache
def bank_in_clickhouse(seed: int = 3, count: int = 3, duration_s: float = 120.0) -> tuple[tuple[str, str, str], ...]:
    """(scenario, local store directory, chdb URL) of every scenario of a generated bank (`generate(bank(...))`,
    the scenarios `evaluate` scores), each ingested into a local store and written into chdb."""
    import json

    from infertrace.store.ingest import ingest_paths
    from reference_engine.scenarios.bank import bank, generate

    root = Path(_BANK.name) / f"bank-{seed}-{count}-{duration_s:g}"
    generate(bank(seed=seed, count=count, duration_s=duration_s), root)
    out = []
    for truth_file in sorted(root.glob("*/ground_truth.json")):
        truth = json.loads(truth_file.read_text(encoding="utf-8"))
        store = truth_file.parent / "store"
        ingest_paths(store, [truth_file.parent / truth["traces"]])
        name = truth_file.parent.name
        out.append((name, str(store), exported(str(store), f"bank_{seed}_{name}")))
    return tuple(out)


# The DuckDB text of each aggregation that has a ClickHouse form, as the analyzers run it (after
# `itl._register`, which the ITL analysis runs first on a local store), with the parameters it is checked with.
_SLO_SELECTION = {"since": None, "until": None, "model": None, "tenant": None}


def clickhouse_relation_rows(clickhouse: ClickHouseStore, relation: str, like: pa.Table) -> pa.Table:
    """The rows of `relation`'s ClickHouse form (made as the store makes it, with the relations it reads), in
    `like`'s columns and types, ordered by every column: to compare with the DuckDB relation's rows `like`."""
    made = clickhouse.clickhouse_tables(relations_read("{" + relation + "}"))[relation]
    rows = plain_columns(clickhouse.connection.query_arrow(f"SELECT * FROM {made}"))
    assert rows.column_names == like.column_names, relation
    return clickhouse.duckdb.from_arrow(rows.cast(like.schema)).query(
        "got", "SELECT * FROM got ORDER BY ALL").to_arrow_table()


def _an_engine_range(store: Store) -> dict[str, Any]:
    """The stall candidates' parameters for the busiest engine's candidate steps, all in one range."""
    instance, first, last, _ = store.sql(query_text("itl_stall_partitions"), {"steps": 10**9}).fetchall()[0]
    return {"max_gap_steps": itl.ItlParams().max_gap_steps, "instance": instance, "first_step": first,
            "last_step": last}


def _prefill_steps(store: Store) -> dict[str, Any]:
    rows = store.sql("SELECT instance, step_index FROM steps WHERE num_prefills > 0 ORDER BY ALL").fetchall()
    return {"instances": [r[0] for r in rows], "step_indexes": [r[1] for r in rows]}


DUCKDB_FORM: dict[str, tuple[str, Callable[[Store], dict[str, Any]]]] = {
    "itl_decode_steps": (query_text("itl_decode_steps"), lambda _: {}),
    "itl_distribution": (itl.ITL_DISTRIBUTION_SQL, lambda _: {}),
    "slo_requests": (slo.SELECTED_SQL, lambda _: _SLO_SELECTION),
    "slo_itls": (slo.ITLS_SQL, lambda _: {**_SLO_SELECTION, "origin": 0, "width": 10**10}),
    "slo_gateway": (slo.GATEWAY_SQL, lambda _: _SLO_SELECTION),
    "request_outcomes": (query_text("request_outcomes"), lambda _: {}),
    "itl_stall_partitions": (query_text("itl_stall_partitions"), lambda _: {"steps": 7}),
    "itl_stall_candidates": (query_text("itl_stall_candidates"), _an_engine_range),
    "itl_stall_chunks": (query_text("itl_stall_chunks"), _prefill_steps),
    "itl_request_prompts": (itl.ITL_REQUEST_PROMPTS_SQL, lambda store: {"ids": [r[0] for r in store.sql(
        "SELECT request_id FROM requests ORDER BY request_id").fetchall()][::5]}),
}
