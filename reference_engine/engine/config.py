"""Engine configuration: one dataclass, defaults in one place (vLLM's names)."""

from __future__ import annotations

from dataclasses import dataclass, field

from reference_engine.engine import models
from reference_engine.engine.cost_model import CostParams, StepCostModel
from reference_engine.engine.hardware import hardware

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
    offload_experts: bool = False  # every MoE layer keeps its experts in host memory (llama.cpp's --cpu-moe)
    # MoE layers whose experts stay in host memory: N, the first N layers (llama.cpp's --n-cpu-moe N), or a
    # list of layer indices. Per step they are streamed to the GPU or computed on the host CPU (cost_model.py).
    cpu_moe_layers: int | tuple[int, ...] = 0
    cuda_graphs: bool = True  # False: every layer pays its kernel launches (vLLM's --enforce-eager)
    # KV tiers behind the GPU's blocks (LMCache's CPU backend, vLLM's CPU offloading; a pooled remote store such
    # as Mooncake's): a cached block evicted from the GPU moves to the host tier, one evicted from there to the
    # remote tier, least recently used first. A prompt prefix found in a tier is copied back into GPU blocks in
    # the step that schedules the request, over the host link or the network: its TTFT pays the copy.
    kv_host_tier_gb: float = 0.0  # 0: none
    kv_remote_tier_gb: float = 0.0  # 0: none
    kv_remote_bandwidth_gb_s: float = 25.0  # to the remote tier (a 200 Gb/s RDMA NIC)
    # Count the prompt tokens that were cached on this engine but evicted from every tier before a request came
    # back for them, and how much more capacity would have kept them (on whenever a tier is configured).
    kv_reuse_accounting: bool = False
    cost: CostParams = field(default_factory=CostParams)
    instance_id: str = "engine-0"
    region: str = "local"

    def __post_init__(self) -> None:
        spec = models.model(self.model)  # raises ValueError naming an unknown model
        self._check_cpu_moe_layers(spec)
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
        if min(self.kv_host_tier_gb, self.kv_remote_tier_gb) < 0 or self.kv_remote_bandwidth_gb_s <= 0:
            raise ValueError("kv_host_tier_gb and kv_remote_tier_gb must be ≥ 0 and kv_remote_bandwidth_gb_s > 0")
        if (self.kv_host_tier_gb or self.kv_remote_tier_gb or self.kv_reuse_accounting) and not (
                self.enable_prefix_caching):
            raise ValueError("KV tiers and reuse accounting keep prefix-cached blocks: turn enable_prefix_caching on")

    def _check_cpu_moe_layers(self, spec: models.ModelSpec) -> None:
        layers = self.cpu_moe_layers
        if isinstance(layers, list):  # from a fleet file
            object.__setattr__(self, "cpu_moe_layers", layers := tuple(layers))
        if isinstance(layers, bool) or not isinstance(layers, int | tuple):
            raise ValueError(f"cpu_moe_layers must be a layer count or a list of layer indices, got {layers!r}")
        if not layers and not self.offload_experts:
            return
        if spec.num_experts == 1:
            raise ValueError(f"offloading experts needs a mixture-of-experts model; {spec.name} is dense")
        if layers and self.offload_experts:
            raise ValueError("give offload_experts (every layer) or cpu_moe_layers, not both")
        if isinstance(layers, int):
            if not 0 <= layers <= spec.num_layers:
                raise ValueError(f"cpu_moe_layers must be in [0, {spec.num_layers}] for {spec.name}, got {layers}")
        else:
            bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < spec.num_layers]
            if bad or len(set(layers)) != len(layers):
                raise ValueError(f"cpu_moe_layers: {spec.name} has layers 0..{spec.num_layers - 1}, each listed "
                                 f"once; got {list(layers)}")

    def host_expert_layers(self) -> tuple[int, ...]:
        """Indices of the layers whose experts live in host memory."""
        num_layers = models.model(self.model).num_layers
        if self.offload_experts:
            return tuple(range(num_layers))
        if isinstance(self.cpu_moe_layers, int):
            return tuple(range(self.cpu_moe_layers))
        return tuple(sorted(self.cpu_moe_layers))

    def kv_tier_blocks(self) -> tuple[int, int]:
        """KV blocks the host and remote tiers hold (whole blocks of the model's KV bytes per token)."""
        block_bytes = models.model(self.model).kv_bytes_per_token * self.block_size
        return int(self.kv_host_tier_gb * 1e9 // block_bytes), int(self.kv_remote_tier_gb * 1e9 // block_bytes)

    def cost_model(self) -> StepCostModel:
        """The simulated executor's cost model for this engine."""
        return StepCostModel(models.model(self.model), hardware(self.hardware), tensor_parallel=self.tensor_parallel,
                             prefill_microbatch=self.prefill_microbatch, cpu_moe_layers=len(self.host_expert_layers()),
                             cuda_graphs=self.cuda_graphs, kv_remote_bandwidth=self.kv_remote_bandwidth_gb_s * 1e9,
                             params=self.cost)
