"""The headline behaviour, reconstructed from exported spans only: a long prefill arriving into a running
decode batch stalls every decoding sequence under prefill-first, and not under decode-first with chunks."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import pytest

from infertrace import semconv as sc
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from tests.otlp_proto import spans, token_times

T0 = 1_767_225_600 * 10**9
ARRIVAL = T0 + 10 * 10**9  # the 64 sequences are all decoding by then


def collision_workload() -> list[Request]:
    running = [Request(f"victim-{i:02d}", T0, Prompt(((f"user-victim-{i}", 2047),)), 2000, 2048)
               for i in range(64)]
    culprit = Request("culprit", ARRIVAL, Prompt((("user-culprit", 4096),)), 8, 2048)
    return [*running, culprit]


def run(tmp_path: Path, config: EngineConfig) -> tuple[dict[str, list[int]], list]:
    path = tmp_path / "trace.jsonl"
    simulate(config, collision_workload(), OtlpJsonLinesWriter(path))
    parsed = spans(path)
    return token_times(parsed), parsed


def gaps(times: list[int]) -> list[int]:
    return [b - a for a, b in itertools.pairwise(times)]


def gap_across(times: list[int], t: int) -> int:
    """The inter-token gap that contains time t."""
    return next(b - a for a, b in itertools.pairwise(times) if a <= t < b)


def test_a_4096_token_prefill_stalls_all_64_decodes_for_the_whole_step_under_prefill_first(tmp_path: Path) -> None:
    tokens, parsed = run(tmp_path, EngineConfig(policy="prefill_first", chunked_prefill=False))
    culprit_steps = [p for p in parsed if p.span.name == sc.SPAN_STEP
                     and "culprit" in p.attrs.get(sc.STEP_PREFILL_REQUEST_IDS, [])]
    assert len(culprit_steps) == 1, "without chunking the prompt is prefilled in one step"
    step = culprit_steps[0]
    assert step.attrs[sc.STEP_PREFILL_CHUNK_TOKENS] == [4096]
    step_ns = step.span.end_time_unix_nano - step.span.start_time_unix_nano
    assert 0.080e9 < step_ns < 0.115e9  # DESIGN's worked example: ≈ 95–100 ms on one H100
    victims = [f"victim-{i:02d}" for i in range(64)]
    assert not set(victims) & set(step.attrs.get(sc.STEP_DECODE_REQUEST_IDS, [])), "decodes wait out the step"
    for rid in victims:
        median = statistics.median(gaps(tokens[rid]))
        stalled = gap_across(tokens[rid], step.span.start_time_unix_nano)
        assert stalled >= step_ns, rid
        assert stalled >= 5 * median, (rid, stalled, median)
        assert stalled <= step_ns + 2 * median, "the stall is the prefill step plus one decode step"


def test_decode_first_with_a_512_token_budget_keeps_every_itl_within_twice_the_median(tmp_path: Path) -> None:
    config = EngineConfig(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=512)
    tokens, parsed = run(tmp_path, config)
    chunks = [p for p in parsed if p.span.name == sc.SPAN_STEP
              and "culprit" in p.attrs.get(sc.STEP_PREFILL_REQUEST_IDS, [])]
    assert len(chunks) == pytest.approx(4096 / (512 - 64), abs=1), "the prompt is split into budget-sized chunks"
    window = (chunks[0].span.start_time_unix_nano, chunks[-1].span.end_time_unix_nano)
    for i in range(64):
        times = tokens[f"victim-{i:02d}"]
        median = statistics.median(gaps(times))
        during = [b - a for a, b in itertools.pairwise(times) if window[0] <= b <= window[1]]
        assert len(during) >= len(chunks), "every victim got a token in every chunk step"
        assert max(during) <= 2 * median, (i, max(during), median)
