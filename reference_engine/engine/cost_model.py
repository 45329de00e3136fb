"""Roofline cost of one engine step (DESIGN.md, "Step cost model").

Per step with prefill chunks (n_i new tokens over c_i already cached) and decodes with context ctx_j, N total
tokens and S sampled positions:

    F_lin  = 2·N·P_blk + 2·S·P_head                B_w  = b·(P_blk + P_head)   (read once per micro-batch)
    F_attn = 4·L·n_q·d·[Σ(n_i·c_i + n_i(n_i+1)/2) + Σ ctx_j]
    B_kv   = 2·L·n_kv·d·b·[Σ(c_i + n_i) + Σ ctx_j]
    t      = max(F_lin/(Π·η_c), B_w/(β·η_m)) + max(F_attn/(Π·η_a), B_kv/(β·η_kv)) + t_overhead (+ all-reduce)

(η_kv = η_m unless calibrated apart; an optional per-sequence overhead adds t_seq per sequence in the step.)

Tensor parallelism divides FLOPs and bytes by the degree and adds two ring all-reduces per layer. A MoE
multiplies each token by its routed experts only, and reads the experts that some token of the micro-batch
was routed to. Expert layers placed on the host CPU run there, at the host's FLOP/s and DRAM bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from reference_engine.engine.hardware import HardwareSpec
from reference_engine.engine.models import ModelSpec


@dataclass(frozen=True)
class CostParams:
    """Efficiencies and overheads; the defaults reproduce the worked examples in DESIGN.md."""

    compute_efficiency: float = 0.70  # η_c, dense GEMMs (Vidur's profiles: 0.70–0.75)
    memory_efficiency: float = 0.85  # η_m, weight reads (0.75–0.85)
    attention_efficiency: float = 0.45  # η_a, attention FLOPs (0.4–0.6)
    step_overhead_s: float = 0.001  # scheduling, sampling, kernel launches per step
    # KV-cache reads by the attention kernel; None: as efficient as weight reads (η_m). Paged gathers of
    # many short sequences can fall well below a GEMM's streaming bandwidth.
    kv_memory_efficiency: float | None = None
    per_sequence_overhead_s: float = 0.0  # per sequence in a step: input preparation, sampling, bookkeeping

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency", "attention_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.kv_memory_efficiency is not None and not 0 < self.kv_memory_efficiency <= 1:
            raise ValueError(f"kv_memory_efficiency must be in (0, 1], got {self.kv_memory_efficiency}")
        if self.step_overhead_s < 0 or self.per_sequence_overhead_s < 0:
            raise ValueError("overheads must be ≥ 0 seconds")


class StepCostModel:
    def __init__(self, model: ModelSpec, hw: HardwareSpec, *, tensor_parallel: int = 1,
                 prefill_microbatch: int = 0, offload_experts: bool = False,
                 params: CostParams | None = None) -> None:
        if tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be ≥ 1, got {tensor_parallel}")
        if prefill_microbatch < 0:
            raise ValueError(f"prefill_microbatch must be ≥ 0 (0: none), got {prefill_microbatch}")
        if offload_experts and model.num_experts == 1:
            raise ValueError(f"offload_experts needs a mixture-of-experts model; {model.name} is dense")
        self.model, self.hw, self.tp = model, hw, tensor_parallel
        self.microbatch = prefill_microbatch
        self.offload_experts = offload_experts
        self.params = params or CostParams()
        p, m = self.params, model
        self._flop_rate = hw.peak_flops * p.compute_efficiency * tensor_parallel
        self._byte_rate = hw.mem_bandwidth * p.memory_efficiency * tensor_parallel
        self._attn_flop_rate = hw.peak_flops * p.attention_efficiency * tensor_parallel
        kv_efficiency = p.memory_efficiency if p.kv_memory_efficiency is None else p.kv_memory_efficiency
        self._kv_byte_rate = hw.mem_bandwidth * kv_efficiency * tensor_parallel
        # Attention per context token: FLOPs for one query against it, bytes to read its K and V.
        self._attn_flops_per_pair = 4 * m.num_layers * m.num_heads * m.head_dim
        self._kv_bytes_per_token = m.kv_bytes_per_token
        self._attn_s_per_decode_ctx = max(self._attn_flops_per_pair / self._attn_flop_rate,
                                          self._kv_bytes_per_token / self._kv_byte_rate)
        self._decode_fixed_s: dict[int, float] = {}  # per batch size: a decode step's time but attention

    # ---------------------------------------------------------------------------------- linear layers
    def _experts_touched(self, tokens: int) -> float:
        m = self.model
        if m.num_experts == 1:
            return 1.0
        return m.num_experts * (1.0 - (1.0 - m.experts_per_token / m.num_experts) ** tokens)

    def _linear_s(self, tokens: int, sampled: int) -> float:
        """One micro-batch through every linear layer."""
        m, b = self.model, self.model.dtype_bytes
        attn_params = m.num_layers * m.attention_params_per_layer
        device_active = attn_params if self.offload_experts else m.active_block_params
        flops = 2 * tokens * device_active + 2 * sampled * m.head_params
        touched = self._experts_touched(tokens) * m.num_layers * m.expert_params_per_layer
        device_params = attn_params + (0 if self.offload_experts else touched) + m.head_params
        seconds = max(flops / self._flop_rate, b * device_params / self._byte_rate)
        if self.offload_experts:
            host_flops = 2 * tokens * m.num_layers * m.experts_per_token * m.expert_params_per_layer
            p = self.params
            seconds += max(host_flops / (self.hw.host_flops * p.compute_efficiency),
                           b * touched / (self.hw.host_mem_bandwidth * p.memory_efficiency))
        return seconds

    def linear_seconds(self, tokens: int, sampled: int) -> float:
        """All tokens of a step through the linear layers, split into prefill micro-batches if set."""
        mb = self.microbatch
        if mb == 0 or tokens <= mb:
            return self._linear_s(tokens, sampled)
        full, rest = divmod(tokens, mb)
        per_mb_sampled = sampled / math.ceil(tokens / mb)
        seconds = full * self._linear_s(mb, per_mb_sampled)
        return seconds + (self._linear_s(rest, per_mb_sampled) if rest else 0.0)

    def allreduce_seconds(self, tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        m = self.model
        nbytes = tokens * m.hidden_size * m.dtype_bytes * 2 * (self.tp - 1) / self.tp
        per = nbytes / self.hw.interconnect_bandwidth + self.hw.interconnect_latency_s
        return 2 * m.num_layers * per

    # -------------------------------------------------------------------------------------- the step
    def step_seconds(self, chunks: list[tuple[int, int]], num_decodes: int, decode_ctx: int,
                     sampled: int) -> float:
        """chunks: (new tokens, already-cached tokens) per prefilling sequence; decode_ctx: Σ ctx_j."""
        tokens = num_decodes + sum(n for n, _ in chunks)
        pairs = decode_ctx + sum(n * c + n * (n + 1) // 2 for n, c in chunks)
        kv_tokens = decode_ctx + sum(c + n for n, c in chunks)
        attention = max(self._attn_flops_per_pair * pairs / self._attn_flop_rate,
                        self._kv_bytes_per_token * kv_tokens / self._kv_byte_rate)
        p = self.params
        return (self.linear_seconds(tokens, sampled) + attention + self.allreduce_seconds(tokens)
                + p.step_overhead_s + p.per_sequence_overhead_s * (num_decodes + len(chunks)))

    def decode_run_ns(self, num_decodes: int, decode_ctx: int, steps: int, until_ns: int | None = None) -> np.ndarray:
        """Durations of `steps` decode-only steps; every sequence's context grows by one per step. With
        `until_ns`, the run stops after the first step that ends `until_ns` or more after its start."""
        fixed = self._decode_fixed_s.get(num_decodes)
        if fixed is None:
            p = self.params
            fixed = self._decode_fixed_s[num_decodes] = (
                self.linear_seconds(num_decodes, num_decodes) + self.allreduce_seconds(num_decodes)
                + p.step_overhead_s + p.per_sequence_overhead_s * num_decodes)
        per_ctx = self._attn_s_per_decode_ctx
        durations = []
        elapsed = 0
        limit = until_ns if until_ns is not None else 1 << 62
        for k in range(steps):  # a Python loop: runs are short, and numpy's per-call cost is not
            ns = round((fixed + per_ctx * float(decode_ctx + num_decodes * k)) * 1e9)
            durations.append(ns)
            elapsed += ns
            if elapsed >= limit:
                break
        return np.array(durations, dtype=np.int64)
