"""Hashing a prompt's private part late (when another prompt with that part is looked up, or its own sequence
is preempted) caches, hits and evicts exactly what hashing every block when it is computed does: the engine
takes the same steps with either block manager, over random workloads whose "private" segments do recur. With KV
tiers too: the same blocks move to the host and remote tiers, in the same order, and come back the same."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine.engine.block_manager import BlockManager
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.kv_tiers import KvTiers
from reference_engine.engine.llm_engine import LLMEngine, StepReport
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request, Sequence
from tests.eager_block_manager import EagerBlockManager

T0 = 1_767_225_600 * 10**9


class Recorder:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.steps: list[tuple[Any, ...]] = []

    def on_step(self, r: StepReport) -> None:
        b = r.batch
        self.steps.append((r.index, r.start_ns, r.durations.tolist(), [(s.request_id, n, s.num_computed_tokens)
                           for s, n in b.prefills], [s.request_id for s in b.decodes],
                           [s.request_id for s in b.preempted], [s.request_id for s in b.rejected],
                           r.num_running, r.num_waiting, r.kv_used_blocks, b.kv_hits and
                           [(s.request_id, hit) for s, hit in b.kv_hits], r.kv_load))

    def on_finish(self, seq: Sequence) -> None:
        self.steps.append(("finish", seq.request_id, seq.num_cached_tokens, seq.preemptions, seq.finish_ns))


@st.composite
def requests(draw: st.DrawFn) -> list[Request]:
    """Prompts of one to three segments from small pools, so that shared prefixes, repeated user segments (a
    retried request, a system prompt's first use) and preemptions all happen."""
    n = draw(st.integers(1, 30))
    keys = st.sampled_from(["sys-a", "sys-b", "doc", "user-0", "user-1", "user-2", "user-3"])
    out = []
    for i in range(n):
        segments = draw(st.lists(st.tuples(st.one_of(keys, st.just(f"own-{i}")), st.integers(1, 120)),
                                 min_size=1, max_size=3))
        output = draw(st.integers(1, 80))
        arrival = T0 + draw(st.integers(0, 1_500_000_000))
        out.append(Request(f"r{i}", arrival, Prompt(tuple(segments)), output, output + draw(st.integers(0, 3))))
    return out


@st.composite
def configs(draw: st.DrawFn) -> EngineConfig:
    policy = draw(st.sampled_from(["prefill_first", "decode_first"]))
    max_num_seqs = draw(st.integers(1, 12))
    chunked = policy == "decode_first" or draw(st.booleans())
    return EngineConfig(policy=policy, chunked_prefill=chunked, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=draw(st.integers(max(max_num_seqs, 16), 512)),
                        block_size=draw(st.sampled_from([4, 8, 16])), num_kv_blocks=draw(st.integers(8, 200)))


def _run(config: EngineConfig, reqs: list[Request], eager: bool,
         tiers: tuple[int, int, bool] | None = None) -> list[tuple[Any, ...]]:
    engine = LLMEngine(config)
    manager = EagerBlockManager if eager else BlockManager
    if eager or tiers is not None:
        bm = manager(engine.block_manager.num_blocks, config.block_size, config.enable_prefix_caching,
                     KvTiers(*tiers) if tiers is not None else None)
        engine.block_manager = engine.scheduler.block_manager = bm  # type: ignore[assignment]
    recorder = Recorder(engine)
    engine.observers.append(recorder)
    engine.run([Request(r.request_id, r.arrival_ns, r.prompt, r.output_tokens, r.max_tokens) for r in reqs])
    assert engine.block_manager.num_used_blocks == 0
    if tiers is not None:
        t = engine.block_manager.tiers
        recorder.steps.append(("tiers", [list(blocks) for blocks in t.blocks], t.evictions, t.gone))
    return recorder.steps


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), reqs=requests())
def test_late_hashing_takes_the_same_steps_as_hashing_every_block_at_once(
        config: EngineConfig, reqs: list[Request]) -> None:
    assert _run(config, reqs, eager=False) == _run(config, reqs, eager=True)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), reqs=requests(), host=st.integers(0, 40), remote=st.integers(0, 40),
       accounting=st.booleans())
def test_late_hashing_moves_the_same_blocks_through_the_kv_tiers_as_hashing_every_block_at_once(
        config: EngineConfig, reqs: list[Request], host: int, remote: int, accounting: bool) -> None:
    tiers = (host, remote, accounting)
    assert _run(config, reqs, eager=False, tiers=tiers) == _run(config, reqs, eager=True, tiers=tiers)
