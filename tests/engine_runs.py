"""Small engine runs written to a real store, for the analyzer tests: the engine's own records (the
tracer's spans, ingested) and what the engine knows (its cost model, its step reports) side by side."""

from __future__ import annotations

from pathlib import Path

from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.executor import SimulatedExecutor
from reference_engine.engine.llm_engine import LLMEngine, StepReport
from reference_engine.engine.sequence import Request, Sequence
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.tracer import EngineTracer, engine_resource
from reference_engine.workload import SyntheticWorkload, synthetic_requests

T0 = 1_767_225_600 * 10**9


class StepLog:
    """Every step report, as the engine made it."""

    def __init__(self) -> None:
        self.reports: list[StepReport] = []

    def on_step(self, report: StepReport) -> None:
        self.reports.append(report)

    def on_finish(self, seq: Sequence) -> None:
        pass


def run_to_store(tmp: Path, config: EngineConfig, requests: list[Request],
                 pauses: list[tuple[int, int]] = ()) -> tuple[Store, LLMEngine, StepLog]:  # type: ignore[assignment]
    trace = tmp / f"{config.instance_id}.jsonl"
    writer = OtlpJsonLinesWriter(trace)
    tracer = EngineTracer(writer, engine_resource(config), seed=1)
    log = StepLog()
    engine = LLMEngine(config, SimulatedExecutor(config.cost_model(), pauses), observers=[log, tracer])
    engine.run(requests)
    tracer.close()
    writer.close()
    ingest_paths(tmp / f"store-{config.instance_id}", [trace])
    return Store.open(tmp / f"store-{config.instance_id}"), engine, log


def write_trace(path: Path, seconds: float, seed: int, batch_size: int) -> Path:
    """`seconds` of a synthetic load (5 requests/s) on one engine with chunked prefill, written to `path` as OTLP
    JSON lines of `batch_size` spans each (many messages)."""
    config = EngineConfig(chunked_prefill=True, max_num_batched_tokens=2048)
    writer = OtlpJsonLinesWriter(path)
    tracer = EngineTracer(writer, engine_resource(config), seed=seed, batch_size=batch_size)
    LLMEngine(config, observers=[tracer]).run(synthetic_requests(SyntheticWorkload(rate=5.0), seconds, seed=seed,
                                                                 model=config.model))
    tracer.close()
    writer.close()
    return path
