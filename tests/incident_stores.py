"""Real stores for the surface tests (report, runbook, dashboard, demo): an incident scenario simulated by
the reference engine, written as OTLP JSON lines with its ground truth, and ingested with `ingest_paths`.
Built once per test session and family (the scenarios take seconds)."""

from __future__ import annotations

import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infertrace.store.ingest import ingest_paths

# Every store of the session lives under one directory, removed when the test process exits.
_SESSION = tempfile.TemporaryDirectory(prefix="infertrace-test-stores-")


@dataclass(frozen=True)
class IncidentStore:
    store: Path
    traces: Path
    truth: dict[str, Any]


@functools.cache
def incident_store(family: str, seed: int = 1, duration_s: float = 120.0) -> IncidentStore:
    from reference_engine.scenarios.bank import run_scenario
    from reference_engine.scenarios.families import make_scenario

    root = Path(tempfile.mkdtemp(prefix=f"{family}-", dir=_SESSION.name))
    scenario = make_scenario(family, seed, duration_s=duration_s)
    run_scenario(scenario, root / "scenario")
    truth = json.loads((root / "scenario" / "ground_truth.json").read_text(encoding="utf-8"))
    traces = root / "scenario" / truth["traces"]
    ingest_paths(root / "store", [traces])
    return IncidentStore(root / "store", traces, truth)


@functools.cache
def demo_store() -> IncidentStore:
    """The `infertrace demo` incident (a degraded shared router; prefill collisions), at its default seed."""
    from infertrace.demo import run_demo

    root = Path(tempfile.mkdtemp(prefix="demo-", dir=_SESSION.name))
    run = run_demo(root / "store")
    return IncidentStore(run.store, run.scenario_dir / run.truth["traces"], run.truth)


SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


@functools.cache
def sample_store(name: str) -> IncidentStore:
    """A sample incident from sample_traces/, ingested into a fresh store."""
    root = Path(tempfile.mkdtemp(prefix=f"sample-{name}-", dir=_SESSION.name))
    truth = json.loads((SAMPLES / name / "ground_truth.json").read_text(encoding="utf-8"))
    traces = SAMPLES / name / truth["traces"]
    ingest_paths(root / "store", [traces])
    return IncidentStore(root / "store", traces, truth)
