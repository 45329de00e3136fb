"""On a CPU, a long prompt arriving into a running decode batch under prefill-first stalls every running sequence
for its whole prefill: a measured ITL spike, read back from the exported spans. Decode-first with a small token
budget interleaves the prompt's chunks with the decodes and shrinks the spike. Nothing here comes from the cost
model: the step times are the real executor's wall-clock measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infertrace import semconv as sc
from reference_engine.compute.ops import limit_cpu_threads
from reference_engine.compute.real_executor import RealExecutor
from reference_engine.compute.transformer import Transformer
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.engine.models import model
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.tracer import EngineTracer, engine_resource
from tests.otlp_proto import spans, token_times

SPEC = model("tiny")
RUNNING = [f"chat-{i}" for i in range(6)]


@dataclass(frozen=True)
class Spike:
    worst_itl_ms: float  # the largest gap between two tokens of a running sequence
    typical_itl_ms: float  # their median gap
    culprit_in_worst_gap: bool  # the long prompt prefilled in a step between those two tokens


def measure_spike(tmp_path: Path, model_: Transformer, **config: object) -> Spike:
    requests = [Request(rid, 0, Prompt(((rid, 24),)), 80, 80) for rid in RUNNING]
    # Arrives once the six are decoding (the clock is measured time: 40 ms is a few decode steps).
    requests.append(Request("long-prompt", 40_000_000, Prompt((("long", 896),)), 2, 2))
    cfg = EngineConfig(model="tiny", hardware="CPU-host", num_kv_blocks=256, max_num_seqs=8, **config)  # type: ignore[arg-type]
    path = tmp_path / f"{cfg.policy}.jsonl"
    sink = OtlpJsonLinesWriter(path)
    tracer = EngineTracer(sink, engine_resource(cfg, executor="real"))
    executor = RealExecutor(SPEC, 256, cfg.block_size, model=model_)
    LLMEngine(cfg, executor, observers=[tracer]).run(requests)
    tracer.close()
    sink.close()
    parsed = spans(path)
    steps = [p for p in parsed if p.span.name == sc.SPAN_STEP]
    times = token_times(parsed)
    for rid in RUNNING:
        assert len(times[rid]) == 80, "every token of a running sequence is derivable from the step spans"
    gaps = {rid: np.diff(times[rid]) for rid in RUNNING}
    worst_rid = max(RUNNING, key=lambda r: gaps[r].max())
    i = int(gaps[worst_rid].argmax())
    before, after = times[worst_rid][i], times[worst_rid][i + 1]
    culprit = any("long-prompt" in p.attrs.get(sc.STEP_PREFILL_REQUEST_IDS, []) for p in steps
                  if p.span.start_time_unix_nano >= before and p.span.end_time_unix_nano <= after)
    all_gaps = np.concatenate(list(gaps.values()))
    return Spike(float(all_gaps.max() / 1e6), float(np.median(all_gaps) / 1e6), culprit)


def test_a_long_prefill_under_prefill_first_is_a_measured_itl_spike_that_decode_first_shrinks(
        tmp_path: Path) -> None:
    previous = limit_cpu_threads(1)  # a second BLAS thread on a shared CPU adds stalls of its own
    try:
        model_ = Transformer(SPEC, seed=0)
        prefill_first = measure_spike(tmp_path, model_, policy="prefill_first", max_num_batched_tokens=2048)
        decode_first = measure_spike(tmp_path, model_, policy="decode_first", chunked_prefill=True,
                                     max_num_batched_tokens=64)
    finally:
        if previous:
            limit_cpu_threads(previous)
    print(f"\nprefill_first: {prefill_first}\ndecode_first:  {decode_first}")
    # The prefill of 896 tokens shares no step with the decodes: every running sequence waits for all of it.
    assert prefill_first.culprit_in_worst_gap
    assert prefill_first.worst_itl_ms > 5 * prefill_first.typical_itl_ms
    # In chunks of ≤ 58 tokens beside the six decodes, the worst gap is a fraction of that.
    assert decode_first.worst_itl_ms < 0.5 * prefill_first.worst_itl_ms
