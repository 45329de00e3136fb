"""Prefill throughput against the hardware roofline.

A prefill of N tokens reads every weight once per micro-batch and multiplies each token by the active
weights: per micro-batch of m tokens the linear layers take max(2·m·P_active / (Π·η_c), w·P_read / (β·η_m)).
Below the ridge, m* = w·Π·η_c / (2·β·η_m) tokens (≈ 250 for bf16 on an H100), a micro-batch is memory-bound
and the weights are re-read for every one of them: a 128-token micro-batch prefills at about half the
throughput that 1024 reaches. `analyze_prefill_roofline(store)` measures each engine's prefill tokens/s on
its prefill-only steps, predicts it from the model and hardware named in the resource attributes
(`infertrace.engine.model`, `infertrace.hardware`, `infertrace.hardware.count`,
`infertrace.engine.prefill_microbatch_tokens`, `infertrace.engine.cpu_moe_layers`) with and without
micro-batching, and diagnoses:

- `offloaded_experts`: MoE layers keep their experts in host memory and copying them over the host link (or
  computing them on the host CPU) takes a large share of prefill time, which the step spans measure
  (`infertrace.step.offload.*`). A small micro-batch multiplies that cost, since every micro-batch copies the
  experts again. The fix moves as many expert layers back to the GPU as the KV pool's unused blocks hold (its
  peak use, with a quarter of headroom, stays) and raises the micro-batch to where a larger one adds < 10%;
  the throughput predicted for it uses the host-link bandwidth the spans measured;
- `microbatch_memory_bound`: the configured micro-batch is below the ridge; the fix (a micro-batch at the
  next power of two above four times the ridge) would give the predicted throughput reported;
- `below_roofline`: measured throughput well under the prediction for the configuration (e.g. a slower
  kernel than the efficiencies assume);
- `at_roofline`.

The model and hardware figures are kept here (`MODELS`, `HARDWARE`, the efficiencies of `Efficiency`), so
the toolkit needs no engine to analyse traces; they mirror `reference_engine`'s specs (a test checks it).
Pass `models=`/`hardware=` for others. Tensor-parallel all-reduces are not modelled (a few % of a prefill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from infertrace.analyzers import query_text
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
    weight_bits: float = 0.0  # quantized weights; 0: dtype_bytes per weight

    @property
    def bytes_per_weight(self) -> float:
        return self.weight_bits / 8 if self.weight_bits else self.dtype_bytes

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

    @property
    def expert_layer_bytes(self) -> float:
        """Every expert of one layer."""
        return self.bytes_per_weight * self.num_experts * 3 * self.hidden_size * self.intermediate_size

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_flops: float  # dense bf16
    mem_bandwidth: float  # bytes/s
    host_flops: float = 0.0  # the host CPU, for offloaded experts
    host_mem_bandwidth: float = 0.0
    host_link_bandwidth: float = 0.0  # PCIe bytes/s


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
    ModelShape("mixtral-8x7b-q4_k", 32, 4096, 32, 8, 128, 14336, 32000, num_experts=8, experts_per_token=2,
               weight_bits=4.5),
    ModelShape("qwen-2.5-1.5b", 28, 1536, 12, 2, 128, 8960, 151936),
    ModelShape("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000),
    ModelShape("tiny", 4, 256, 8, 2, 32, 704, 4096),
)}
HARDWARE: dict[str, Accelerator] = {h.name: h for h in (
    Accelerator("H100-SXM", 989e12, 3.35e12, 3.0e12, 300e9, 55e9),
    Accelerator("H200", 989e12, 4.8e12, 3.0e12, 300e9, 55e9),
    Accelerator("A100-80GB", 312e12, 2.039e12, 2.0e12, 200e9, 25e9),
    Accelerator("L4", 121e12, 300e9, 1.5e12, 100e9, 25e9),
    Accelerator("CPU-host", 3.0e12, 300e9, 3.0e12, 300e9, 0.0),
)}


def prefill_step_seconds(model: ModelShape, hw: Accelerator, tokens: int, microbatch: int = 0,
                         tensor_parallel: int = 1, eff: Efficiency | None = None, cpu_moe_layers: int = 0,
                         link_bandwidth: float | None = None) -> float:
    """Predicted time of a prefill-only step of `tokens` new tokens (no cached prefix, one sequence), with
    `cpu_moe_layers` layers' experts in host memory, copied per micro-batch over a host link of
    `link_bandwidth` bytes/s (default: the hardware's) or computed on the host, whichever is faster."""
    e = eff or Efficiency()
    flop_rate = hw.peak_flops * e.compute * tensor_parallel
    byte_rate = hw.mem_bandwidth * e.memory * tensor_parallel
    w, k = model.bytes_per_weight, cpu_moe_layers
    link = (hw.host_link_bandwidth if link_bandwidth is None else link_bandwidth) * tensor_parallel
    per_layer_expert = model.expert_params / model.num_layers

    def linear(m: float) -> float:
        touched = model.num_experts * (1 - (1 - model.experts_per_token / model.num_experts) ** m) \
            if model.num_experts > 1 else 1.0
        resident_experts = model.expert_params * (model.num_layers - k) / model.num_layers
        active = model.attention_params + model.experts_per_token * resident_experts
        read = model.attention_params + touched * resident_experts + model.head_params
        gpu = max((2 * m * active + 2 * model.head_params) / flop_rate, w * read / byte_rate)
        if not k:
            return gpu
        host_flops = 2 * m * k * model.experts_per_token * per_layer_expert
        host_bytes = w * k * touched * per_layer_expert
        host = (max(host_flops / (hw.host_flops * e.compute), host_bytes / (hw.host_mem_bandwidth * e.memory))
                if hw.host_flops > 0 else math.inf)
        if link > 0:
            streamed = host_bytes / link + max((2 * m * active + 2 * model.head_params + host_flops) / flop_rate,
                                               (w * read + host_bytes) / byte_rate)
            return min(streamed, gpu + host)
        return gpu + host

    if microbatch and tokens > microbatch:
        full, rest = divmod(tokens, microbatch)
        lin = full * linear(microbatch) + (linear(rest) if rest else 0.0)
    else:
        lin = linear(tokens)
    pairs = tokens * (tokens + 1) / 2
    attn_flops = 4 * model.num_layers * model.num_heads * model.head_dim * pairs
    kv_bytes = 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.dtype_bytes * tokens
    attention = max(attn_flops / (hw.peak_flops * e.attention * tensor_parallel), kv_bytes / byte_rate)
    return lin + attention + e.step_overhead_s


def ridge_tokens(model: ModelShape, hw: Accelerator, eff: Efficiency | None = None) -> int:
    """Micro-batch size below which the linear layers are memory-bound."""
    e = eff or Efficiency()
    return math.ceil(model.bytes_per_weight * hw.peak_flops * e.compute / (2 * hw.mem_bandwidth * e.memory))


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
    predicted_tokens_per_s: float  # for the configured micro-batch (and offloaded layers)
    unbatched_tokens_per_s: float  # without micro-batching
    ridge_tokens: int
    diagnosis: str  # offloaded_experts | microbatch_memory_bound | below_roofline | at_roofline | unknown_spec
    recommended_microbatch_tokens: int | None
    fix_tokens_per_s: float | None  # predicted with the recommended micro-batch (and expert layers)
    evidence: str
    causes: tuple[str, ...] = ()  # every cause found: experts_offloaded, microbatch_recopies_experts, ...
    cpu_moe_layers: int = 0  # expert layers in host memory
    offload_share: float | None = None  # of prefill time copying or host-computing experts (from the spans)
    host_link_bytes_per_s: float | None = None  # measured: bytes copied / time copying
    recommended_cpu_moe_layers: int | None = None  # expert layers left in host memory by the fix


@dataclass(frozen=True)
class RooflineAnalysis:
    engines: tuple[PrefillRoofline, ...]


def _rate(spec: ModelShape, hw: Accelerator, tokens: np.ndarray, microbatch: int, tp: int,
          eff: Efficiency | None, cpu_moe_layers: int = 0, link_bandwidth: float | None = None) -> float:
    """Predicted prefill tokens/s over the measured steps' token counts (each distinct count predicted once; the
    steps' times summed in their order, as one prediction per step would)."""
    counts, step = np.unique(tokens, return_inverse=True)
    seconds = np.array([prefill_step_seconds(spec, hw, int(n), microbatch, tp, eff, cpu_moe_layers, link_bandwidth)
                        for n in counts], dtype=np.float64)
    return float(tokens.sum() / sum(seconds[step].tolist()))


def analyze_prefill_roofline(store: Store, models: dict[str, ModelShape] | None = None,
                             hardware: dict[str, Accelerator] | None = None, eff: Efficiency | None = None,
                             below_ratio: float = 0.8, offload_share_min: float = 0.25) -> RooflineAnalysis:
    models = {**MODELS, **(models or {})}
    hardware = {**HARDWARE, **(hardware or {})}
    out = []
    for row in store.sql(query_text("roofline_prefill_steps")).fetchall():
        (instance, model, hw_name, tp, mb, cpu_layers, budget, block_size, kv_peak, kv_total, tokens, durations,
         link_bytes, transfer_ns, host_ns) = row
        tp, mb, cpu_layers = int(tp or 1), int(mb or 0), int(cpu_layers or 0)
        tok = np.array(tokens, dtype=np.float64)
        dur = np.array(durations, dtype=np.float64)
        measured = float(tok.sum() / dur.sum() * 1e9)
        median_tokens = int(np.median(tok))
        spec, hw = models.get(model), hardware.get(hw_name)
        if spec is None or hw is None:
            out.append(PrefillRoofline(instance, model, hw_name, tp, mb, len(tok), median_tokens, measured, math.nan,
                                       math.nan, 0, "unknown_spec", None, None,
                                       f"no model/hardware figures for {model!r} on {hw_name!r}",
                                       cpu_moe_layers=cpu_layers))
            continue
        if cpu_layers:
            out.append(_offloaded(instance, spec, hw, tp, mb, cpu_layers, budget, block_size, kv_peak, kv_total, tok,
                                  dur, measured, link_bytes, transfer_ns, host_ns, eff, offload_share_min,
                                  below_ratio))
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
                                   unbatched, ridge, diagnosis, recommended, fix, evidence,
                                   (diagnosis,) if diagnosis != "at_roofline" else ()))
    return RooflineAnalysis(tuple(out))


def _offloaded(instance: str, spec: ModelShape, hw: Accelerator, tp: int, mb: int, cpu_layers: int,
               budget: int | None, block_size: int | None, kv_peak: int | None, kv_total: int | None, tok: np.ndarray,
               dur: np.ndarray, measured: float, link_bytes: int | None, transfer_ns: int | None,
               host_ns: int | None, eff: Efficiency | None, share_min: float, below_ratio: float) -> PrefillRoofline:
    """An engine whose MoE layers keep experts in host memory: how much prefill time that costs, per the spans,
    and what moving layers back and a larger micro-batch would give."""
    transfer_s, host_s = (transfer_ns or 0) / 1e9, (host_ns or 0) / 1e9
    share = (transfer_s + host_s) / (dur.sum() / 1e9)
    link = (link_bytes or 0) / transfer_s if transfer_s > 0 else None  # what the spans measured
    predicted = _rate(spec, hw, tok, mb, tp, eff, cpu_layers, link)
    unbatched = _rate(spec, hw, tok, 0, tp, eff, cpu_layers, link)
    # Expert layers the KV pool's unused blocks could hold, keeping its peak use and a quarter of headroom.
    back = 0
    if kv_total and block_size:
        spare_blocks = kv_total - math.ceil((kv_peak or 0) * 1.25)
        back = max(0, min(cpu_layers, int(spare_blocks * block_size * spec.kv_bytes_per_token
                                          // spec.expert_layer_bytes)))
    layers = cpu_layers - back
    # Micro-batch: the smallest power of two from 256 up to the step budget within 10% of the best of them.
    largest = max(256, int(budget or 0), int(tok.max()))
    candidates = [1 << i for i in range(8, int(math.log2(largest)) + 1)]
    rates = {c: _rate(spec, hw, tok, c, tp, eff, layers, link) for c in candidates}
    best = max(rates.values())
    choice = min(c for c, r in rates.items() if r >= 0.9 * best)
    target = choice if mb and choice > mb else mb
    recommended = target if target != mb else None
    fix = _rate(spec, hw, tok, target, tp, eff, layers, link) if recommended or back else None
    ridge = _offload_ridge(spec, hw, tp, eff, layers or cpu_layers, link)
    causes = []
    where = []
    if transfer_s > 0:
        where.append(f"{transfer_s / dur.sum() * 1e9:.0%} copying experts over the host link"
                     + (f" at {link / 1e9:.1f} GB/s" if link else ""))
    if host_s > 0:
        where.append(f"{host_s / dur.sum() * 1e9:.0%} computing them on the host CPU")
    evidence = (f"{cpu_layers} of {spec.num_layers} expert layers in host memory: "
                f"{', '.join(where) or 'no offload time recorded'}; measured {measured:,.0f} tok/s "
                f"(predicted {predicted:,.0f})")
    if share >= share_min:
        causes.append("experts_offloaded")
    if recommended is not None and fix is not None and fix >= 1.25 * _rate(spec, hw, tok, mb, tp, eff, layers, link):
        causes.append("microbatch_recopies_experts")
        evidence += (f"; every {mb}-token micro-batch copies the experts again ({(link_bytes or 0) / tok.sum():,.0f} "
                     f"bytes per prompt token)")
    if back:
        evidence += (f"; the KV pool peaked at {kv_peak} of {kv_total} blocks, room for {back} expert "
                     f"layer{'s' if back != 1 else ''} back on the GPU")
    if fix is not None:
        evidence += (f"; with {layers} layers in host memory" + (f" and micro-batch {target}" if mb else "")
                     + f" → {fix:,.0f} tok/s")
    if causes:
        diagnosis = "offloaded_experts"
    elif measured < below_ratio * predicted:
        diagnosis = "below_roofline"
    else:
        diagnosis = "at_roofline"
    return PrefillRoofline(instance, spec.name, hw.name, tp, mb, len(tok), int(np.median(tok)), measured, predicted,
                           unbatched, ridge, diagnosis, recommended, fix, evidence, tuple(causes), cpu_layers,
                           round(share, 4), link, layers if (back or recommended) else None)


def _offload_ridge(spec: ModelShape, hw: Accelerator, tp: int, eff: Efficiency | None, layers: int,
                   link: float | None) -> int:
    """Micro-batch at which the GPU's compute per micro-batch equals copying the offloaded experts once: below
    it, the copy dominates."""
    e = eff or Efficiency()
    bandwidth = (link if link else hw.host_link_bandwidth) * tp
    if bandwidth <= 0:
        return 0
    copy = spec.bytes_per_weight * layers * spec.expert_params / spec.num_layers * spec.num_experts / bandwidth
    active = spec.attention_params + spec.experts_per_token * spec.expert_params
    return math.ceil(copy * hw.peak_flops * e.compute * tp / (2 * active))
