"""Scoring analyzers against the ground truth of a scenario bank (`infertrace scenarios generate`).

`EVALUATORS` maps a section name of `infertrace evaluate` to the function that scores that analysis over a
bank directory; each returns a JSON-ready dict and has a `render_*` companion for the table format.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from infertrace.store.store import Store

TRUTH_FILE = "ground_truth.json"
STORE_DIR = "store"
INGESTED_MARKER = "INGESTED"


def scenario_dirs(bank: str | Path) -> list[Path]:
    """The scenario directories of a bank, in name order (each holds a ground-truth file)."""
    root = Path(bank)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such scenario directory")
    dirs = sorted(p.parent for p in root.glob(f"*/{TRUTH_FILE}"))
    if not dirs and (root / TRUTH_FILE).is_file():
        dirs = [root]
    if not dirs:
        raise FileNotFoundError(f"{root}: no scenario with a {TRUTH_FILE} in it")
    return dirs


def load_truth(scenario: Path) -> dict[str, Any]:
    return json.loads((scenario / TRUTH_FILE).read_text(encoding="utf-8"))


def open_scenario_store(scenario: Path) -> Store:
    """The scenario's store (`<scenario>/store`), ingesting its traces (and the client token times and iteration
    logs its telemetry wrote) the first time."""
    truth = load_truth(scenario)
    telemetry = truth.get("telemetry", {})
    tokens = scenario / telemetry["client_tokens"] if telemetry.get("client_tokens") else None
    logs = sorted((scenario / telemetry["iteration_logs"]).glob("*.log")) if telemetry.get("iteration_logs") else []
    return open_ingested_store(scenario / STORE_DIR, scenario / truth.get("traces", "traces.jsonl.gz"), tokens, logs)


def open_ingested_store(store_dir: Path, traces: Path, tokens: Path | None = None,
                        logs: list[Path] | None = None) -> Store:
    """The store of a traces file (and its side inputs), ingesting them unless a finished ingest of them left its
    marker there (re-ingesting adds nothing, so an interrupted one is simply run again)."""
    logs = logs or []
    marker = store_dir / INGESTED_MARKER
    stamp = "".join(f"{p.name} {p.stat().st_size}\n" for p in [traces, *([tokens] if tokens else []), *logs])
    if not marker.is_file() or marker.read_text(encoding="utf-8") != stamp:
        from infertrace.store.ingest import ingest_paths
        from infertrace.store.side_inputs import ingest_side_inputs

        ingest_paths(store_dir, [traces])
        if tokens is not None:
            ingest_side_inputs(store_dir, [tokens], "client-tokens")
        if logs:
            ingest_side_inputs(store_dir, logs, "vllm-iteration-log")
        marker.write_text(stamp, encoding="utf-8")
    if (chdb := _CHDB_DIR.get()) is not None:
        return _in_clickhouse(store_dir, chdb)
    return Store.open(store_dir)


# Where `evaluate --backend chdb` keeps ClickHouse's copy of each scenario's spans (None: the local stores).
_CHDB_DIR: ContextVar[Path | None] = ContextVar("chdb_dir", default=None)


@contextlib.contextmanager
def clickhouse_backend(directory: Path) -> Iterator[None]:
    """Within it, scenario stores are read from ClickHouse's `otel_traces` (chdb, data in `directory`): each
    local store's spans written there as the Collector's exporter writes them, once, then analysed through
    `ClickHouseStore`, so that the scores say whether the analyses answer the same on both backends."""
    token = _CHDB_DIR.set(directory)
    try:
        yield
    finally:
        _CHDB_DIR.reset(token)


def _in_clickhouse(store_dir: Path, chdb: Path) -> Store:
    from infertrace.store.clickhouse.store import mirrored_store

    database = "s_" + hashlib.sha256(str(store_dir.resolve()).encode()).hexdigest()[:20]
    return mirrored_store(store_dir, f"chdb://{chdb}?database={database}")


def _itl(bank: Path) -> dict[str, Any]:
    from infertrace.evaluation.itl import evaluate_itl

    return evaluate_itl(bank)


def _render_itl(section: dict[str, Any]) -> str:
    from infertrace.evaluation.itl import render_itl

    return render_itl(section)


def _rca(bank: Path) -> dict[str, Any]:
    from infertrace.evaluation.rca import evaluate_rca_section

    return evaluate_rca_section(bank)


def _render_rca(section: dict[str, Any]) -> str:
    from infertrace.evaluation.rca import render_rca

    return render_rca(section)


def _pd(bank: Path) -> dict[str, Any]:
    from infertrace.evaluation.pd import evaluate_pd

    return evaluate_pd(bank)


def _render_pd(section: dict[str, Any]) -> str:
    from infertrace.evaluation.pd import render_pd

    return render_pd(section)


# Section name → (evaluator over a bank directory, table renderer of its result).
EVALUATORS: dict[str, tuple[Callable[[Path], dict[str, Any]], Callable[[dict[str, Any]], str]]] = {
    "itl": (_itl, _render_itl),
    "rca": (_rca, _render_rca),
    "pd": (_pd, _render_pd),
}
