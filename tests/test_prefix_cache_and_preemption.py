"""Prefix caching by whole blocks, and preemption by recompute, seen in the exported spans."""

from __future__ import annotations

from pathlib import Path

from infertrace import semconv as sc
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from tests.otlp_proto import ParsedSpan, spans, token_times

T0 = 1_767_225_600 * 10**9
SECOND = 10**9


def run(tmp_path: Path, config: EngineConfig, requests: list[Request]) -> list[ParsedSpan]:
    path = tmp_path / "trace.jsonl"
    simulate(config, requests, OtlpJsonLinesWriter(path))
    return spans(path)


def request_spans(parsed: list[ParsedSpan]) -> dict[str, ParsedSpan]:
    return {p.attrs[sc.REQUEST_ID]: p for p in parsed if p.span.name == sc.SPAN_REQUEST}


def test_prompts_sharing_a_prefix_hit_the_cache_by_whole_blocks(tmp_path: Path) -> None:
    reqs = [
        Request("first", T0, Prompt((("sys", 100), ("user-1", 50))), 4, 16),
        Request("same-system-prompt", T0 + SECOND, Prompt((("sys", 100), ("user-2", 70))), 4, 16),
        Request("shorter-shared-part", T0 + 2 * SECOND, Prompt((("sys", 40), ("user-3", 70))), 4, 16),
        Request("nothing-shared", T0 + 3 * SECOND, Prompt((("user-4", 300),)), 4, 16),
    ]
    cached = {rid: p.attrs[sc.USAGE_CACHE_READ_INPUT_TOKENS]
              for rid, p in request_spans(run(tmp_path, EngineConfig(block_size=16), reqs)).items()}
    assert cached == {"first": 0, "same-system-prompt": 96, "shorter-shared-part": 32, "nothing-shared": 0}


def test_a_cache_hit_skips_those_tokens_in_the_prefill_step(tmp_path: Path) -> None:
    reqs = [Request("a", T0, Prompt((("sys", 1000), ("user-a", 24))), 2, 16),
            Request("b", T0 + SECOND, Prompt((("sys", 1000), ("user-b", 24))), 2, 16)]
    steps = [p for p in run(tmp_path, EngineConfig(block_size=16), reqs) if p.span.name == sc.SPAN_STEP]
    chunks = {p.attrs[sc.STEP_PREFILL_REQUEST_IDS][0]: (p.attrs[sc.STEP_PREFILL_CHUNK_TOKENS][0],
                                                         p.attrs[sc.STEP_PREFILL_COMPUTED_TOKENS][0])
              for p in steps if sc.STEP_PREFILL_REQUEST_IDS in p.attrs}
    assert chunks == {"a": (1024, 0), "b": (1024 - 992, 992)}


def test_prefix_caching_off_hits_nothing(tmp_path: Path) -> None:
    reqs = [Request(f"r{i}", T0 + i * SECOND, Prompt((("sys", 100), (f"user-{i}", 50))), 4, 16) for i in range(3)]
    parsed = run(tmp_path, EngineConfig(enable_prefix_caching=False), reqs)
    assert {p.attrs[sc.USAGE_CACHE_READ_INPUT_TOKENS] for p in request_spans(parsed).values()} == {0}


def test_when_kv_runs_out_the_latest_request_is_preempted_freed_and_later_recomputed(tmp_path: Path) -> None:
    # 24 blocks of 16 tokens: three 100-token prompts (7 blocks each) fit, their growth does not.
    config = EngineConfig(block_size=16, num_kv_blocks=24, enable_prefix_caching=False)
    reqs = [Request(f"r{i}", T0, Prompt(((f"user-{i}", 100),)), 60, 64) for i in range(3)]
    parsed = run(tmp_path, config, reqs)
    by_request = request_spans(parsed)
    preempted = [rid for rid, p in by_request.items() if p.attrs[sc.PREEMPTIONS] > 0]
    assert preempted == ["r2"], "the last admitted is preempted first"
    for rid, p in by_request.items():
        assert p.attrs[sc.USAGE_OUTPUT_TOKENS] == 60, rid
    victim = by_request["r2"]
    assert [e.name for e in victim.span.events].count(sc.EVENT_PREEMPTED) == victim.attrs[sc.PREEMPTIONS]
    steps = [p for p in parsed if p.span.name == sc.SPAN_STEP]
    preempting = [p for p in steps if "r2" in p.attrs.get(sc.STEP_PREEMPTED_REQUEST_IDS, [])]
    assert preempting, "the step that preempted names it"
    after = [p for p in steps if p.span.start_time_unix_nano >= preempting[0].span.start_time_unix_nano]
    assert all(p.attrs[sc.STEP_KV_USED_BLOCKS] <= 24 for p in steps)
    assert "r2" not in preempting[0].attrs.get(sc.STEP_DECODE_REQUEST_IDS, []), "its blocks were freed"
    recompute = next(p for p in after if "r2" in p.attrs.get(sc.STEP_PREFILL_REQUEST_IDS, []))
    i = recompute.attrs[sc.STEP_PREFILL_REQUEST_IDS].index("r2")
    tokens_before = len([t for t in token_times(parsed)["r2"] if t <= preempting[0].span.start_time_unix_nano])
    assert recompute.attrs[sc.STEP_PREFILL_COMPUTED_TOKENS][i] == 0
    assert recompute.attrs[sc.STEP_PREFILL_CHUNK_TOKENS][i] == 100 + tokens_before, "prompt and output recomputed"
    prefill_spans = [p for p in parsed if p.span.name == sc.SPAN_PREFILL and p.attrs[sc.REQUEST_ID] == "r2"]
    assert len(prefill_spans) == 2, "one prefill span for the first prefill, one for the recompute"
    assert len(token_times(parsed)["r2"]) == 60, "every token delivered exactly once"
