"""One engine, one workload, traces to a file or an OTLP endpoint: what `infertrace simulate` runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reference_engine.engine.config import EngineConfig
from reference_engine.engine.executor import Executor, SimulatedExecutor
from reference_engine.engine.llm_engine import EngineObserver, LLMEngine
from reference_engine.engine.sequence import Request
from reference_engine.stats import SimulationStats, Summary
from reference_engine.telemetry.background import BackgroundSink
from reference_engine.telemetry.background import available as background_available
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter, SdkExporterSink, SpanSink
from reference_engine.telemetry.profiles import TelemetryRun, TelemetrySpec
from reference_engine.telemetry.tracer import EngineTracer, engine_resource
from reference_engine.workload import SyntheticWorkload, azure_requests, mooncake_requests, synthetic_requests

WORKLOAD_KINDS = ("synthetic", "azure", "mooncake")


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str = "synthetic"
    path: Path | None = None  # for replay
    synthetic: SyntheticWorkload = field(default_factory=SyntheticWorkload)
    speedup: float = 1.0  # replay: compress arrivals by this factor

    def requests(self, duration_s: float, seed: int, model: str) -> list[Request]:
        if self.kind == "synthetic":
            return synthetic_requests(self.synthetic, duration_s, seed, model=model)
        if self.path is None:
            raise ValueError(f"workload {self.kind!r} replays a trace file: give its path")
        if not self.path.is_file():
            raise ValueError(f"workload file {self.path} does not exist")
        if self.kind == "azure":
            return azure_requests(self.path, duration_s, self.speedup, model=model)
        if self.kind == "mooncake":
            return mooncake_requests(self.path, duration_s, self.speedup, model=model)
        raise ValueError(f"unknown workload {self.kind!r}; known: {', '.join(WORKLOAD_KINDS)}")


def open_sink(out: Path | None, otlp_endpoint: str | None, background: bool = True) -> SpanSink | None:
    """The sink for `--out` or `--otlp-endpoint`; with `background` (and where a child process can be forked), it
    builds, encodes and sends spans in a child process (telemetry/background.py): the same output, byte for byte."""
    if out is not None and otlp_endpoint is not None:
        raise ValueError("give either an output file or an OTLP endpoint, not both")
    if out is None and otlp_endpoint is None:
        return None

    def make_sink() -> SpanSink:
        if out is not None:
            return OtlpJsonLinesWriter(out)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return SdkExporterSink(OTLPSpanExporter(endpoint=otlp_endpoint))

    return BackgroundSink(make_sink) if background and background_available() else make_sink()


def simulate(config: EngineConfig, requests: list[Request], sink: SpanSink | None, seed: int = 0,
             on_progress: Callable[[int, int], None] | None = None, executor: Executor | None = None,
             telemetry: TelemetrySpec | None = None) -> Summary:
    """`executor`: e.g. a `RealExecutor` (wall-clock step times); by default the simulated one. `telemetry`: whose
    spans the engine emits, and side files (reference_engine.telemetry.profiles); by default this project's."""
    observers: list[EngineObserver] = []
    tracer = None
    kind = "simulated" if executor is None or isinstance(executor, SimulatedExecutor) else "real"
    run = None if telemetry is None or telemetry.is_native else TelemetryRun(telemetry, sink, seed)
    if run is not None:
        run.expect(requests)
        observers += run.engine_observers(config, seed, executor=kind)
    elif sink is not None:
        # A span writer in another process keeps the summary from the facts it gets anyway (telemetry/background.py)
        tracer = EngineTracer(sink, engine_resource(config, executor=kind), seed=seed, summarize=True)
        observers.append(tracer)
    remote_summary = tracer.summary if tracer is not None else None
    stats = SimulationStats() if remote_summary is None else None
    if stats is not None:
        observers.insert(0, stats)
    engine = LLMEngine(config, executor, observers=observers)
    try:
        try:
            engine.run(requests, on_progress)
        finally:
            if tracer is not None:
                tracer.close()
        summary = stats.summary() if stats is not None else remote_summary()  # type: ignore[misc]
    finally:
        if run is not None:
            run.close()
        if sink is not None:
            sink.close()
    return summary
