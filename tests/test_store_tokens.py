"""The tokens relation reproduces exactly the token times and ITLs the engine produced."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine, StepReport
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request, Sequence
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.tracer import EngineTracer, engine_resource

T0 = 1_767_225_600 * 10**9
COLLISION = T0 + 3 * 10**9  # the 64 sequences are all decoding by then


class TokenRecorder:
    """Each request's token times, from the engine's own state: after each step (or run of steps), the
    growth of a sequence's output-token count says how many tokens it received, at the ends of that many
    last steps of the run."""

    def __init__(self) -> None:
        self.times: dict[str, list[int]] = {}
        self._seen: dict[str, int] = {}

    def on_step(self, report: StepReport) -> None:
        ends = (report.start_ns + np.cumsum(report.durations.astype(np.int64))).tolist()
        seqs = [seq for seq, _ in report.batch.prefills] + list(report.batch.decodes)
        for seq in seqs:
            rid = seq.request_id
            new = seq.num_output_tokens - self._seen.get(rid, 0)
            self._seen[rid] = seq.num_output_tokens
            if new:
                self.times.setdefault(rid, []).extend(ends[len(ends) - new:])

    def on_finish(self, seq: Sequence) -> None:
        pass


def test_tokens_relation_reproduces_every_itl_of_a_4096_token_prefill_colliding_with_64_decodes(
        tmp_path: Path) -> None:
    config = EngineConfig(model="llama-3-8b", hardware="H100-SXM", policy="prefill_first", chunked_prefill=False)
    victims = [Request(f"victim-{i:02d}", T0, Prompt(((f"user-victim-{i}", 2047),)), 400, 2048) for i in range(64)]
    culprit = Request("culprit", COLLISION, Prompt((("user-culprit", 4096),)), 8, 2048)
    trace = tmp_path / "collision.jsonl"
    writer = OtlpJsonLinesWriter(trace)
    tracer = EngineTracer(writer, engine_resource(config), seed=1)
    recorder = TokenRecorder()
    LLMEngine(config, observers=[recorder, tracer]).run([*victims, culprit])
    tracer.close()
    writer.close()

    ingest_paths(tmp_path / "store", [trace])
    with Store.open(tmp_path / "store") as store:
        rows = store.sql("SELECT request_id, token_index, time_ns, itl_ns FROM tokens "
                         "ORDER BY request_id, token_index").to_arrow_table().to_pylist()
        spike_step = store.sql("SELECT prefill_tokens, num_decodes, duration_ns FROM steps "
                               "WHERE prefill_tokens = 4096").fetchall()

    stored: dict[str, list[tuple[int, int | None]]] = {}
    for row in rows:
        stored.setdefault(row["request_id"], []).append((row["time_ns"], row["itl_ns"]))
    assert set(stored) == set(recorder.times) == {r.request_id for r in [*victims, culprit]}
    compared = 0
    for rid, times in recorder.times.items():
        expected_itl = [None] + [b - a for a, b in itertools.pairwise(times)]  # exact Python ints
        assert [t for t, _ in stored[rid]] == times, rid
        assert [itl for _, itl in stored[rid]] == expected_itl, rid
        compared += len(times) - 1
    assert compared == 64 * 399 + 7

    # The collision is in there: under prefill-first the whole 4096-token prompt ran in a step of its own
    # while the 64 decodes waited, so every victim's ITL across it contains that step, several times a
    # decode-only step.
    ((prefill_tokens, num_decodes, spike_ns),) = spike_step
    assert (prefill_tokens, num_decodes) == (4096, 0)
    decode_itls = [itl for rid in stored if rid != "culprit" for _, itl in stored[rid] if itl is not None]
    median = int(np.median(decode_itls))
    assert spike_ns > 5 * median
    for i in range(64):
        assert max(itl or 0 for _, itl in stored[f"victim-{i:02d}"]) > spike_ns
