"""Engine configuration: one dataclass, defaults in one place (vLLM's names)."""

from __future__ import annotations

from dataclasses import dataclass, field

from reference_engine.engine import models
from reference_engine.engine.cost_model import CostParams

POLICIES = ("prefill_first", "decode_first")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "llama-3-8b"
    hardware: str = "H100-SXM"
    tensor_parallel: int = 1
    # prefill_first: waiting prefills run in steps of their own and stall running decodes (vLLM V0,
    # nano-vllm). decode_first: every running decode gets its token, prefills fill the rest of the
    # budget in chunks (vLLM V1, Sarathi-Serve).
    policy: str = "prefill_first"
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 256
    chunked_prefill: bool = False
    enable_prefix_caching: bool = True
    block_size: int = 16
    gpu_memory_utilization: float = 0.90
    num_kv_blocks: int = 0  # 0: derived from device memory left after the weights
    prefill_microbatch: int = 0  # tokens per prefill micro-batch; 0: the whole step is one batch
    offload_experts: bool = False  # MoE expert layers run on the host CPU
    cost: CostParams = field(default_factory=CostParams)
    instance_id: str = "engine-0"
    region: str = "local"

    def __post_init__(self) -> None:
        models.model(self.model)  # raises ValueError naming an unknown model
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.policy == "decode_first" and not self.chunked_prefill:
            raise ValueError("policy decode_first schedules prefills in chunks: set chunked_prefill=True")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be ≥ 1")
        if self.policy == "decode_first" and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"decode_first needs max_num_batched_tokens ({self.max_num_batched_tokens}) ≥ "
                             f"max_num_seqs ({self.max_num_seqs}): every running decode takes one token")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
