"""Spans built and written in a child process (BackgroundSink) come out byte for byte as the sink writes them
in the simulator's own process, are all counted, and a failure in the child is raised in the parent."""

from __future__ import annotations

import os
import re
import threading
import tomllib
from pathlib import Path

import pytest

from infertrace import semconv as sc
from reference_engine.engine.config import EngineConfig
from reference_engine.fleet.config import parse_fleet
from reference_engine.fleet.fleet import Fleet
from reference_engine.fleet.workload import fleet_requests
from reference_engine.simulate import simulate
from reference_engine.stats import Summary
from reference_engine.telemetry.background import BackgroundSink, available
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter, SpanRecord, SpanSink
from reference_engine.workload import SyntheticWorkload, synthetic_requests

pytestmark = pytest.mark.skipif(not available(), reason="needs fork (Linux)")

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_767_225_600 * 10**9


def _simulate(sink: SpanSink | None) -> Summary:
    workload = SyntheticWorkload(rate=6.0, prompt_mean=800.0, output_mean=300.0, system_prompt_fraction=0.7,
                                 assistant_prefill_fraction=0.2)
    config = EngineConfig(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=512,
                          num_kv_blocks=1200)
    return simulate(config, synthetic_requests(workload, 60.0, seed=3, start_ns=T0), sink, seed=3)


def _engine_run(path: Path, background: bool) -> int:
    sink = BackgroundSink(lambda: OtlpJsonLinesWriter(path)) if background else OtlpJsonLinesWriter(path)
    _simulate(sink)
    return sink.spans_written


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_an_engine_traced_in_a_child_writes_the_same_bytes_and_counts_every_span(tmp_path: Path,
                                                                                  suffix: str) -> None:
    here, there = tmp_path / f"here{suffix}", tmp_path / f"there{suffix}"
    written_here = _engine_run(here, background=False)
    written_there = _engine_run(there, background=True)
    assert written_there == written_here > 1000
    assert there.read_bytes() == here.read_bytes()


def test_a_simulation_traced_in_a_child_summarises_it_there_with_the_same_figures(tmp_path: Path) -> None:
    """The span writer keeps the summary statistics from the facts it gets (the simulator's process computes none):
    every figure equals the in-process summary's, traced or not, preemptions and recomputed prompts included."""
    untraced = _simulate(None)
    traced_here = _simulate(OtlpJsonLinesWriter(tmp_path / "here.jsonl"))
    sink = BackgroundSink(lambda: OtlpJsonLinesWriter(tmp_path / "there.jsonl"))
    traced_there = _simulate(sink)
    assert traced_there == traced_here == untraced
    assert untraced.preemptions > 0 and untraced.requests > 300 and untraced.steps > 1000


FIDELITY_ENGINES = {
    "kv tiers": (EngineConfig(num_kv_blocks=600, kv_host_tier_gb=0.05, kv_remote_tier_gb=0.1),
                 [sc.PREFILL_KV_HOST_TOKENS, sc.PREFILL_KV_REMOTE_TOKENS, sc.PREFILL_KV_EVICTED_TOKENS,
                  sc.STEP_KV_LOAD_NS]),
    "offloaded experts": (EngineConfig(model="mixtral-8x7b-q4_k", hardware="L4", cpu_moe_layers=8,
                                       max_num_batched_tokens=4096, prefill_microbatch=512),
                          [sc.STEP_OFFLOAD_HOST_LINK_BYTES, sc.STEP_OFFLOAD_HOST_COMPUTE_NS]),
}


@pytest.mark.parametrize("engine", list(FIDELITY_ENGINES))
def test_kv_tier_and_expert_offload_attributes_reach_spans_built_in_the_child(tmp_path: Path, engine: str) -> None:
    config, attributes = FIDELITY_ENGINES[engine]
    workload = SyntheticWorkload(rate=6.0 if engine == "kv tiers" else 0.5, prompt_mean=800.0, output_mean=200.0,
                                 system_prompt_fraction=0.7)
    requests = synthetic_requests(workload, 60.0, seed=3, start_ns=T0)
    outputs = []
    for background in (False, True):
        path = tmp_path / f"{background}.jsonl"
        sink = BackgroundSink(lambda path=path: OtlpJsonLinesWriter(path)) if background else OtlpJsonLinesWriter(path)
        simulate(config, requests, sink, seed=3)
        outputs.append(path.read_bytes())
    assert outputs[1] == outputs[0]
    for attribute in attributes:
        assert f'"key":"{attribute}"'.encode() in outputs[1], attribute


class _RecordsOnly:
    """An OTLP JSON writer reached only through `export`: a tracer hands it `SpanRecord`s, not encoded spans."""

    def __init__(self, path: Path) -> None:
        self.writer = OtlpJsonLinesWriter(path)

    def export(self, resource: dict[str, object], spans: list[SpanRecord], scope: str | None = None) -> None:
        self.writer.export(resource, spans, scope)

    def close(self) -> None:
        self.writer.close()


ENCODED_ENGINES = {
    "chunked prefills and preemptions": (
        EngineConfig(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=512, num_kv_blocks=1200),
        [sc.STEP_PREEMPTED_REQUEST_IDS, sc.STEP_PREFILL_SAMPLES_TOKEN, sc.EVENT_PREFILL_CHUNK, sc.SYSTEM_PROMPT_ID]),
    **FIDELITY_ENGINES,
}


@pytest.mark.parametrize("engine", list(ENCODED_ENGINES))
def test_spans_encoded_straight_from_the_facts_are_the_bytes_the_span_record_encoder_writes(tmp_path: Path,
                                                                                          engine: str) -> None:
    """A tracer writing to an OTLP JSON file encodes steps and request phases without building `SpanRecord`s;
    the same engine traced through records (what any other sink gets) writes the same bytes."""
    config, names = ENCODED_ENGINES[engine]
    workload = SyntheticWorkload(rate=6.0 if engine != "offloaded experts" else 0.5, prompt_mean=800.0,
                                 output_mean=200.0, system_prompt_fraction=0.7, assistant_prefill_fraction=0.2)
    requests = synthetic_requests(workload, 60.0, seed=3, start_ns=T0)
    outputs = []
    for path, sink in ((tmp_path / "encoded.jsonl", OtlpJsonLinesWriter(tmp_path / "encoded.jsonl")),
                       (tmp_path / "records.jsonl", _RecordsOnly(tmp_path / "records.jsonl"))):
        simulate(config, requests, sink, seed=3)
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1]
    for name in names:
        assert f'"{name}"'.encode() in outputs[0], name


@pytest.mark.parametrize("fleet", ["two_models.toml", "disaggregated.toml"])
def test_a_fleet_traced_in_a_child_writes_the_same_bytes(tmp_path: Path, fleet: str) -> None:
    """Gateway spans (sent whole) and engine facts (spans built in the child) keep their order."""
    spec = parse_fleet(tomllib.loads((ROOT / "examples" / "fleets" / fleet).read_text()), ROOT / "examples" / "fleets")
    outputs = []
    for background in (False, True):
        path = tmp_path / f"{background}.jsonl"
        sink = BackgroundSink(lambda path=path: OtlpJsonLinesWriter(path)) if background else OtlpJsonLinesWriter(path)
        summary = Fleet(spec, sink, seed=5).run(fleet_requests(spec, 60.0, 5))
        sink.close()
        outputs.append((path.read_bytes(), summary.spans))
    assert outputs[1] == outputs[0]
    assert outputs[0][1] > 1000


def test_a_span_the_child_cannot_encode_is_raised_in_the_simulators_process(tmp_path: Path) -> None:
    sink = BackgroundSink(lambda: OtlpJsonLinesWriter(tmp_path / "t.jsonl"))
    sink.export({"service.name": "x"}, [SpanRecord(1, 2, 0, "bad", 0, 1, {"tags": {"a", "b"}})])
    with pytest.raises(RuntimeError, match="cannot encode attribute value of type set"):
        sink.close()


def test_an_output_file_that_cannot_be_opened_fails_when_the_sink_is_opened(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "t.jsonl"
    with pytest.raises(RuntimeError, match="no-such-dir"):
        BackgroundSink(lambda: OtlpJsonLinesWriter(missing))


def test_an_engine_whose_clock_is_beyond_int64_nanoseconds_still_traces_the_same_bytes_in_a_child(
        tmp_path: Path) -> None:
    """Step facts cross the pipe as int64 buffers; a clock past 2^63 ns goes as a plain list instead."""
    workload = SyntheticWorkload(rate=2.0, prompt_mean=200.0, output_mean=20.0)
    requests = synthetic_requests(workload, 5.0, seed=1, start_ns=(1 << 63) - 10**9)
    outputs = []
    for background in (False, True):
        path = tmp_path / f"{background}.jsonl"
        sink = BackgroundSink(lambda path=path: OtlpJsonLinesWriter(path)) if background else OtlpJsonLinesWriter(path)
        simulate(EngineConfig(), requests, sink, seed=1)
        outputs.append(path.read_bytes())
    assert outputs[1] == outputs[0]
    starts = [int(t) for t in re.findall(rb'"startTimeUnixNano":"(\d+)"', outputs[0])]
    assert max(starts) >= 1 << 63  # spans past 2^63 ns were written


class _HeldWriter:
    """An OTLP JSON writer that writes nothing until a byte arrives on `release` (a child that has fallen behind)."""

    def __init__(self, path: Path, release: int) -> None:
        self.writer, self.release, self.held = OtlpJsonLinesWriter(path), release, True

    def export(self, resource: dict[str, object], spans: list[SpanRecord], scope: str | None = None) -> None:
        if self.held:
            os.read(self.release, 1)
            self.held = False
        self.writer.export(resource, spans, scope)

    def close(self) -> None:
        self.writer.close()

    @property
    def spans_written(self) -> int:
        return self.writer.spans_written


def test_a_child_that_has_fallen_behind_does_not_hold_up_the_simulator_and_catches_up(tmp_path: Path) -> None:
    """The child takes messages off the pipe while its sink is busy: the simulator sends well past what the pipe
    holds (three messages, ≈ 1.5 MB, against the 1 MB it holds) without waiting, and nothing is lost."""
    release_read, release_write = os.pipe()
    path = tmp_path / "t.jsonl"
    sink = BackgroundSink(lambda: _HeldWriter(path, release_read))
    spans = [SpanRecord(i, i + 1, 0, "s", 0, 1, {"payload": f"{i:01000d}"}) for i in range(1, 1537)]
    sender = threading.Thread(target=lambda: [sink.export({"service.name": "x"}, [span]) for span in spans])
    sender.start()
    sender.join(timeout=60)
    held_up = sender.is_alive()
    os.write(release_write, b"x")
    sender.join()
    assert not held_up, "the simulator waited on the pipe while the child's sink was held"
    sink.close()
    assert sink.spans_written == len(spans)
    assert path.read_text().count('"name":"s"') == len(spans)
