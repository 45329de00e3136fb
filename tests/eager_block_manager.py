"""The prefix cache's specification: every computed prompt block hashed and registered at once, one OrderedDict
LRU of free cached blocks. `BlockManager` hashes private parts late for speed; the differential test holds it to
exactly this one's behaviour.

A block is either held (reference count > 0), free and still holding cached KV (kept in LRU order, reusable
on a prefix hit, evicted oldest-first when a fresh block is needed), or free and empty.
"""

from __future__ import annotations

from collections import OrderedDict

from reference_engine.engine.kv_tiers import KvHit, KvTiers
from reference_engine.engine.sequence import Sequence


class EagerBlockManager:
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
        self.cached_free: OrderedDict[int, int] = OrderedDict()  # hash -> block id, least recently used first
        self.tiers = tiers
        self.last_hit: KvHit | None = None  # of the latest allocate(), with tiers

    @property
    def num_free_blocks(self) -> int:
        return len(self.empty_blocks) + len(self.cached_free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --------------------------------------------------------------------------------- prefill admission
    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Blocks holding the longest cached prefix of the sequence's prompt."""
        if not self.enable_prefix_caching:
            return []
        if seq.block_hashes is None:
            seq.block_hashes = seq.request.prompt.block_hashes(self.block_size)
        hits = []
        for h in seq.block_hashes:
            block = self.hash_to_block.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def _tier_continuation(self, seq: Sequence, start: int) -> list[tuple[int, int | None]]:
        """After the GPU's leading hits, the prompt blocks that continue the prefix in a tier (block None) or
        again on the GPU (its block id)."""
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
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.cached_free[self.block_hash[block]]
            self.ref_counts[block] += 1
        seq.block_table = hits + self.take_blocks(self.blocks_for(num_tokens) - len(hits))
        seq.num_hashed_blocks = len(hits)
        return min(len(hits) * self.block_size, num_tokens - 1)

    def _allocate_tiered(self, seq: Sequence, num_tokens: int, hits: list[int]) -> int:
        """allocate() with tiers: blocks of the prefix found in a tier get fresh GPU blocks (their KV is copied
        back) and leave the tier."""
        tiers, bs = self.tiers, self.block_size
        assert tiers is not None and seq.block_hashes is not None
        rest = self._tier_continuation(seq, len(hits))
        resident = hits + [b for _, b in rest if b is not None]
        for block in resident:
            if self.ref_counts[block] == 0:
                del self.cached_free[self.block_hash[block]]
            self.ref_counts[block] += 1
        loaded = [h for h, b in rest if b is None]
        where = [tiers.tier_of(h) for h in loaded]
        for h in loaded:
            tiers.take(h)
        fresh = iter(self.take_blocks(self.blocks_for(num_tokens) - len(resident)))
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
        evicted, reuse = tiers.evicted_run(seq.block_hashes[seq.num_hashed_blocks:])
        evicted_tokens = min(evicted * bs, max(0, seq.num_prompt_tokens - 1 - computed))
        self.last_hit = KvHit(tokens["device"], tokens["host"], tokens["remote"], evicted_tokens,
                              reuse if evicted_tokens else 0)
        return computed

    def take_blocks(self, count: int) -> list[int]:
        """Empty blocks first; then evict the least recently used cached ones."""
        empty = self.empty_blocks
        taken = empty[len(empty) - count:] if count <= len(empty) else empty[:]
        del empty[len(empty) - len(taken):]
        if len(taken) < count:
            evicted = [self.cached_free.popitem(last=False) for _ in range(count - len(taken))]
            hash_to_block, block_hash = self.hash_to_block, self.block_hash
            for h, block in evicted:
                del hash_to_block[h]
                block_hash[block] = None
            taken += [block for _, block in evicted]
            if self.tiers is not None:
                self.tiers.demote([h for h, _ in evicted])
        ref_counts = self.ref_counts
        for block in taken:
            ref_counts[block] = 1
        return taken

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the hashes of prompt blocks whose KV is now computed, so later prompts can hit them."""
        if not self.enable_prefix_caching:
            return
        hashes = seq.block_hashes or []
        full = min(seq.num_computed_tokens // self.block_size, len(hashes))
        block_hash, hash_to_block = self.block_hash, self.hash_to_block
        for block, h in zip(seq.block_table[seq.num_hashed_blocks:full], hashes[seq.num_hashed_blocks:full],
                            strict=True):
            if block_hash[block] is None and h not in hash_to_block:
                block_hash[block] = h
                hash_to_block[h] = block
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, full)

    # ------------------------------------------------------------------------------------------ decode
    def blocks_needed(self, seq: Sequence, steps: int) -> int:
        """New blocks for `steps` decode steps (each writes the KV of one more token)."""
        return max(0, self.blocks_for(seq.num_computed_tokens + steps) - len(seq.block_table))

    def append_blocks(self, seq: Sequence, count: int) -> None:
        if count > 0:
            seq.block_table += self.take_blocks(count)

    def trim(self, seqs: list[Sequence]) -> None:
        """Release blocks reserved beyond the computed tokens (a run ended earlier than planned)."""
        for seq in seqs:
            keep = max(1, self.blocks_for(seq.num_computed_tokens))
            if len(seq.block_table) > keep:
                self._release(seq.block_table[:keep - 1:-1])
                del seq.block_table[keep:]

    # --------------------------------------------------------------------------------------- release
    def deallocate(self, seq: Sequence) -> None:
        # Release the tail first, so that the LRU evicts a prompt's last blocks before its shared prefix.
        self._release(seq.block_table[::-1])
        seq.block_table = []
        seq.num_hashed_blocks = 0

    def _release(self, blocks: list[int]) -> None:
        """Drop one reference to each block; freed cached blocks enter the LRU in the order given."""
        ref_counts, block_hash = self.ref_counts, self.block_hash
        for block in blocks:
            ref_counts[block] -= 1
            assert ref_counts[block] >= 0, f"block {block} released twice"
        freed = [block for block in blocks if ref_counts[block] == 0]
        self.cached_free.update([(block_hash[b], b) for b in freed if block_hash[b] is not None])
        self.empty_blocks += [b for b in freed if block_hash[b] is None]
