"""Continuous batching under a per-step token budget, with two policies and preemption by recompute."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from reference_engine.engine.block_manager import BlockManager
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.kv_tiers import KvHit
from reference_engine.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class Batch:
    """What one step (or a run of identical decode-only steps) computes."""

    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, chunk tokens)
    decodes: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    rejected: list[Sequence] = field(default_factory=list)  # can never run on this engine
    max_steps: int = 1  # a decode-only batch may repeat unchanged this many steps
    decode_context: int = 0  # Σ (computed tokens + 1) over the decodes: the context their first step attends to
    kv_hits: list[tuple[Sequence, KvHit]] | None = None  # with KV tiers: where admitted prompts' prefixes were

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(n for _, n in self.prefills)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the last is preempted first
        self.num_prefilling = 0  # running sequences with a prefill to finish (none: no need to look for them)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> Batch:
        batch = Batch()
        budget = self.config.max_num_batched_tokens
        if self.config.policy == "decode_first":
            budget -= self._schedule_decodes(batch, budget)
            self._schedule_prefills(batch, budget)
        else:
            self._schedule_prefills(batch, budget)
            if not batch.prefills:  # then no running sequence is prefilling: each would have had a chunk
                self._schedule_decodes(batch, budget, all_decoding=True)
        if batch.decodes:
            batch.decode_context = sum([s.num_computed_tokens for s in batch.decodes]) + len(batch.decodes)
            if not batch.prefills:
                batch.max_steps, slack = self._max_decode_steps(batch.decodes)
                self._reserve_decode_blocks(batch.decodes, batch.max_steps, slack)
        return batch

    # ------------------------------------------------------------------------------------- prefills
    def _schedule_prefills(self, batch: Batch, budget: int) -> None:
        bm, cfg = self.block_manager, self.config
        for seq in self.running if self.num_prefilling else ():  # mid-prefill sequences continue first
            if budget == 0:
                return
            if seq.num_computed_tokens < seq.prefill_target:  # is_prefilling, inlined: this loop runs every step
                chunk = min(seq.prefill_target - seq.num_computed_tokens, budget)
                batch.prefills.append((seq, chunk))
                budget -= chunk
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            target = seq.num_tokens
            max_len = seq.num_prompt_tokens + seq.request.max_tokens
            if not cfg.chunked_prefill and max_len > cfg.max_num_batched_tokens:
                # Without chunking, a prefill (or the recompute after a preemption) is one step: the
                # longest context the request can reach must fit the budget (vLLM's max_model_len rule).
                self._reject(seq, "prompt_too_long", batch)
                continue
            if bm.blocks_for(max_len) > bm.num_blocks:
                self._reject(seq, "kv_cache_too_small", batch)
                continue
            if not bm.can_allocate(seq, target):
                return
            if not cfg.chunked_prefill and target - bm.cached_prefix_tokens(seq, target) > budget:
                return  # the whole prompt must fit in one step: it waits for the next
            computed = bm.allocate(seq, target)
            if bm.tiers is not None:
                assert bm.last_hit is not None
                if batch.kv_hits is None:
                    batch.kv_hits = []
                batch.kv_hits.append((seq, bm.last_hit))
            remaining = target - computed
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            seq.prefill_target = target
            seq.num_computed_tokens = computed
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = computed
            self.running.append(seq)
            self.num_prefilling += 1  # at least one token is always computed (BlockManager.allocate)
            chunk = min(remaining, budget)
            batch.prefills.append((seq, chunk))
            budget -= chunk

    # -------------------------------------------------------------------------------------- decodes
    def _schedule_decodes(self, batch: Batch, budget: int, all_decoding: bool = False) -> int:
        """Give every decoding sequence one token (preempting when KV runs out); returns tokens used.
        `all_decoding`: the caller knows that no running sequence is prefilling."""
        bm = self.block_manager
        block_size = bm.block_size
        running = SequenceStatus.RUNNING
        if all_decoding:
            decoding = self.running[:budget]
        else:
            decoding = [s for s in self.running if s.num_computed_tokens >= s.prefill_target][:budget]
        scheduled: list[Sequence] = []
        for seq in decoding:
            if seq.status is not running:
                continue  # preempted below to make room for an earlier sequence
            if seq.num_computed_tokens >= len(seq.block_table) * block_size:  # the next KV needs a new block
                while bm.num_free_blocks == 0:
                    victim = self.running[-1]
                    self._preempt(victim, batch)
                    if victim is seq:
                        break
                if seq.status is not running:
                    continue
                bm.append_blocks(seq, 1)
            scheduled.append(seq)
        batch.decodes = scheduled
        return len(scheduled)

    def _reject(self, seq: Sequence, error: str, batch: Batch) -> None:
        self.waiting.popleft()
        seq.error = error
        seq.status = SequenceStatus.FINISHED
        batch.rejected.append(seq)

    def _preempt(self, seq: Sequence, batch: Batch) -> None:
        self.running.remove(seq)
        if seq.num_computed_tokens < seq.prefill_target:
            self.num_prefilling -= 1
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.prefill_target = 0
        seq.preemptions += 1
        self.waiting.appendleft(seq)
        batch.preempted.append(seq)

    def _max_decode_steps(self, decodes: list[Sequence]) -> tuple[int, list[int]]:
        """Steps the decode batch can repeat before its membership must change: a sequence finishes, or
        the free KV blocks run out (the step after that may preempt); and each sequence's slack (tokens it can
        still write into the blocks it holds)."""
        bs = self.block_manager.block_size
        limit = min([s.request.output_tokens - s.num_output_tokens for s in decodes])  # remaining_output
        free = self.block_manager.num_free_blocks
        # Tokens each sequence can still write into the blocks it holds; then one block per block_size.
        slack = [len(s.block_table) * bs - s.num_computed_tokens for s in decodes]

        def blocks_for(steps: int) -> int:
            return sum([-((x - steps) // bs) for x in slack if x < steps])

        if blocks_for(limit) <= free:
            return limit, slack
        lo, hi = 1, limit  # one step is always possible: its blocks were appended while scheduling
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks_for(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo, slack

    def _reserve_decode_blocks(self, decodes: list[Sequence], steps: int, slack: list[int]) -> None:
        bm = self.block_manager
        bs = bm.block_size
        wanted: list[tuple[Sequence, int]] = []
        total = 0
        for seq, room in zip(decodes, slack, strict=True):
            if room < steps:  # missing = steps - room tokens' worth of blocks
                wanted.append((seq, -(-(steps - room) // bs)))
                total += wanted[-1][1]
        if total:  # one take for the whole batch: the same blocks as one take per sequence
            blocks = bm.take_blocks(total)
            start = 0
            for seq, count in wanted:
                seq.block_table += blocks[start:start + count]
                start += count

    # ---------------------------------------------------------------------------------- postprocess
    def postprocess(self, batch: Batch, steps: int, end_ns: int) -> list[Sequence]:
        """Advance the sequences by `steps` steps ending at `end_ns`; returns those that finished."""
        bm = self.block_manager
        finished: list[Sequence] = []
        for seq, chunk in batch.prefills:
            seq.num_computed_tokens += chunk
            seq.num_prefill_chunks += 1
            bm.cache_computed_blocks(seq)
            if not seq.is_prefilling:
                self.num_prefilling -= 1
                seq.num_output_tokens += 1
                seq.last_token_ns = end_ns
                if seq.first_token_ns is None:
                    seq.first_token_ns = end_ns
                if seq.remaining_output == 0:
                    finished.append(seq)
        for seq in batch.decodes:
            seq.num_computed_tokens += steps
            seq.num_output_tokens += steps
            seq.last_token_ns = end_ns
            if seq.num_output_tokens == seq.request.output_tokens:  # remaining_output == 0, inlined
                finished.append(seq)
        if steps < batch.max_steps:  # the run ended early: give back the blocks reserved for the rest
            bm.trim([seq for seq in batch.decodes if seq.num_output_tokens != seq.request.output_tokens])
        for seq in finished:
            self.running.remove(seq)
            bm.deallocate(seq)
            seq.status = SequenceStatus.FINISHED
            seq.finish_ns = end_ns
        return finished
