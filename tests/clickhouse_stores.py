"""The same spans in a local store and in ClickHouse's `otel_traces` (chdb, in this process), for the tests that
hold the two backends to the same answers.

chdb runs one embedded server per process on one data directory: every data set of the test session is a
database of its own in one directory, removed when the process exits.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

from infertrace.store.clickhouse.store import export_rows
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
