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
from typing import TYPE_CHECKING, Any

import numpy as np

from reference_engine.models import ModelSpec

if TYPE_CHECKING:
    from reference_engine.kv_cache import PagedKVCache

Array = Any  # a numpy array or a torch tensor, depending on the backend
BACKENDS = ("numpy", "torch")


# ------------------------------------------------------------------------------------------ array backends
class NumpyOps:
    name = "numpy"
    device = "cpu"

    def __init__(self, dtype: str = "float32") -> None:
        self.dtype = np.dtype(dtype)

    def tensor(self, a: np.ndarray) -> Array:
        """Floats in the compute dtype, integers and booleans as they are."""
        return a.astype(self.dtype) if a.dtype.kind == "f" else a

    def numpy(self, x: Array) -> np.ndarray:
        return np.asarray(x)

    def zeros(self, shape: tuple[int, ...]) -> Array:
        return np.full(shape, 0, dtype=self.dtype)  # written, so no page faults later inside a timed step

    def cat(self, xs: list[Array], axis: int) -> Array:
        return xs[0] if len(xs) == 1 else np.concatenate(xs, axis=axis)

    def permute(self, x: Array, axes: tuple[int, ...]) -> Array:
        return np.ascontiguousarray(x.transpose(axes))  # numpy's matmul calls BLAS on contiguous operands only

    def take_rows(self, x: Array, index: Array) -> Array:
        return np.take(x, index, axis=0)  # several times faster than x[index] for a 2-D index

    def heads_first(self, x: Array) -> Array:
        """[..., heads, d] → a view [heads, ..., d]."""
        return np.moveaxis(x, -2, 0)

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        return x * (1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)) * weight

    def silu(self, x: Array) -> Array:
        return x / (1.0 + np.exp(-x))

    def softmax_(self, x: Array) -> Array:
        """In place: a fresh array the size of a prefill's attention scores costs page faults."""
        x -= x.max(-1, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(-1, keepdims=True)
        return x

    def argmax(self, x: Array) -> np.ndarray:
        return x.argmax(-1)

    def synchronize(self) -> None:
        pass


class TorchOps:
    name = "torch"

    def __init__(self, dtype: str = "float32", device: str = "cpu") -> None:
        import torch

        self.torch = torch
        self.dtype = getattr(torch, dtype)
        self.device = torch.device(device)

    def tensor(self, a: np.ndarray) -> Array:
        t = self.torch.from_numpy(np.ascontiguousarray(a))
        if a.dtype.kind == "f":
            t = t.to(self.dtype)
        return t.to(self.device)

    def numpy(self, x: Array) -> np.ndarray:
        return x.detach().to("cpu", self.torch.float64 if x.is_floating_point() else x.dtype).numpy()

    def zeros(self, shape: tuple[int, ...]) -> Array:
        return self.torch.zeros(shape, dtype=self.dtype, device=self.device)

    def cat(self, xs: list[Array], axis: int) -> Array:
        return xs[0] if len(xs) == 1 else self.torch.cat(xs, dim=axis)

    def permute(self, x: Array, axes: tuple[int, ...]) -> Array:
        return x.permute(axes)

    def take_rows(self, x: Array, index: Array) -> Array:
        return x[index]

    def heads_first(self, x: Array) -> Array:
        return x.movedim(-2, 0)

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        return x * self.torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight

    def silu(self, x: Array) -> Array:
        return self.torch.nn.functional.silu(x)

    def softmax_(self, x: Array) -> Array:
        return self.torch.softmax(x, dim=-1)

    def argmax(self, x: Array) -> np.ndarray:
        return x.argmax(-1).cpu().numpy()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


def limit_cpu_threads(threads: int) -> int:
    """Cap the CPU threads of numpy's OpenBLAS (as numpy's wheels bundle it) and of torch, if loaded: on a busy
    machine, multi-threaded BLAS stalls whole steps waiting for a descheduled thread. Returns the previous
    OpenBLAS thread count, or 0 when numpy's BLAS was not found (then set OPENBLAS_NUM_THREADS before Python
    starts)."""
    import ctypes
    import glob
    import os
    import sys

    if threads < 1:
        raise ValueError(f"threads must be ≥ 1, got {threads}")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    previous = 0
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "libscipy_openblas*")):
        lib = ctypes.CDLL(path)
        for suffix in ("64_", ""):
            if hasattr(lib, f"scipy_openblas_set_num_threads{suffix}"):
                previous = getattr(lib, f"scipy_openblas_get_num_threads{suffix}")()
                getattr(lib, f"scipy_openblas_set_num_threads{suffix}")(threads)
    return previous


def make_ops(backend: str = "numpy", dtype: str = "float32", device: str = "cpu") -> NumpyOps | TorchOps:
    if backend == "numpy":
        if device != "cpu":
            raise ValueError(f"the numpy backend runs on the CPU only, not {device!r}")
        return NumpyOps(dtype)
    if backend == "torch":
        return TorchOps(dtype, device)
    raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")


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
