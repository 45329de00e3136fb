"""The real executor: the engine's batches run through a small transformer on a paged KV cache that follows the
engine's block tables, and every step's duration is measured on the wall clock.

A step's measured time starts where the previous step ended, so the host work between two steps (the engine's
post-processing, its observers such as the tracer, the next scheduling decision) counts toward the next step,
as it counts toward a real engine's gap between two tokens. The engine's clock then advances by wall-clock
time while it is busy and jumps over idle gaps to the next arrival. Call `restart_clock()` after pausing
between `engine.step()` calls on purpose.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from reference_engine.compute.kv_cache import PagedKVCache
from reference_engine.compute.ops import limit_cpu_threads
from reference_engine.compute.transformer import StepInput, Transformer, sample
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.models import ModelSpec, model
from reference_engine.engine.scheduler import Batch
from reference_engine.engine.sequence import Sequence


@dataclass(frozen=True, slots=True)
class MeasuredStep:
    """One measured step, in the terms of the simulated cost model (`StepCostModel.step_seconds`)."""

    chunks: tuple[tuple[int, int], ...]  # (new tokens, already-cached tokens) per prefill chunk
    num_decodes: int
    decode_ctx: int  # Σ context tokens of the decodes, each one's own token included
    sampled: int  # positions that sampled a token
    duration_ns: int

    @property
    def is_prefill(self) -> bool:
        return bool(self.chunks)


class RealExecutor:
    def __init__(self, spec: ModelSpec, num_blocks: int, block_size: int, *, backend: str = "numpy",
                 dtype: str = "float32", device: str = "cpu", seed: int = 0, temperature: float = 0.0,
                 model: Transformer | None = None, record_steps: bool = False, keep_logits: bool = False,
                 threads: int = 0) -> None:
        """`model`: share one already-built transformer (its spec, backend and dtype win). `threads`: cap the
        process's CPU threads for BLAS and torch (0: leave them as they are). `record_steps`: keep a
        `MeasuredStep` per step in `measured` (for calibration). `keep_logits`: keep every sampled position's
        logits per request id in `logits` (for tests)."""
        if threads:
            limit_cpu_threads(threads)
        self.model = model or Transformer(spec, seed, backend, dtype, device)
        s = self.model.spec
        self.kv = PagedKVCache(self.model.ops, s.num_layers, num_blocks, block_size, s.num_kv_heads, s.head_dim)
        self.temperature = temperature
        self.rng = np.random.default_rng(seed)
        self.outputs: dict[str, list[int]] = {}  # generated tokens per request id
        self._prompts: dict[str, tuple[object, np.ndarray]] = {}  # request id -> (prompt, its token ids)
        self.record_steps, self.keep_logits = record_steps, keep_logits
        self.measured: list[MeasuredStep] = []
        self.logits: dict[str, list[np.ndarray]] = {}
        self._last_end_ns: int | None = None

    def restart_clock(self) -> None:
        """Start the next step's measurement when it is called, not where the previous step ended."""
        self._last_end_ns = None

    # ------------------------------------------------------------------------------------- the seam
    def execute(self, batch: Batch, now_ns: int, deadline_ns: int | None) -> np.ndarray:
        steps = 1 if batch.prefills else batch.max_steps
        start = self._last_end_ns if self._last_end_ns is not None else time.perf_counter_ns()
        durations: list[int] = []
        elapsed = 0
        for i in range(steps):
            features = self._run_step(batch, i)
            self.model.ops.synchronize()
            end = time.perf_counter_ns()
            durations.append(end - start)
            elapsed += end - start
            start = end
            if self.record_steps:
                self.measured.append(MeasuredStep(*features, durations[-1]))
            if deadline_ns is not None and now_ns + elapsed >= deadline_ns:
                break
        self._last_end_ns = start
        return np.array(durations, dtype=np.int64)

    # ------------------------------------------------------------------------------------ one step
    def _token_ids(self, seq: Sequence) -> np.ndarray:
        rid, prompt = seq.request_id, seq.request.prompt
        cached = self._prompts.get(rid)
        if cached is None or cached[0] is not prompt:
            cached = (prompt, prompt.token_ids(self.model.spec.vocab_size))
            self._prompts[rid] = cached
        generated = self.outputs.get(rid, [])
        return np.concatenate([cached[1], np.asarray(generated, dtype=np.int64)]) if generated else cached[1]

    def _run_step(self, batch: Batch, i: int) -> tuple[tuple[tuple[int, int], ...], int, int, int]:
        """Step `i` of the batch's run (decode-only runs advance every sequence by one token per step)."""
        kv = self.kv
        token_ids, positions, slots, chunks = [], [], [], []
        sampling: list[Sequence] = []
        sample_rows: list[int] = []
        row = 0
        for seq, n in batch.prefills:
            if seq.num_output_tokens == 0:  # a fresh request (its id may have run before)
                self.outputs[seq.request_id] = []
                self.logits.pop(seq.request_id, None)
            cached = seq.num_computed_tokens
            ids = self._token_ids(seq)
            token_ids.append(ids[cached:cached + n])
            positions.append(np.arange(cached, cached + n))
            context = kv.slots(seq.block_table, 0, cached + n)
            slots.append(context[cached:])
            chunks.append((cached, context))
            row += n
            if cached + n >= seq.prefill_target:
                sampling.append(seq)
                sample_rows.append(row - 1)
        decode_lengths = np.zeros(len(batch.decodes), dtype=np.int64)
        decode_rows = []
        for b, seq in enumerate(batch.decodes):
            position = seq.num_computed_tokens + i
            generated = self.outputs.get(seq.request_id, [])
            if not generated or position != seq.num_prompt_tokens + len(generated) - 1:
                raise RuntimeError(f"{seq}: decode at position {position}, but {len(generated)} tokens were "
                                   f"generated after {seq.num_prompt_tokens} prompt tokens")
            token_ids.append(np.array(generated[-1:], dtype=np.int64))
            positions.append(np.array([position]))
            decode_rows.append(kv.slots(seq.block_table, 0, position + 1))
            decode_lengths[b] = position + 1
            sampling.append(seq)
            sample_rows.append(row + b)
        decode_slots = np.zeros((len(decode_rows), int(decode_lengths.max(initial=0))), dtype=np.int64)
        for b, context in enumerate(decode_rows):
            decode_slots[b, :len(context)] = context
            slots.append(context[-1:])
        step = StepInput(np.concatenate(token_ids), np.concatenate(positions), np.concatenate(slots), chunks,
                         decode_slots, decode_lengths, np.asarray(sample_rows, dtype=np.int64))
        logits = self.model.forward(step, kv)
        if self.temperature <= 0 and not self.keep_logits:
            tokens = self.model.ops.argmax(logits)
        else:
            host = self.model.ops.numpy(logits)
            tokens = sample(host, self.temperature, self.rng)
            if self.keep_logits:
                for row, seq in zip(host, sampling, strict=True):
                    self.logits.setdefault(seq.request_id, []).append(row)
        for seq, token in zip(sampling, tokens.tolist(), strict=True):
            out = self.outputs.setdefault(seq.request_id, [])
            out.append(int(token))
            if len(out) >= seq.request.output_tokens:
                self._prompts.pop(seq.request_id, None)
        chunk_shape = tuple((len(c) - cached, cached) for cached, c in chunks)
        return chunk_shape, len(batch.decodes), int(decode_lengths.sum()), len(sampling)


def real_executor_for(config: EngineConfig, *, backend: str = "numpy", device: str = "cpu", dtype: str = "float32",
                      seed: int = 0, temperature: float = 0.0, threads: int = 0,
                      record_steps: bool = False) -> RealExecutor:
    """The real executor for an engine configuration: its model, and a KV pool of the engine's blocks."""
    if not config.num_kv_blocks:
        raise ValueError("the real executor allocates its KV pool up front: set num_kv_blocks")
    if config.tensor_parallel != 1 or config.prefill_microbatch or config.host_expert_layers():
        raise ValueError("the real executor runs one device, without prefill micro-batches or offloaded experts")
    return RealExecutor(model(config.model), config.num_kv_blocks, config.block_size, backend=backend,
                        dtype=dtype, device=device, seed=seed, temperature=temperature, threads=threads,
                        record_steps=record_steps)
