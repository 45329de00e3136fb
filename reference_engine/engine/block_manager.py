"""Paged KV blocks with prefix caching by chained block hashes (vLLM's design, nano-vllm's shape).

A block is either held (reference count > 0), free and still holding cached KV (reusable on a prefix hit,
evicted least recently freed first when a fresh block is needed), or free and empty.

Private parts are hashed late. Hashing and registering every block is most of what a simulator spends here,
yet most prompt blocks can never be shared: a prompt's *private* part, from its first segment that no prompt
looked up before it (e.g. the user's own text), can only be hit by a later prompt that contains that segment
too. So a private part is hashed when such a prompt is looked up (`_reveal`); until then its blocks are
registered nowhere, and once freed they wait in the LRU as one unhashed run. Blocks are cached, hit and evicted
exactly as if every block had been hashed when it was computed.

With KV tiers (kv_tiers.py), evicted cached blocks move to the tiers in eviction order, an unhashed run's blocks
hashed as they go; a prompt's prefix found in a tier is copied back into fresh GPU blocks at allocation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from reference_engine.engine.kv_tiers import KvHit, KvTiers
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Sequence


@dataclass(slots=True, eq=False)
class FreeRun:
    """Blocks freed together that still hold cached KV, in eviction order (a sequence's last block first).

    A hashed run's blocks are registered in the prefix cache; one that a hit reused or that was freed again
    later is skipped (its `run_of` entry no longer names this run). An unhashed run holds a private part:
    `blocks[j]` is block `last_index - j` of `prompt`, and nothing can reuse it until it is revealed."""

    blocks: list[int]
    hashed: bool
    start: int = 0  # blocks[:start] are gone (evicted)
    key: str = ""  # of an unhashed run: the first segment key of its private part
    prompt: Prompt | None = None
    last_index: int = 0
    hashes: list[int] | None = None  # of an unhashed run with tiers: its prompt's, once a block was evicted


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 tiers: KvTiers | None = None) -> None:
        """`tiers`: KV tiers behind the GPU's blocks (kv_tiers.py): evicted cached blocks move there, and a prompt
        prefix found there is copied back at allocation (`last_hit` says where each part came from)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token (got {num_blocks} × {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.empty_blocks = list(range(num_blocks - 1, -1, -1))  # taken from the end
        self.cached_free: deque[FreeRun] = deque()  # least recently freed first
        self.num_cached_free = 0
        self.run_of: list[FreeRun | None] = [None] * num_blocks  # the hashed run a free cached block is in
        self.seen_keys: set[str] = set()  # segment keys of every prompt looked up
        self.private_owner: dict[str, Sequence | FreeRun] = {}  # first key of an unhashed private part -> it
        self.tiers = tiers
        self.last_hit: KvHit | None = None  # of the latest allocate(), with tiers

    @property
    def num_free_blocks(self) -> int:
        return len(self.empty_blocks) + self.num_cached_free

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def free_blocks(self) -> list[int]:
        """Every free block: empty ones, then cached ones in eviction order."""
        cached = [b for run in self.cached_free for b in run.blocks[run.start:]
                  if not run.hashed or self.run_of[b] is run]
        return self.empty_blocks[::-1] + cached

    # --------------------------------------------------------------------------------- prefill admission
    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Blocks holding the longest cached prefix of the sequence's prompt."""
        if not self.enable_prefix_caching:
            return []
        if seq.block_hashes is None:
            self._look_up(seq)
        hits = []
        for h in seq.block_hashes:  # type: ignore[union-attr]
            block = self.hash_to_block.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def _look_up(self, seq: Sequence) -> None:
        """First look-up of the sequence's prompt (or the first since it lost its blocks): reveal the private
        parts it may hit, and hash its own blocks up to its private part, if it has one."""
        prompt = seq.request.prompt
        seen = self.seen_keys
        private = None
        for i, (key, _) in enumerate(prompt.segments):
            owner = self.private_owner.get(key)
            if owner is not None and owner is not seq:
                self._reveal(key, owner)
            if private is None and key not in seen:
                private = i
            seen.add(key)
        if private is None:
            seq.block_hashes = prompt.block_hashes(self.block_size)
            return
        key = prompt.segments[private][0]
        seq.block_hashes = Prompt(prompt.segments[:private]).block_hashes(self.block_size)  # the same hashes
        seq.private_key = key
        self.private_owner[key] = seq

    def _reveal(self, key: str, owner: Sequence | FreeRun) -> None:
        """Hash and register a private part, as if it had been registered when computed."""
        del self.private_owner[key]
        if isinstance(owner, Sequence):
            owner.block_hashes = owner.request.prompt.block_hashes(self.block_size)
            owner.private_key = None
            self.cache_computed_blocks(owner)
            return
        assert owner.prompt is not None
        hashes = owner.hashes or owner.prompt.block_hashes(self.block_size)
        block_hash, hash_to_block, run_of = self.block_hash, self.hash_to_block, self.run_of
        for j in range(owner.start, len(owner.blocks)):
            block, h = owner.blocks[j], hashes[owner.last_index - j]
            block_hash[block] = h
            hash_to_block[h] = block
            run_of[block] = owner
        owner.hashed, owner.prompt, owner.hashes = True, None, None

    def _tier_continuation(self, seq: Sequence, start: int) -> list[tuple[int, int | None]]:
        """After the GPU's leading hits, the prompt blocks that continue the prefix in a tier (block None) or
        again on the GPU (its block id). A private part is never in a tier: no prompt with its first segment
        was looked up before, so none of its blocks was ever computed."""
        out: list[tuple[int, int | None]] = []
        tiers, hash_to_block = self.tiers, self.hash_to_block
        assert tiers is not None and seq.block_hashes is not None
        for h in seq.block_hashes[start:]:
            block = hash_to_block.get(h)
            if block is None and tiers.tier_of(h) is None:
                break
            out.append((h, block))
        return out

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        hits = self._prefix_hits(seq)
        if self.tiers is not None and self.enable_prefix_caching:
            hits = hits + [b for _, b in self._tier_continuation(seq, len(hits)) if b is not None]
        reclaimed = sum(1 for b in hits if self.ref_counts[b] == 0)
        return self.blocks_for(num_tokens) - len(hits) <= self.num_free_blocks - reclaimed

    def cached_prefix_tokens(self, seq: Sequence, num_tokens: int) -> int:
        """Leading tokens a prefix hit would spare; at least one token is always computed, so that the
        step can sample from it."""
        hits = len(self._prefix_hits(seq))
        if self.tiers is not None and self.enable_prefix_caching:
            hits += len(self._tier_continuation(seq, hits))
        return min(hits * self.block_size, num_tokens - 1)

    def allocate(self, seq: Sequence, num_tokens: int) -> int:
        """Give the sequence blocks for `num_tokens`; returns how many leading tokens were already cached."""
        assert not seq.block_table, f"{seq} already holds blocks"
        hits = self._prefix_hits(seq)
        if self.tiers is not None and self.enable_prefix_caching:
            return self._allocate_tiered(seq, num_tokens, hits)
        self._reuse(hits)
        seq.block_table = hits + self.take_blocks(self.blocks_for(num_tokens) - len(hits))
        seq.num_hashed_blocks = len(hits)
        return min(len(hits) * self.block_size, num_tokens - 1)

    def _reuse(self, blocks: list[int]) -> None:
        """Take a reference to each cached block, out of the LRU if it was free."""
        ref_counts, run_of = self.ref_counts, self.run_of
        for block in blocks:
            if ref_counts[block] == 0:
                run_of[block] = None
                self.num_cached_free -= 1
            ref_counts[block] += 1

    def _allocate_tiered(self, seq: Sequence, num_tokens: int, hits: list[int]) -> int:
        """allocate() with tiers: blocks of the prefix found in a tier get fresh GPU blocks (their KV is copied
        back) and leave the tier."""
        tiers, bs = self.tiers, self.block_size
        assert tiers is not None and seq.block_hashes is not None
        rest = self._tier_continuation(seq, len(hits))
        self._reuse(hits + [b for _, b in rest if b is not None])
        loaded = [h for h, b in rest if b is None]
        where = [tiers.tier_of(h) for h in loaded]
        for h in loaded:
            tiers.take(h)
        fresh = iter(self.take_blocks(self.blocks_for(num_tokens) - (len(hits) + len(rest) - len(loaded))))
        table = list(hits)
        for h, block in rest:
            if block is None:
                block = next(fresh)
                self.block_hash[block] = h
                self.hash_to_block[h] = block
            table.append(block)
        seq.block_table = table + list(fresh)
        seq.num_hashed_blocks = len(hits) + len(rest)
        computed = min(seq.num_hashed_blocks * bs, num_tokens - 1)
        # Tokens per source; the cap (one token is always computed) comes off the last block of the prefix.
        sources = ["device"] * len(hits) + ["device" if b is not None else where.pop(0) for _, b in rest]
        tokens = {"device": 0, "host": 0, "remote": 0}
        for source in sources:
            tokens[source] += bs
        if sources:
            tokens[sources[-1]] -= len(sources) * bs - computed
        # A private part's blocks were never evicted (never computed before), so the run stops where
        # seq.block_hashes does.
        evicted, reuse = tiers.evicted_run(seq.block_hashes[seq.num_hashed_blocks:])
        evicted_tokens = min(evicted * bs, max(0, seq.num_prompt_tokens - 1 - computed))
        self.last_hit = KvHit(tokens["device"], tokens["host"], tokens["remote"], evicted_tokens,
                              reuse if evicted_tokens else 0)
        return computed

    def take_blocks(self, count: int) -> list[int]:
        """Empty blocks first; then evict the least recently freed cached ones."""
        empty = self.empty_blocks
        if count <= len(empty):
            taken = empty[len(empty) - count:]
            del empty[len(empty) - count:]
        else:
            taken = empty[::-1]
            empty.clear()
            taken += self._evict(count - len(taken))
        ref_counts = self.ref_counts
        for block in taken:
            ref_counts[block] = 1
        return taken

    def _evict(self, count: int) -> list[int]:
        """The least recently freed cached blocks, emptied; with tiers, their hashes move there in this order."""
        evicted: list[int] = []
        demoted: list[int] | None = [] if self.tiers is not None else None
        runs = self.cached_free
        while len(evicted) < count:
            run = runs[0]
            if run.hashed:
                block_hash, hash_to_block, run_of = self.block_hash, self.hash_to_block, self.run_of
                while run.start < len(run.blocks) and len(evicted) < count:
                    block = run.blocks[run.start]
                    run.start += 1
                    if run_of[block] is run:
                        run_of[block] = None
                        h = block_hash[block]
                        del hash_to_block[h]  # type: ignore[index]
                        block_hash[block] = None
                        evicted.append(block)
                        if demoted is not None:
                            demoted.append(h)  # type: ignore[arg-type]
            else:
                end = min(run.start + count - len(evicted), len(run.blocks))
                evicted += run.blocks[run.start:end]
                if demoted is not None:  # hashed now, as if hashed when computed
                    assert run.prompt is not None
                    if run.hashes is None:
                        run.hashes = run.prompt.block_hashes(self.block_size)
                    hashes = run.hashes
                    demoted += [hashes[run.last_index - j] for j in range(run.start, end)]
                run.start = end
            if run.start == len(run.blocks):
                runs.popleft()
                if not run.hashed:  # a private part, now gone entirely
                    del self.private_owner[run.key]
        self.num_cached_free -= count
        if demoted:
            self.tiers.demote(demoted)  # type: ignore[union-attr]
        return evicted

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the hashes of prompt blocks whose KV is now computed, so later prompts can hit them."""
        if not self.enable_prefix_caching:
            return
        hashes = seq.block_hashes or []
        full = min(seq.num_computed_tokens // self.block_size, len(hashes))
        if full <= seq.num_hashed_blocks:
            return
        block_hash, hash_to_block = self.block_hash, self.hash_to_block
        for block, h in zip(seq.block_table[seq.num_hashed_blocks:full], hashes[seq.num_hashed_blocks:full],
                            strict=True):
            if block_hash[block] is None and h not in hash_to_block:
                block_hash[block] = h
                hash_to_block[h] = block
        seq.num_hashed_blocks = full

    # ------------------------------------------------------------------------------------------ decode
    def blocks_needed(self, seq: Sequence, steps: int) -> int:
        """New blocks for `steps` decode steps (each writes the KV of one more token)."""
        return max(0, self.blocks_for(seq.num_computed_tokens + steps) - len(seq.block_table))

    def append_blocks(self, seq: Sequence, count: int) -> None:
        if count > 0:
            seq.block_table += self.take_blocks(count)

    def trim(self, seqs: list[Sequence]) -> None:
        """Release blocks reserved beyond the computed tokens (a run ended earlier than planned)."""
        unused: list[int] = []
        for seq in seqs:
            keep = max(1, self.blocks_for(seq.num_computed_tokens))
            if len(seq.block_table) > keep:
                unused += seq.block_table[:keep - 1:-1]
                del seq.block_table[keep:]
        if unused:
            self._release(unused)

    # --------------------------------------------------------------------------------------- release
    def deallocate(self, seq: Sequence) -> None:
        # Release the tail first, so that the LRU evicts a prompt's last blocks before its shared prefix.
        table = seq.block_table
        key = seq.private_key
        if key is None:
            self._release(table[::-1])
        else:
            del self.private_owner[key]
            shared = len(seq.block_hashes or [])
            end = max(shared, min(seq.num_computed_tokens, seq.num_prompt_tokens) // self.block_size)
            self._release(table[end:][::-1])  # generated tokens and a partial block: never cached
            private = table[shared:end][::-1]  # the private part's computed blocks: one unhashed run
            if private:
                ref_counts = self.ref_counts
                for block in private:  # never shared: this sequence held them alone
                    ref_counts[block] = 0
                run = FreeRun(private, hashed=False, key=key, prompt=seq.request.prompt, last_index=end - 1)
                self.cached_free.append(run)
                self.num_cached_free += len(private)
                self.private_owner[key] = run
            self._release(table[:shared][::-1])
            seq.block_hashes = None  # looked up afresh if it is admitted again
            seq.private_key = None
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def _release(self, blocks: list[int]) -> None:
        """Drop one reference to each block; freed cached blocks enter the LRU in the order given."""
        ref_counts, block_hash = self.ref_counts, self.block_hash
        freed = []
        for block in blocks:
            ref_counts[block] -= 1
            assert ref_counts[block] >= 0, f"block {block} released twice"
            if ref_counts[block] == 0:
                freed.append(block)
        cached = [b for b in freed if block_hash[b] is not None]
        if cached:
            run = FreeRun(cached, hashed=True)
            run_of = self.run_of
            for block in cached:
                run_of[block] = run
            self.cached_free.append(run)
            self.num_cached_free += len(cached)
        self.empty_blocks += [b for b in freed if block_hash[b] is None]
