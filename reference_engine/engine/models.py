"""Model architectures, with the parameter counts the roofline cost model needs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int = 1  # MoE: experts per layer
    experts_per_token: int = 1
    dtype_bytes: int = 2  # activations and KV cache
    weight_bits: float = 0.0  # bits per weight parameter when quantized (llama.cpp's Q4_K: 4.5); 0: dtype_bytes

    @property
    def bytes_per_weight(self) -> float:
        return self.weight_bits / 8 if self.weight_bits else self.dtype_bytes

    @property
    def attention_params_per_layer(self) -> int:
        q_and_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def expert_params_per_layer(self) -> int:
        """One SwiGLU MLP (gate, up and down projections)."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def block_params(self) -> int:
        """P_blk: all transformer-block weights (every expert), the bytes a step reads."""
        per_layer = self.attention_params_per_layer + self.num_experts * self.expert_params_per_layer
        return self.num_layers * per_layer

    @property
    def active_block_params(self) -> int:
        """Block weights one token is multiplied by (attention plus its routed experts)."""
        per_layer = self.attention_params_per_layer + self.experts_per_token * self.expert_params_per_layer
        return self.num_layers * per_layer

    @property
    def expert_params(self) -> int:
        return self.num_layers * self.num_experts * self.expert_params_per_layer

    @property
    def expert_layer_bytes(self) -> float:
        """Every expert of one layer: what one offloaded layer keeps in host memory."""
        return self.bytes_per_weight * self.num_experts * self.expert_params_per_layer

    @property
    def head_params(self) -> int:
        """P_head: the LM head (untied), applied only to the positions that sample a token."""
        return self.hidden_size * self.vocab_size

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.bytes_per_weight * (self.block_params + 2 * self.head_params)  # + embedding table


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256),
        ModelSpec("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256),
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, num_experts=8, experts_per_token=2),
        # llama.cpp's Q4_K: 144 bytes per block of 256 weights (4.5 bits); KV cache in fp16.
        ModelSpec("mixtral-8x7b-q4_k", 32, 4096, 32, 8, 128, 14336, 32000, num_experts=8, experts_per_token=2,
                  weight_bits=4.5),
        ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000),
        ModelSpec("qwen-2.5-1.5b", 28, 1536, 12, 2, 128, 8960, 151936),
        # Small enough to really run on a laptop CPU (the real executor's default).
        ModelSpec("tiny", 4, 256, 8, 2, 32, 704, 4096),
        # ≈ 0.2B parameters: on a GPU the real executor's steps are more than kernel-launch overhead.
        ModelSpec("small", 12, 1024, 16, 4, 64, 2816, 32000),
    )
}


def model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
