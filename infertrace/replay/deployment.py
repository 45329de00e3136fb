"""A model's deployment as a replay runs it: the engine config of its replicas (vLLM's names), the router in
front of them, and prefill/decode disaggregation; and the `--set key=value` variants of it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

POLICIES = ("prefill_first", "decode_first")
ROUTER_POLICIES = ("round_robin", "least_loaded", "prefix_aware")

# --set keys: the knob, and what it means (shown in errors and --help).
KNOBS: dict[str, str] = {
    "policy": "prefill_first or decode_first (decode_first turns chunked prefill on)",
    "max_num_batched_tokens": "per-step token budget (the chunk budget with chunked prefill)",
    "chunk": "shorthand: decode_first with chunked prefill and this token budget",
    "chunked_prefill": "true or false",
    "max_num_seqs": "most running requests per engine",
    "prefill_microbatch": "prefill micro-batch in tokens (0: none)",
    "tensor_parallel": "tensor-parallel degree (tp for short)",
    "replicas": "engine replicas behind the router",
    "prefix_caching": "true or false",
    "router_policy": "round_robin, least_loaded or prefix_aware",
    "pd": "prefill:decode workers, e.g. 1:2 (0:0 turns disaggregation off)",
    "decode_hardware": "hardware of the decode workers",
    "link_gb_s": "KV link bandwidth between prefill and decode workers, GB/s",
    "link_latency_ms": "KV link latency, ms",
    "hardware": "accelerator of the engines",
    "num_kv_blocks": "KV blocks per engine (0: what the memory holds)",
}
INTEGER_KNOBS = ("max_num_batched_tokens", "chunk", "max_num_seqs", "prefill_microbatch", "tensor_parallel", "replicas",
                 "num_kv_blocks")
ALIASES = {"tp": "tensor_parallel", "budget": "max_num_batched_tokens", "microbatch": "prefill_microbatch"}


@dataclass(frozen=True)
class Deployment:
    """What `reference_engine.api.replay` runs (its `Deployment` protocol)."""

    model: str
    hardware: str = "H100-SXM"
    tensor_parallel: int = 1
    replicas: int = 1
    policy: str = "prefill_first"
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 256
    chunked_prefill: bool = False
    prefix_caching: bool = True
    prefill_microbatch: int = 0
    num_kv_blocks: int = 0
    router_policy: str = "least_loaded"
    prefill_replicas: int = 0  # 0 and 0: not disaggregated
    decode_replicas: int = 0
    decode_hardware: str = ""
    link_gb_s: float = 12.5
    link_latency_ms: float = 1.0
    cost: dict[str, float] = field(default_factory=dict)  # CostParams fields (a calibration); empty: defaults

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.router_policy not in ROUTER_POLICIES:
            raise ValueError(f"router_policy must be one of {', '.join(ROUTER_POLICIES)}, got {self.router_policy!r}")
        for name in ("tensor_parallel", "replicas", "max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.prefill_microbatch < 0 or self.num_kv_blocks < 0:
            raise ValueError("prefill_microbatch and num_kv_blocks must be ≥ 0")
        if (self.prefill_replicas == 0) != (self.decode_replicas == 0):
            raise ValueError(f"pd needs both prefill and decode workers, got "
                             f"{self.prefill_replicas}:{self.decode_replicas}")
        if self.link_gb_s <= 0 or self.link_latency_ms < 0:
            raise ValueError("link_gb_s must be > 0 and link_latency_ms ≥ 0")

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0

    def label(self) -> str:
        """One line: what the engines run."""
        chunk = f"chunks of {self.max_num_batched_tokens}" if self.chunked_prefill or self.policy == "decode_first" \
            else f"budget {self.max_num_batched_tokens}, no chunks"
        where = (f"{self.prefill_replicas}P:{self.decode_replicas}D" if self.disaggregated
                 else f"{self.replicas}×")
        extra = f", micro-batch {self.prefill_microbatch}" if self.prefill_microbatch else ""
        cache = "" if self.prefix_caching else ", no prefix cache"
        return (f"{where} {self.hardware} TP{self.tensor_parallel}, {self.policy} ({chunk}), "
                f"max_num_seqs {self.max_num_seqs}{extra}{cache}")

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _bool(key: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"--set {key}={text}: expected true or false")


def _int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--set {key}={text}: expected an integer") from None


def parse_setting(text: str) -> tuple[str, str]:
    """`key=value` → (canonical key, value); errors name the setting and the known keys."""
    key, sep, value = text.partition("=")
    key = ALIASES.get(key.strip(), key.strip())
    if not sep or not value.strip():
        raise ValueError(f"--set {text!r}: expected key=value, e.g. chunk=512")
    if key not in KNOBS:
        raise ValueError(f"--set {text!r}: unknown key {key!r}; known: {', '.join(KNOBS)}")
    value = value.strip()
    try:
        if key in INTEGER_KNOBS:
            int(value)
        elif key in ("chunked_prefill", "prefix_caching"):
            _bool(key, value)
        elif key in ("link_gb_s", "link_latency_ms"):
            float(value)
        elif key == "pd":
            p, sep, q = value.partition(":")
            if not sep:
                raise ValueError
            int(p), int(q)
    except ValueError:
        raise ValueError(f"--set {text}: {KNOBS[key]}") from None
    return key, value


def apply_settings(base: Deployment, settings: list[tuple[str, str]]) -> Deployment:
    """The deployment with the settings applied in order (a variant)."""
    d = base
    for key, value in settings:
        if key == "chunk":
            d = replace(d, policy="decode_first", chunked_prefill=True, max_num_batched_tokens=_int(key, value),
                        max_num_seqs=min(d.max_num_seqs, _int(key, value)))
        elif key == "policy":
            d = replace(d, policy=value, chunked_prefill=d.chunked_prefill or value == "decode_first")
            if value == "decode_first" and d.max_num_batched_tokens < d.max_num_seqs:
                d = replace(d, max_num_seqs=d.max_num_batched_tokens)
        elif key in ("chunked_prefill", "prefix_caching"):
            d = replace(d, **{key: _bool(key, value)})
        elif key == "pd":
            p, sep, q = value.partition(":")
            if not sep:
                raise ValueError(f"--set pd={value}: expected prefill:decode workers, e.g. 1:2")
            d = replace(d, prefill_replicas=_int(key, p), decode_replicas=_int(key, q))
        elif key in ("link_gb_s", "link_latency_ms"):
            try:
                d = replace(d, **{key: float(value)})
            except ValueError:
                raise ValueError(f"--set {key}={value}: expected a number") from None
        elif key in ("router_policy", "hardware", "decode_hardware"):
            d = replace(d, **{key: value})
        else:
            d = replace(d, **{key: _int(key, value)})
    if d.policy == "decode_first" and d.max_num_batched_tokens < d.max_num_seqs:
        raise ValueError(f"decode_first needs max_num_batched_tokens ({d.max_num_batched_tokens}) ≥ max_num_seqs "
                         f"({d.max_num_seqs}): every running decode takes one token of the budget")
    return d


def variant_name(settings: list[tuple[str, str]]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings)
