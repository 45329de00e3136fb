"""The paged KV cache: one pool of blocks per layer, indexed by the block ids that the engine's `BlockManager`
hands out. A token at position p of a sequence lives in slot `block_table[p // block_size] · block_size +
p % block_size`; so a prefix-cache hit (blocks shared with an earlier prompt) reads the K and V that the earlier
prompt wrote, and nothing is recomputed.
"""

from __future__ import annotations

import numpy as np

from reference_engine.compute.ops import Array, NumpyOps, TorchOps


class PagedKVCache:
    def __init__(self, ops: NumpyOps | TorchOps, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int) -> None:
        self.ops = ops
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_blocks * block_size, num_kv_heads, head_dim)  # a slot's K (or V) is one contiguous row
        self.k = [ops.zeros(shape) for _ in range(num_layers)]
        self.v = [ops.zeros(shape) for _ in range(num_layers)]

    def slots(self, block_table: list[int], start: int, end: int) -> np.ndarray:
        """Slots of positions [start, end) of a sequence; raises IndexError past its blocks."""
        positions = np.arange(start, end)
        blocks = np.asarray(block_table, dtype=np.int64)[positions // self.block_size]
        return blocks * self.block_size + positions % self.block_size

    def write(self, layer: int, slots: Array, k: Array, v: Array) -> None:
        """k, v: [tokens, n_kv, d], one token per slot."""
        self.k[layer][slots] = k
        self.v[layer][slots] = v

    def read(self, layer: int, slots: Array) -> tuple[Array, Array]:
        """K and V of the slots (any shape S), as views [n_kv, *S, d] of gathered rows."""
        o = self.ops
        return o.heads_first(o.take_rows(self.k[layer], slots)), o.heads_first(o.take_rows(self.v[layer], slots))

    @property
    def nbytes(self) -> int:
        k = self.k[0]
        per_element = k.itemsize if hasattr(k, "itemsize") else k.element_size()
        return 2 * len(self.k) * int(np.prod(k.shape)) * per_element
