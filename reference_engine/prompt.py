"""Prompts as content segments, so that shared prefixes are visible without materialising tokens.

A prompt is a sequence of segments `(key, length)`: e.g. a tenant's system prompt, the user's own text, an
assistant prefill. Two prompts whose segments start alike share those tokens. Block hashes chain the
content of each full KV block onto the previous block's hash, as vLLM's prefix cache does, so equal hashes
mean equal prefixes. Token ids are derived from the segment key only when a real model needs them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Prompt:
    segments: tuple[tuple[str, int], ...]

    @property
    def num_tokens(self) -> int:
        return sum(length for _, length in self.segments)

    def block_hashes(self, block_size: int) -> list[int]:
        """Chained hashes of the prompt's full blocks."""
        hashes: list[int] = []
        prev = 0
        pieces: list[tuple[str, int, int]] = []  # (segment key, offset, length) of each piece of this block
        filled = 0
        for key, length in self.segments:
            offset = 0
            while offset < length:
                take = min(block_size - filled, length - offset)
                pieces.append((key, offset, take))
                filled += take
                offset += take
                if filled == block_size:
                    prev = hash((prev, *pieces))
                    hashes.append(prev)
                    pieces.clear()
                    filled = 0
        return hashes

    def token_ids(self, vocab_size: int) -> np.ndarray:
        """Deterministic token ids: each segment's tokens come from a generator seeded by its key."""
        parts = []
        for key, length in self.segments:
            seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
            parts.append(np.random.default_rng(seed).integers(0, vocab_size, size=length, dtype=np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
