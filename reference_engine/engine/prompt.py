"""Prompts as content segments, so that shared prefixes are visible without materialising tokens.

A prompt is a sequence of segments `(key, length)`: e.g. a tenant's system prompt, the user's own text, an
assistant prefill. Two prompts whose segments start alike share those tokens. Block hashes chain the
content of each full KV block onto the previous block's hash, as vLLM's prefix cache does, so equal hashes
mean equal prefixes. Token ids are derived from the segment key only when a real model needs them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Prompt:
    segments: tuple[tuple[str, int], ...]
    num_tokens: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_tokens", sum(length for _, length in self.segments))

    def block_hashes(self, block_size: int) -> list[int]:
        """Chained hashes of the prompt's full blocks: each hashes the previous one's hash and the
        (segment key, offset, length) pieces its tokens come from."""
        hashes: list[int] = []
        prev = 0
        pieces: tuple[tuple[str, int, int], ...] = ()  # of a block that straddles segments
        filled = 0
        for key, length in self.segments:
            offset = 0
            if filled:  # finish the block the previous segment started
                take = min(block_size - filled, length)
                pieces += ((key, 0, take),)
                filled += take
                offset = take
                if filled < block_size:
                    continue
                prev = hash((prev, *pieces))
                hashes.append(prev)
                pieces, filled = (), 0
            whole_end = offset + (length - offset) // block_size * block_size
            for start in range(offset, whole_end, block_size):
                prev = hash((prev, (key, start, block_size)))
                hashes.append(prev)
            if whole_end < length:
                pieces, filled = ((key, whole_end, length - whole_end),), length - whole_end
        return hashes

    def token_ids(self, vocab_size: int) -> np.ndarray:
        """Deterministic token ids: each segment's tokens come from a generator seeded by its key."""
        parts = []
        for key, length in self.segments:
            seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
            parts.append(np.random.default_rng(seed).integers(0, vocab_size, size=length, dtype=np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
