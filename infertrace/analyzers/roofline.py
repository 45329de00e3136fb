"""Prefill throughput against the hardware roofline.

A prefill of N tokens reads every weight once per micro-batch and multiplies each token by the active
weights: per micro-batch of m tokens the linear layers take max(2·m·P_active / (Π·η_c), b·P_read / (β·η_m)).
Below the ridge, m* = b·Π·η_c / (2·β·η_m) tokens (≈ 250 for bf16 on an H100), a micro-batch is memory-bound
and the weights are re-read for every one of them: a 128-token micro-batch prefills at about half the
throughput that 1024 reaches. `analyze_prefill_roofline(store)` measures each engine's prefill tokens/s on
its prefill-only steps, predicts it from the model and hardware named in the resource attributes
(`infertrace.engine.model`, `infertrace.hardware`, `infertrace.hardware.count`,
`infertrace.engine.prefill_microbatch_tokens`) with and without micro-batching, and diagnoses:

- `microbatch_memory_bound`: the configured micro-batch is below the ridge; the fix (a micro-batch at the
  next power of two above the ridge) would give the predicted throughput reported;
- `below_roofline`: measured throughput well under the prediction for the configuration (e.g. layers
  offloaded to the host, or a slower kernel);
- `at_roofline`.

The model and hardware figures are kept here (`MODELS`, `HARDWARE`, the efficiencies of `Efficiency`), so
the toolkit needs no engine to analyse traces; they mirror `reference_engine`'s specs (a test checks it).
Pass `models=`/`hardware=` for others. Tensor-parallel all-reduces are not modelled (a few % at most).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from infertrace.analyzers import materialize_once
from infertrace.store.store import Store


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int = 1
    experts_per_token: int = 1
    dtype_bytes: int = 2

    @property
    def attention_params(self) -> int:
        return self.num_layers * 2 * self.hidden_size * self.head_dim * (self.num_heads + self.num_kv_heads)

    @property
    def expert_params(self) -> int:
        """One expert's SwiGLU MLP over all layers."""
        return self.num_layers * 3 * self.hidden_size * self.intermediate_size

    @property
    def head_params(self) -> int:
        return self.hidden_size * self.vocab_size


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_flops: float  # dense bf16
    mem_bandwidth: float  # bytes/s


@dataclass(frozen=True)
class Efficiency:
    compute: float = 0.70
    memory: float = 0.85
    attention: float = 0.45
    step_overhead_s: float = 0.001


MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    ModelShape("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    ModelShape("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, num_experts=8, experts_per_token=2),
    ModelShape("qwen-2.5-1.5b", 28, 1536, 12, 2, 128, 8960, 151936),
    ModelShape("tiny", 4, 256, 8, 2, 32, 704, 4096),
)}
HARDWARE: dict[str, Accelerator] = {h.name: h for h in (
    Accelerator("H100-SXM", 989e12, 3.35e12),
    Accelerator("H200", 989e12, 4.8e12),
    Accelerator("A100-80GB", 312e12, 2.039e12),
    Accelerator("L4", 121e12, 300e9),
    Accelerator("CPU-host", 3.0e12, 300e9),
)}


def prefill_step_seconds(model: ModelShape, hw: Accelerator, tokens: int, microbatch: int = 0,
                         tensor_parallel: int = 1, eff: Efficiency | None = None) -> float:
    """Predicted time of a prefill-only step of `tokens` new tokens (no cached prefix, one sequence)."""
    e = eff or Efficiency()
    flop_rate = hw.peak_flops * e.compute * tensor_parallel
    byte_rate = hw.mem_bandwidth * e.memory * tensor_parallel
    b = model.dtype_bytes

    def linear(m: float) -> float:
        active = model.attention_params + model.experts_per_token * model.expert_params
        touched = model.num_experts * (1 - (1 - model.experts_per_token / model.num_experts) ** m) \
            if model.num_experts > 1 else 1.0
        read = model.attention_params + touched * model.expert_params + model.head_params
        return max((2 * m * active + 2 * model.head_params) / flop_rate, b * read / byte_rate)

    if microbatch and tokens > microbatch:
        full, rest = divmod(tokens, microbatch)
        lin = full * linear(microbatch) + (linear(rest) if rest else 0.0)
    else:
        lin = linear(tokens)
    pairs = tokens * (tokens + 1) / 2
    attn_flops = 4 * model.num_layers * model.num_heads * model.head_dim * pairs
    kv_bytes = 2 * model.num_layers * model.num_kv_heads * model.head_dim * b * tokens
    attention = max(attn_flops / (hw.peak_flops * e.attention * tensor_parallel), kv_bytes / byte_rate)
    return lin + attention + e.step_overhead_s


def ridge_tokens(model: ModelShape, hw: Accelerator, eff: Efficiency | None = None) -> int:
    """Micro-batch size below which the linear layers are memory-bound."""
    e = eff or Efficiency()
    return math.ceil(model.dtype_bytes * hw.peak_flops * e.compute / (2 * hw.mem_bandwidth * e.memory))


@dataclass(frozen=True)
class PrefillRoofline:
    instance: str
    model: str
    hardware: str
    tensor_parallel: int
    microbatch_tokens: int  # 0: none
    steps: int  # prefill-only steps measured
    median_step_tokens: int
    measured_tokens_per_s: float
    predicted_tokens_per_s: float  # for the configured micro-batch
    unbatched_tokens_per_s: float  # without micro-batching
    ridge_tokens: int
    diagnosis: str  # microbatch_memory_bound | below_roofline | at_roofline | unknown_spec
    recommended_microbatch_tokens: int | None
    fix_tokens_per_s: float | None  # predicted with the recommended micro-batch
    evidence: str


@dataclass(frozen=True)
class RooflineAnalysis:
    engines: tuple[PrefillRoofline, ...]


def _rate(spec: ModelShape, hw: Accelerator, tokens: np.ndarray, microbatch: int, tp: int,
          eff: Efficiency | None) -> float:
    """Predicted prefill tokens/s over the measured steps' token counts."""
    t = sum(prefill_step_seconds(spec, hw, int(n), microbatch, tp, eff) for n in tokens)
    return float(tokens.sum() / t)


def analyze_prefill_roofline(store: Store, models: dict[str, ModelShape] | None = None,
                             hardware: dict[str, Accelerator] | None = None, eff: Efficiency | None = None,
                             below_ratio: float = 0.8) -> RooflineAnalysis:
    materialize_once(store, ("steps",))
    models = {**MODELS, **(models or {})}
    hardware = {**HARDWARE, **(hardware or {})}
    rows = store.sql(
        'SELECT s.instance, any_value(s.model) AS model, any_value(s.hardware) AS hardware, '
        'any_value(r.tp) AS tp, any_value(r.mb) AS mb, list(s.prefill_tokens) AS tokens, '
        'list(s.duration_ns) AS durations '
        'FROM steps s JOIN (SELECT "res.service.instance.id" AS instance, '
        'any_value("res.infertrace.hardware.count") AS tp, '
        'any_value("res.infertrace.engine.prefill_microbatch_tokens") AS mb FROM spans WHERE name = $name '
        'GROUP BY 1) r ON r.instance = s.instance '
        'WHERE s.num_decodes = 0 AND s.num_prefills > 0 AND s.pause_ns = 0 GROUP BY s.instance ORDER BY 1',
        {"name": "engine_step"}).fetchall()
    out = []
    for instance, model, hw_name, tp, mb, tokens, durations in rows:
        tp, mb = int(tp or 1), int(mb or 0)
        tok = np.array(tokens, dtype=np.float64)
        dur = np.array(durations, dtype=np.float64)
        measured = float(tok.sum() / dur.sum() * 1e9)
        median_tokens = int(np.median(tok))
        spec, hw = models.get(model), hardware.get(hw_name)
        if spec is None or hw is None:
            out.append(PrefillRoofline(instance, model, hw_name, tp, mb, len(tok), median_tokens, measured, math.nan,
                                       math.nan, 0, "unknown_spec", None, None,
                                       f"no model/hardware figures for {model!r} on {hw_name!r}"))
            continue
        predicted, unbatched = _rate(spec, hw, tok, mb, tp, eff), _rate(spec, hw, tok, 0, tp, eff)
        ridge = ridge_tokens(spec, hw, eff)
        recommended = fix = None
        if mb and mb < ridge:
            recommended = 1 << math.ceil(math.log2(max(ridge, 2) * 4))
            fix = _rate(spec, hw, tok, recommended, tp, eff)
            diagnosis = "microbatch_memory_bound"
            evidence = (f"micro-batch {mb} tokens < ridge {ridge}: weights re-read per micro-batch; measured "
                        f"{measured:,.0f} tok/s (predicted {predicted:,.0f}); micro-batch {recommended} → "
                        f"{fix:,.0f} tok/s")
        elif measured < below_ratio * predicted:
            diagnosis = "below_roofline"
            evidence = (f"measured {measured:,.0f} tok/s is {measured / predicted:.0%} of the roofline prediction "
                        f"{predicted:,.0f}: offloaded layers or another bottleneck")
        else:
            diagnosis = "at_roofline"
            evidence = f"measured {measured:,.0f} tok/s, predicted {predicted:,.0f}"
        out.append(PrefillRoofline(instance, model, hw_name, tp, mb, len(tok), median_tokens, measured, predicted,
                                   unbatched, ridge, diagnosis, recommended, fix, evidence))
    return RooflineAnalysis(tuple(out))
