"""A model architecture from a Hugging Face `config.json` (Llama, Mistral, Qwen2, Mixtral and other decoder-only
models that use these keys), for models not in the built-in list."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reference_engine.engine.models import ModelSpec

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}


def spec_from_hf_config(config: dict[str, Any] | str | Path, name: str | None = None) -> ModelSpec:
    """The architecture a `config.json` describes; raises ValueError naming a missing or bad key."""
    where = "config.json"
    if not isinstance(config, dict):
        where = str(config)
        try:
            config = json.loads(Path(config).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{where}: {e}") from None
        if not isinstance(config, dict):
            raise ValueError(f"{where}: expected a JSON object")
    text = config.get("text_config")
    if isinstance(text, dict):  # multimodal wrappers keep the language model's keys here
        config = {**config, **text}

    def key(*names: str, default: int | None = None) -> int:
        for n in names:
            if config.get(n) is not None:
                value = config[n]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{where}: {n} must be a positive integer, got {value!r}")
                return value
        if default is None:
            raise ValueError(f"{where}: missing {' or '.join(names)}")
        return default

    layers = key("num_hidden_layers", "n_layer", "num_layers")
    hidden = key("hidden_size", "n_embd", "d_model")
    heads = key("num_attention_heads", "n_head")
    kv_heads = key("num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = key("head_dim", default=hidden // heads)
    intermediate = key("moe_intermediate_size", "intermediate_size", "ffn_dim", "n_inner")
    vocab = key("vocab_size")
    experts = key("num_local_experts", "num_experts", "n_routed_experts", default=1)
    per_token = key("num_experts_per_tok", "num_experts_per_token", "moe_topk", default=1) if experts > 1 else 1
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"{where}: torch_dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    label = name or str(config.get("_name_or_path") or config.get("model_type") or Path(where).stem)
    return ModelSpec(label, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, num_experts=experts,
                     experts_per_token=per_token, dtype_bytes=DTYPE_BYTES[dtype])
