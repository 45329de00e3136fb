"""A small Llama-style decoder-only transformer that really computes: RMSNorm, rotary embeddings, grouped-query
attention over a paged KV cache, a SwiGLU MLP and an untied LM head, with random weights from a seed.

One forward pass serves a whole engine step: the rows are the step's prefill chunks (in batch order) followed by
one row per decoding sequence. The linear layers see every row at once (that is what batching buys); attention
runs per prefill chunk (causal over the cached prefix plus the chunk) and once, padded and masked, over all
decodes of different context lengths.

Two backends share this code through a handful of array operations (`NumpyOps`, `TorchOps`): numpy on CPU, and
torch on CPU or CUDA. Weights are drawn with numpy from the seed, so both backends hold the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from reference_engine.compute.ops import Array, make_ops
from reference_engine.engine.models import ModelSpec

if TYPE_CHECKING:
    from reference_engine.compute.kv_cache import PagedKVCache

# ----------------------------------------------------------------------------------------------- a step
@dataclass(slots=True)
class StepInput:
    """One forward pass, as host arrays. Rows: the prefill chunks in order, then one row per decode."""

    token_ids: np.ndarray  # [N] int64
    positions: np.ndarray  # [N] int64, each token's position in its sequence
    slots: np.ndarray  # [N] int64, the KV-cache slot each token's K and V are written to
    chunks: list[tuple[int, np.ndarray]]  # per prefill chunk: (tokens already cached c, slots of all c + n tokens)
    decode_slots: np.ndarray  # [B, L_max] int64 context slots per decode, padded with slot 0
    decode_lengths: np.ndarray  # [B] context tokens per decode, its own token included
    sample_rows: np.ndarray  # rows whose next token is sampled


@dataclass(slots=True)
class _Layer:
    attn_norm: Array
    wqkv: Array  # [hidden, (n_q + 2·n_kv)·d]: the query, key and value projections side by side
    wo: Array
    mlp_norm: Array
    w_gate_up: Array  # [hidden, 2·intermediate]
    w_down: Array


class Transformer:
    def __init__(self, spec: ModelSpec, seed: int = 0, backend: str = "numpy", dtype: str = "float32",
                 device: str = "cpu", rope_theta: float = 10000.0, norm_eps: float = 1e-5) -> None:
        if spec.num_experts != 1:
            raise ValueError(f"{spec.name} is a mixture of experts; the real executor runs dense models only")
        if spec.num_heads % spec.num_kv_heads or spec.head_dim % 2:
            raise ValueError(f"{spec.name}: heads ({spec.num_heads}) must be a multiple of KV heads "
                             f"({spec.num_kv_heads}) and head_dim ({spec.head_dim}) even")
        self.spec = spec
        self.ops = make_ops(backend, dtype, device)
        self.norm_eps = norm_eps
        self.inv_freq = 1.0 / rope_theta ** (np.arange(0, spec.head_dim, 2, dtype=np.float64) / spec.head_dim)
        rng = np.random.default_rng(seed)
        h, q, kv, inter = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, \
            spec.intermediate_size

        def linear(fan_in: int, fan_out: int) -> Array:
            return self.ops.tensor(rng.standard_normal((fan_in, fan_out), dtype=np.float32) / np.sqrt(fan_in))

        def ones(n: int) -> Array:
            return self.ops.tensor(np.ones(n, dtype=np.float32))

        self.embedding = self.ops.tensor(rng.standard_normal((spec.vocab_size, h), dtype=np.float32))
        self.layers = [_Layer(ones(h), linear(h, q + 2 * kv), linear(q, h), ones(h), linear(h, 2 * inter),
                              linear(inter, h)) for _ in range(spec.num_layers)]
        self.final_norm = ones(h)
        self.lm_head = linear(h, spec.vocab_size)

    # ------------------------------------------------------------------------------------- pieces
    def _rope(self, positions: np.ndarray) -> tuple[Array, Array]:
        angles = positions.astype(np.float64)[:, None] * self.inv_freq[None, :]
        return self.ops.tensor(np.cos(angles)[:, None, :]), self.ops.tensor(np.sin(angles)[:, None, :])

    def _rotate(self, x: Array, cos: Array, sin: Array) -> Array:
        half = self.spec.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return self.ops.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def _qkv(self, layer: _Layer, x: Array, cos: Array, sin: Array) -> tuple[Array, Array, Array]:
        s, n = self.spec, x.shape[0]
        qkv = self.ops.rms_norm(x, layer.attn_norm, self.norm_eps) @ layer.wqkv
        q_width, kv_width = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        q = qkv[:, :q_width].reshape(n, s.num_heads, s.head_dim)
        k = qkv[:, q_width:q_width + kv_width].reshape(n, s.num_kv_heads, s.head_dim)
        v = qkv[:, q_width + kv_width:].reshape(n, s.num_kv_heads, s.head_dim)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin), v

    def _mlp(self, layer: _Layer, x: Array) -> Array:
        inter = self.spec.intermediate_size
        gate_up = self.ops.rms_norm(x, layer.mlp_norm, self.norm_eps) @ layer.w_gate_up
        return (self.ops.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ layer.w_down

    def _attend(self, q: Array, k: Array, v: Array, bias: Array) -> Array:
        """q [..., n, n_q, d] against k, v [n_kv, ..., ctx, d] with an additive mask that broadcasts to
        [n_kv, ..., group, n, ctx]; returns [..., n, n_q·d]. The query heads sharing a KV head are stacked as
        rows of one matrix product, and K is used transposed in place: numpy's matmul calls BLAS for such
        operands, but loops slowly over broadcast or arbitrarily strided ones."""
        s, o = self.spec, self.ops
        group, kv_heads, d = s.num_heads // s.num_kv_heads, s.num_kv_heads, s.head_dim
        lead, n, ctx = q.shape[:-3], q.shape[-3], k.shape[-2]
        nd = len(lead)
        q = o.permute(q.reshape(*lead, n, kv_heads, group, d) * (1.0 / np.sqrt(d)),
                      (nd + 1, *range(nd), nd + 2, nd, nd + 3))  # [n_kv, ..., group, n, d]
        scores = q.reshape(kv_heads, *lead, group * n, d) @ k.swapaxes(-1, -2)
        scores.reshape(kv_heads, *lead, group, n, ctx)[...] += bias
        out = (o.softmax_(scores) @ v).reshape(kv_heads, *lead, group, n, d)
        out = o.permute(out, (*range(1, nd + 1), nd + 2, 0, nd + 1, nd + 3))  # [..., n, n_kv, group, d]
        return out.reshape(*lead, n, s.num_heads * d)

    def logits(self, hidden: Array) -> Array:
        return self.ops.rms_norm(hidden, self.final_norm, self.norm_eps) @ self.lm_head

    # ------------------------------------------------------------------------------------ forward
    def forward(self, step: StepInput, kv: PagedKVCache) -> Array:
        """Writes the step's K and V into the cache, attends over the cached context, and returns the logits
        of `step.sample_rows` ([rows, vocab], on the backend)."""
        o = self.ops
        x = self.embedding[o.tensor(step.token_ids)]
        cos, sin = self._rope(step.positions)
        slots = o.tensor(step.slots)
        chunk_masks = []
        row = 0
        for cached, ctx_slots in step.chunks:
            n = len(ctx_slots) - cached
            causal = np.arange(len(ctx_slots))[None, :] > cached + np.arange(n)[:, None]
            chunk_masks.append((row, n, o.tensor(ctx_slots), o.tensor(np.where(causal, -np.inf, 0.0))))
            row += n
        num_decodes = len(step.decode_lengths)
        if num_decodes:
            padding = np.arange(step.decode_slots.shape[1])[None, :] >= step.decode_lengths[:, None]
            decode_slots = o.tensor(step.decode_slots)
            decode_bias = o.tensor(np.where(padding, -np.inf, 0.0)[:, None, None, :])
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            kv.write(index, slots, k, v)
            parts = []
            for start, n, ctx_slots, bias in chunk_masks:
                ck, cv = kv.read(index, ctx_slots)
                parts.append(self._attend(q[start:start + n], ck, cv, bias))
            if num_decodes:
                dk, dv = kv.read(index, decode_slots)  # [n_kv, B, L_max, d]
                parts.append(self._attend(q[row:, None], dk, dv, decode_bias).reshape(num_decodes, -1))
            x = x + o.cat(parts, 0) @ layer.wo
            x = x + self._mlp(layer, x)
        return self.logits(x[o.tensor(step.sample_rows)])

    def reference_logits(self, token_ids: np.ndarray) -> np.ndarray:
        """Logits at every position of one sequence, recomputed densely without any KV cache: the ground truth
        that cached, chunked and prefix-hit computation must reproduce."""
        o, n = self.ops, len(token_ids)
        x = self.embedding[o.tensor(np.asarray(token_ids, dtype=np.int64))]
        cos, sin = self._rope(np.arange(n))
        bias = o.tensor(np.triu(np.full((n, n), -np.inf), 1))
        for layer in self.layers:
            q, k, v = self._qkv(layer, x, cos, sin)
            k, v = o.heads_first(k), o.heads_first(v)
            x = x + self._attend(q, k, v, bias) @ layer.wo
            x = x + self._mlp(layer, x)
        return o.numpy(self.logits(x))


def sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """Greedy (temperature 0) or temperature sampling, one token per row of host logits."""
    if temperature <= 0:
        return logits.argmax(-1)
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.array([rng.choice(len(row), p=row) for row in p], dtype=np.int64)
