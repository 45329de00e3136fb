"""Scoring analyzers against the ground truth of a scenario bank (`infertrace scenarios generate`).

`EVALUATORS` maps a section name of `infertrace evaluate` to the function that scores that analysis over a
bank directory; each returns a JSON-ready dict and has a `render_*` companion for the table format. A section
scores its scenarios through a `ScenarioPool`: one after another, or in parallel processes, with the same result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from infertrace.store.store import Store

TRUTH_FILE = "ground_truth.json"
STORE_DIR = "store"
INGESTED_MARKER = "INGESTED"

T = TypeVar("T")


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


@dataclass(frozen=True)
class ScenarioPool:
    """How a section scores its scenarios, each on its own: in this process one after another (`jobs` 1) or in
    `jobs` processes, the results in the scenarios' order either way, so that the section adds them up as it would
    one after another. `on_progress(done, total)` is called as scenarios finish (and once before, with 0 done)."""

    jobs: int = 1
    on_progress: Callable[[int, int], None] | None = None

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError(f"jobs must be ≥ 1, got {self.jobs}")

    def map(self, score: Callable[[Path], T], scenarios: list[Path]) -> list[T]:
        """`[score(s) for s in scenarios]`; in parallel, `score` must be a module's function (or a partial of one)
        and what it returns picklable. The first scenario that fails stops the rest and raises its error here."""
        total = len(scenarios)
        self._progress(0, total)
        if self.jobs == 1 or total < 2:
            results = []
            for scenario in scenarios:
                results.append(score(scenario))
                self._progress(len(results), total)
            return results
        if _CHDB_DIR.get() is not None:
            raise ValueError("chdb's data directory can be open in one process only: with the ClickHouse backend, "
                             "score scenarios with jobs=1")
        # spawned, not forked: a forked child would inherit DuckDB's threads and locks mid-use
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(self.jobs, total), mp_context=context) as pool:
            futures = [pool.submit(score, scenario) for scenario in scenarios]
            try:
                for done, future in enumerate(as_completed(futures), 1):
                    future.result()
                    self._progress(done, total)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            return [future.result() for future in futures]

    def _progress(self, done: int, total: int) -> None:
        if self.on_progress is not None:
            self.on_progress(done, total)


def _itl(bank: Path, pool: ScenarioPool) -> dict[str, Any]:
    from infertrace.evaluation.itl import evaluate_itl

    return evaluate_itl(bank, pool)


def _render_itl(section: dict[str, Any]) -> str:
    from infertrace.evaluation.itl import render_itl

    return render_itl(section)


def _rca(bank: Path, pool: ScenarioPool) -> dict[str, Any]:
    from infertrace.evaluation.rca import evaluate_rca_section

    return evaluate_rca_section(bank, pool)


def _render_rca(section: dict[str, Any]) -> str:
    from infertrace.evaluation.rca import render_rca

    return render_rca(section)


def _pd(bank: Path, pool: ScenarioPool) -> dict[str, Any]:
    from infertrace.evaluation.pd import evaluate_pd

    return evaluate_pd(bank, pool)


def _render_pd(section: dict[str, Any]) -> str:
    from infertrace.evaluation.pd import render_pd

    return render_pd(section)


Evaluator = Callable[[Path, ScenarioPool], dict[str, Any]]

# Section name → (evaluator over a bank directory, table renderer of its result).
EVALUATORS: dict[str, tuple[Evaluator, Callable[[dict[str, Any]], str]]] = {
    "itl": (_itl, _render_itl),
    "rca": (_rca, _render_rca),
    "pd": (_pd, _render_pd),
}
