"""Scheduler and KV-cache invariants over random workloads and configurations (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine.engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine, StepReport
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request, Sequence, SequenceStatus

T0 = 1_767_225_600 * 10**9


class InvariantChecker:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.steps = 0

    def on_step(self, report: StepReport) -> None:
        cfg, bm = self.engine.config, self.engine.block_manager
        batch = report.batch
        assert batch.num_tokens <= cfg.max_num_batched_tokens
        assert report.num_running <= cfg.max_num_seqs
        if batch.prefills:
            assert len(report.durations) == 1, "only decode-only batches run for several steps"
            if cfg.policy == "prefill_first":
                assert not batch.decodes, "prefill-first runs prefills in steps of their own"
        assert len(report.durations) <= batch.max_steps
        assert (report.durations > 0).all()
        # KV blocks: every held block is counted exactly by the sequences holding it.
        held: dict[int, int] = {}
        for seq in self.engine.scheduler.running:
            assert bm.blocks_for(seq.num_computed_tokens) <= len(seq.block_table)
            for block in seq.block_table:
                held[block] = held.get(block, 0) + 1
        for block in range(bm.num_blocks):
            assert bm.ref_counts[block] == held.get(block, 0), block
        free_list = bm.free_blocks()
        free = set(free_list)
        assert len(free) == len(free_list) == bm.num_free_blocks, "no block is free twice"
        assert not free & set(held), "no block is both free and held"
        assert len(held) + len(free) == bm.num_blocks
        for seq in self.engine.scheduler.waiting:
            assert not seq.block_table, "a waiting sequence holds no KV"
        scheduler = self.engine.scheduler
        assert scheduler.num_prefilling == sum(s.is_prefilling for s in scheduler.running), "prefills counted"
        if batch.decodes:
            assert batch.decode_context == sum(s.num_computed_tokens - len(report.durations) + 1
                                               for s in batch.decodes), "the decodes' context at the first step"
        self.steps += 1

    def on_finish(self, seq: Sequence) -> None:
        assert not seq.block_table


segment_keys = st.sampled_from(["sys-a", "sys-b", "doc-1", "doc-2"])


@st.composite
def requests(draw: st.DrawFn) -> list[Request]:
    n = draw(st.integers(1, 25))
    out = []
    for i in range(n):
        shared = draw(st.lists(st.tuples(segment_keys, st.integers(1, 80)), max_size=2))
        segments = (*shared, (f"user-{i}", draw(st.integers(1, 300))))
        output = draw(st.integers(1, 120))
        arrival = T0 + draw(st.integers(0, 2_000_000_000))
        out.append(Request(f"r{i}", arrival, Prompt(tuple(segments)), output, output + draw(st.integers(0, 5))))
    return out


@st.composite
def configs(draw: st.DrawFn) -> EngineConfig:
    policy = draw(st.sampled_from(["prefill_first", "decode_first"]))
    max_num_seqs = draw(st.integers(1, 16))
    chunked = policy == "decode_first" or draw(st.booleans())
    budget = draw(st.integers(max(max_num_seqs, 16), 1024))
    return EngineConfig(policy=policy, chunked_prefill=chunked, max_num_batched_tokens=budget,
                        max_num_seqs=max_num_seqs, enable_prefix_caching=draw(st.booleans()),
                        block_size=draw(st.sampled_from([4, 16])), num_kv_blocks=draw(st.integers(8, 400)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), reqs=requests())
def test_budget_seats_and_kv_blocks_are_never_exceeded_and_every_request_gets_exactly_its_output(
        config: EngineConfig, reqs: list[Request]) -> None:
    engine = LLMEngine(config)
    checker = InvariantChecker(engine)
    engine.observers.append(checker)
    ended = engine.run(reqs)
    assert sorted(s.request_id for s in ended) == sorted(r.request_id for r in reqs)
    for seq in ended:
        assert seq.status is SequenceStatus.FINISHED
        if seq.error is None:
            assert seq.num_output_tokens == seq.request.output_tokens
            assert seq.first_token_ns is not None and seq.finish_ns is not None
            assert seq.request.arrival_ns <= seq.first_scheduled_ns <= seq.first_token_ns <= seq.finish_ns
        else:
            max_len = seq.num_prompt_tokens + seq.request.max_tokens
            too_long = not config.chunked_prefill and max_len > config.max_num_batched_tokens
            too_big = engine.block_manager.blocks_for(max_len) > engine.block_manager.num_blocks
            assert too_long or too_big, seq.error
    assert engine.block_manager.num_used_blocks == 0
