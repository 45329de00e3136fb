"""KV tiers behind the GPU's prefix cache: host memory, then a pooled remote store (LMCache's CPU backend and
vLLM's CPU offloading; Mooncake Store).

A cached block the GPU evicts (least recently used first) moves to the host tier; one the host tier evicts
moves to the remote tier; one the last tier evicts is gone. The tiers are exclusive: a prefix found in a tier is
copied back into GPU blocks and leaves the tier, so together the GPU and its tiers behave as one LRU cache of
their summed capacity. Blocks are known by their chained hash only (their KV content is not simulated).

With reuse accounting on, the tiers also remember when each block left the last tier. A later prompt that needs
it again recomputes it for lack of capacity; the evictions from the last tier since then are about how many
more blocks an LRU cache would have needed to keep it (an LRU cache evicts in recency order).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

TIER_NAMES = ("host", "remote")


@dataclass(frozen=True, slots=True)
class KvHit:
    """Where a prompt's cached prefix was found when its prefill was scheduled, in tokens."""

    device_tokens: int  # already in GPU blocks
    host_tokens: int  # copied back from the host tier
    remote_tokens: int  # copied back from the remote tier
    evicted_tokens: int  # right after the hits: cached here before, evicted from every tier since
    evicted_reuse_blocks: int  # extra capacity (blocks) that would have kept all of those


class KvTiers:
    def __init__(self, host_blocks: int, remote_blocks: int, accounting: bool = True) -> None:
        if host_blocks < 0 or remote_blocks < 0:
            raise ValueError(f"tier capacities must be ≥ 0 blocks, got {host_blocks} and {remote_blocks}")
        tiers = [(n, c) for n, c in zip(TIER_NAMES, (host_blocks, remote_blocks), strict=True) if c > 0]
        self.names = tuple(n for n, _ in tiers)
        self.capacities = tuple(c for _, c in tiers)
        self.blocks: tuple[OrderedDict[int, None], ...] = tuple(OrderedDict() for _ in tiers)  # hash, LRU first
        self.gone: dict[int, int] | None = {} if accounting else None  # hash -> evictions when it left the last
        self.evictions = 0  # from the last tier

    def tier_of(self, block_hash: int) -> str | None:
        for name, tier in zip(self.names, self.blocks, strict=True):
            if block_hash in tier:
                return name
        return None

    def demote(self, hashes: list[int]) -> None:
        """Blocks the GPU evicted, in eviction order."""
        for h in hashes:
            self._put(0, h)

    def _put(self, level: int, block_hash: int) -> None:
        while level < len(self.blocks):
            tier = self.blocks[level]
            tier[block_hash] = None
            if len(tier) <= self.capacities[level]:
                return
            block_hash, _ = tier.popitem(last=False)
            level += 1
        self.evictions += 1
        if self.gone is not None:
            self.gone[block_hash] = self.evictions

    def take(self, block_hash: int) -> None:
        """A block copied back into the GPU leaves its tier."""
        for tier in self.blocks:
            if block_hash in tier:
                del tier[block_hash]
                return

    def evicted_run(self, hashes: list[int]) -> tuple[int, int]:
        """Of `hashes` (a prompt's blocks right after its cached prefix): how many leading ones were evicted from
        every tier, and the extra blocks of capacity that would have kept them all."""
        if self.gone is None:
            return 0, 0
        count, oldest = 0, self.evictions
        for h in hashes:
            left = self.gone.get(h)
            if left is None:
                break
            count += 1
            oldest = min(oldest, left)
        return count, (self.evictions - oldest + 1 if count else 0)
