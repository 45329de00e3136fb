"""Roofline cost of one engine step (DESIGN.md, "Step cost model"; docs/cost_model.md works examples).

Per step with prefill chunks (n_i new tokens over c_i already cached) and decodes with context ctx_j, N total
tokens and S sampled positions:

    F_lin  = 2·N·P_blk + 2·S·P_head                B_w  = w·(P_blk + P_head)   (read once per micro-batch)
    F_attn = 4·L·n_q·d·[Σ(n_i·c_i + n_i(n_i+1)/2) + Σ ctx_j]
    B_kv   = 2·L·n_kv·d·b·[Σ(c_i + n_i) + Σ ctx_j]
    t      = max(F_lin/(Π·η_c), B_w/(β·η_m)) + max(F_attn/(Π·η_a), B_kv/(β·η_kv)) + t_overhead
             (+ offloaded experts) (+ all-reduces) (+ kernel launches without CUDA graphs)

(w: bytes per weight, b per activation or KV element; η_kv = η_m unless calibrated apart; an optional
per-sequence overhead adds t_seq per sequence in the step.)

A MoE multiplies each token by its routed experts only, and reads the experts that some token of the
micro-batch was routed to. The experts of K layers may live in host memory (llama.cpp's `--n-cpu-moe K`);
per micro-batch the step either streams them to the GPU over the host link (w·touched·P_e per layer, then the
GPU computes them) or computes them on the host CPU, whichever is faster for that micro-batch's size: small
batches (decode) run on the host, large prefill micro-batches stream.

Tensor parallelism divides FLOPs and bytes by the degree p and adds two all-reduces of the hidden state per
layer and micro-batch, each max(t_floor, α + 2(p−1)·α_hop + 2(p−1)/p · n / (B·η_net)) (NCCL's ring model).
Without CUDA graphs every layer of every micro-batch adds a kernel-launch cost; an engine that replays graphs for
decode-only steps only (vLLM: a step with a prefill runs eagerly) pays it on the steps with a prefill
(`eager_prefill`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from reference_engine.engine.hardware import HardwareSpec
from reference_engine.engine.models import ModelSpec


@dataclass(frozen=True)
class CostParams:
    """Efficiencies and overheads; the defaults reproduce the worked examples in DESIGN.md and docs/cost_model.md."""

    compute_efficiency: float = 0.70  # η_c, dense GEMMs (Vidur's profiles: 0.70–0.75)
    memory_efficiency: float = 0.85  # η_m, weight reads (0.75–0.85)
    attention_efficiency: float = 0.45  # η_a, attention FLOPs (0.4–0.6)
    step_overhead_s: float = 0.001  # scheduling, sampling, kernel launches per step
    # KV-cache reads by the attention kernel; None: as efficient as weight reads (η_m). Paged gathers of
    # many short sequences can fall well below a GEMM's streaming bandwidth.
    kv_memory_efficiency: float | None = None
    per_sequence_overhead_s: float = 0.0  # per sequence in a step: input preparation, sampling, bookkeeping
    # All-reduce latency α and per-ring-step latency α_hop; None: the hardware spec's (NCCL's model).
    allreduce_latency_s: float | None = None
    allreduce_hop_latency_s: float | None = None
    # No collective is faster than this: nccl-tests measure 10.1 µs for a 32-byte all-reduce on 2 A100s
    # (NVIDIA/nccl#583), vLLM's custom all-reduce 9–10 µs on H100 at TP 2–8 (sgl-project/sglang#2904).
    allreduce_floor_s: float = 10e-6
    # NCCL reaches ≈ 370 of NVLink's 450 GB/s line rate (NVIDIA/nccl-tests#212).
    interconnect_efficiency: float = 0.82
    # Per layer and forward pass when CUDA graphs are off: vLLM measured 1.2 s eager vs 1.05 s with graphs for
    # 100 tokens of Llama-2-7B at batch 1 (vllm-project/vllm#1440): 1.5 ms a step over 32 layers.
    layer_launch_s: float = 47e-6

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "memory_efficiency", "attention_efficiency", "interconnect_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.kv_memory_efficiency is not None and not 0 < self.kv_memory_efficiency <= 1:
            raise ValueError(f"kv_memory_efficiency must be in (0, 1], got {self.kv_memory_efficiency}")
        for name in ("step_overhead_s", "per_sequence_overhead_s", "allreduce_latency_s", "allreduce_hop_latency_s",
                     "allreduce_floor_s", "layer_launch_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be ≥ 0 seconds, got {value}")


@dataclass(frozen=True, slots=True)
class OffloadStep:
    """Where one step's offloaded experts ran, and what it cost (per step)."""

    host_link_bytes: int  # expert weights copied host → device
    transfer_s: float  # time those copies took
    host_compute_s: float  # time the host CPU spent computing experts
    streamed_microbatches: int  # micro-batches whose offloaded experts the GPU computed after the copy
    host_microbatches: int  # micro-batches whose offloaded experts the host CPU computed


class StepCostModel:
    def __init__(self, model: ModelSpec, hw: HardwareSpec, *, tensor_parallel: int = 1,
                 prefill_microbatch: int = 0, offload_experts: bool = False, cpu_moe_layers: int = 0,
                 cuda_graphs: bool = True, kv_remote_bandwidth: float = 25e9, params: CostParams | None = None,
                 eager_prefill: bool = False) -> None:
        """`cpu_moe_layers`: layers whose experts live in host memory; `offload_experts`: all of them.
        `kv_remote_bandwidth`: bytes/s to a remote KV tier (the host tier uses the host link). `eager_prefill`:
        CUDA graphs for decode-only steps only, a step with a prefill pays the kernel launches."""
        if tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be ≥ 1, got {tensor_parallel}")
        if prefill_microbatch < 0:
            raise ValueError(f"prefill_microbatch must be ≥ 0 (0: none), got {prefill_microbatch}")
        if offload_experts:
            cpu_moe_layers = model.num_layers
        if cpu_moe_layers and model.num_experts == 1:
            raise ValueError(f"offloading experts needs a mixture-of-experts model; {model.name} is dense")
        if not 0 <= cpu_moe_layers <= model.num_layers:
            raise ValueError(f"cpu_moe_layers must be in [0, {model.num_layers}], got {cpu_moe_layers}")
        if cpu_moe_layers and hw.host_link_bandwidth <= 0 and hw.host_flops <= 0:
            raise ValueError(f"{hw.name} has neither a host link nor host FLOP/s to run offloaded experts")
        self.model, self.hw, self.tp = model, hw, tensor_parallel
        self.microbatch = prefill_microbatch
        self.cpu_moe_layers = cpu_moe_layers
        self.cuda_graphs = cuda_graphs
        self.eager_prefill = eager_prefill
        self.kv_remote_bandwidth = kv_remote_bandwidth
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
        # Per forward pass (micro-batch): collectives and kernel launches that do not depend on the tokens.
        self._launch_s = 0.0 if cuda_graphs and not eager_prefill else m.num_layers * p.layer_launch_s
        if tensor_parallel > 1:
            alpha = hw.interconnect_latency_s if p.allreduce_latency_s is None else p.allreduce_latency_s
            hop = hw.interconnect_hop_latency_s if p.allreduce_hop_latency_s is None else p.allreduce_hop_latency_s
            self._allreduce_latency_s = alpha + 2 * (tensor_parallel - 1) * hop
            # Ring all-reduce: each rank sends and receives 2(p−1)/p of the buffer.
            self._allreduce_s_per_token = (m.hidden_size * m.dtype_bytes * 2 * (tensor_parallel - 1) / tensor_parallel
                                           / (hw.interconnect_bandwidth * p.interconnect_efficiency))
        self._decode_fixed_s: dict[int, float] = {}  # per batch size: a decode step's time but attention

    @property
    def offload_experts(self) -> bool:
        return self.cpu_moe_layers == self.model.num_layers

    def with_params(self, params: CostParams) -> StepCostModel:
        """The same engine with other efficiencies and overheads."""
        return StepCostModel(self.model, self.hw, tensor_parallel=self.tp, prefill_microbatch=self.microbatch,
                             cpu_moe_layers=self.cpu_moe_layers, cuda_graphs=self.cuda_graphs,
                             kv_remote_bandwidth=self.kv_remote_bandwidth, params=params,
                             eager_prefill=self.eager_prefill)

    # ---------------------------------------------------------------------------------- linear layers
    def _experts_touched(self, tokens: float) -> float:
        m = self.model
        if m.num_experts == 1:
            return 1.0
        return m.num_experts * (1.0 - (1.0 - m.experts_per_token / m.num_experts) ** tokens)

    def _linear_s(self, tokens: float, sampled: float) -> float:
        """One micro-batch through every linear layer."""
        if self.cpu_moe_layers:
            return self._offloaded_linear(tokens, sampled)[0]
        m, w = self.model, self.model.bytes_per_weight
        flops = 2 * tokens * m.active_block_params + 2 * sampled * m.head_params
        touched = self._experts_touched(tokens) * m.num_layers * m.expert_params_per_layer
        device_params = m.num_layers * m.attention_params_per_layer + touched + m.head_params
        return max(flops / self._flop_rate, w * device_params / self._byte_rate)

    def _offloaded_linear(self, tokens: float, sampled: float) -> tuple[float, OffloadStep]:
        """One micro-batch when K layers keep their experts in host memory: the GPU runs everything else, and
        the K layers' experts are either streamed to it or computed on the host, whichever is faster."""
        m, w, p, hw = self.model, self.model.bytes_per_weight, self.params, self.hw
        k = self.cpu_moe_layers
        expert = m.expert_params_per_layer
        touched = self._experts_touched(tokens)
        resident_flops = (2 * tokens * (m.num_layers * m.attention_params_per_layer
                                        + (m.num_layers - k) * m.experts_per_token * expert)
                          + 2 * sampled * m.head_params)
        resident_params = (m.num_layers * m.attention_params_per_layer + (m.num_layers - k) * touched * expert
                           + m.head_params)
        gpu = max(resident_flops / self._flop_rate, w * resident_params / self._byte_rate)
        host_flops = 2 * tokens * k * m.experts_per_token * expert
        host = (max(host_flops / (hw.host_flops * p.compute_efficiency),
                    w * k * touched * expert / (hw.host_mem_bandwidth * p.memory_efficiency))
                if hw.host_flops > 0 else math.inf)
        if hw.host_link_bandwidth > 0:
            link_bytes = w * k * touched * expert
            transfer = link_bytes / (hw.host_link_bandwidth * self.tp)  # each rank copies its own shard
            streamed_gpu = max((resident_flops + host_flops) / self._flop_rate,
                               w * (resident_params + k * touched * expert) / self._byte_rate)
            if transfer + streamed_gpu < gpu + host:
                return transfer + streamed_gpu, OffloadStep(round(link_bytes), transfer, 0.0, 1, 0)
        return gpu + host, OffloadStep(0, 0.0, host, 0, 1)

    def _microbatches(self, tokens: int, sampled: int) -> list[tuple[int, int, float]]:
        """(count, tokens, sampled) of the micro-batches a step's tokens are split into."""
        mb = self.microbatch
        if mb == 0 or tokens <= mb:
            return [(1, tokens, sampled)]
        full, rest = divmod(tokens, mb)
        per_mb_sampled = sampled / math.ceil(tokens / mb)
        return [(full, mb, per_mb_sampled)] + ([(1, rest, per_mb_sampled)] if rest else [])

    def linear_seconds(self, tokens: int, sampled: int) -> float:
        """All tokens of a step through the linear layers, split into prefill micro-batches if set."""
        if self.microbatch == 0 or tokens <= self.microbatch:
            return self._linear_s(tokens, sampled)
        return sum(count * self._linear_s(n, s) for count, n, s in self._microbatches(tokens, sampled))

    def offload(self, tokens: int, sampled: int) -> OffloadStep | None:
        """Where a step's offloaded experts ran and what it cost; None when no expert is offloaded."""
        if not self.cpu_moe_layers:
            return None
        link_bytes, transfer, host, streamed, on_host = 0, 0.0, 0.0, 0, 0
        for count, n, s in self._microbatches(tokens, sampled):
            step = self._offloaded_linear(n, s)[1]
            link_bytes += count * step.host_link_bytes
            transfer += count * step.transfer_s
            host += count * step.host_compute_s
            streamed += count * step.streamed_microbatches
            on_host += count * step.host_microbatches
        return OffloadStep(link_bytes, transfer, host, streamed, on_host)

    # --------------------------------------------------------------------- communication and launches
    def allreduce_seconds(self, tokens: int) -> float:
        """Two all-reduces of the hidden state per layer and micro-batch (tensor parallelism)."""
        if self.tp == 1:
            return 0.0
        floor, latency, per_token = (self.params.allreduce_floor_s, self._allreduce_latency_s,
                                     self._allreduce_s_per_token)
        per_layer = sum(count * max(floor, latency + n * per_token) for count, n, _ in self._microbatches(tokens, 0))
        return 2 * self.model.num_layers * per_layer

    def launch_seconds(self, tokens: int) -> float:
        """Kernel launches not hidden by CUDA graphs: per layer of every micro-batch (of a step that runs eagerly:
        every step without graphs, a step with a prefill under `eager_prefill`)."""
        return self._launch_s * sum(count for count, _, _ in self._microbatches(tokens, 0))

    def kv_load_seconds(self, host_tokens: int, remote_tokens: int) -> float:
        """Copying prompt KV found in the host tier (over the host link) and the remote tier (over the network)
        back into GPU blocks; each tensor-parallel rank copies its own shard."""
        kv = self._kv_bytes_per_token / self.tp
        seconds = 0.0
        if host_tokens:
            # A CPU-only host has no link: its "host tier" is the same DRAM.
            seconds += host_tokens * kv / (self.hw.host_link_bandwidth or self.hw.host_mem_bandwidth)
        if remote_tokens:
            seconds += remote_tokens * kv / self.kv_remote_bandwidth
        return seconds

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
        seconds = (self.linear_seconds(tokens, sampled) + attention + self.allreduce_seconds(tokens)
                   + p.step_overhead_s + p.per_sequence_overhead_s * (num_decodes + len(chunks)))
        if not self.cuda_graphs or (self.eager_prefill and chunks):
            seconds += self.launch_seconds(tokens)
        return seconds

    def decode_run_ns(self, num_decodes: int, decode_ctx: int, steps: int, until_ns: int | None = None) -> np.ndarray:
        """Durations of `steps` decode-only steps; every sequence's context grows by one per step. With
        `until_ns`, the run stops after the first step that ends `until_ns` or more after its start."""
        fixed = self._decode_fixed_s.get(num_decodes)
        if fixed is None:
            p = self.params
            fixed = self._decode_fixed_s[num_decodes] = (
                self.linear_seconds(num_decodes, num_decodes) + self.allreduce_seconds(num_decodes)
                + p.step_overhead_s + p.per_sequence_overhead_s * num_decodes
                + (0.0 if self.cuda_graphs else self.launch_seconds(num_decodes)))
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
