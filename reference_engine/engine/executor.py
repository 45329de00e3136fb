"""The executor seam: runs what the scheduler batched and says how long each step took.

Two implementations sit behind it: `SimulatedExecutor` (a virtual clock advanced by the roofline cost
model) and the real executor (`reference_engine.compute.real_executor`, a small transformer that really computes).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

import numpy as np

from reference_engine.engine.cost_model import OffloadStep, StepCostModel
from reference_engine.engine.scheduler import Batch


class Executor(Protocol):
    def execute(self, batch: Batch, now_ns: int, deadline_ns: int | None) -> np.ndarray:
        """Run the batch for at least one and at most `batch.max_steps` steps (a decode-only batch repeats
        unchanged); stop after the first step that ends at or after `deadline_ns` (the next arrival).
        Returns each step's duration in nanoseconds (int64)."""
        ...


class SimulatedExecutor:
    """Step times from the cost model. Host pauses (start, duration in ns) stall the step they fall in,
    which then ends its run, so a pause is always in the last step of a span."""

    def __init__(self, cost_model: StepCostModel, pauses: Seq[tuple[int, int]] = ()) -> None:
        self.cost_model = cost_model
        self.pauses = sorted(pauses)
        self.last_pause_ns = 0  # pause inside the last step of the latest execute() call
        self.last_offload: OffloadStep | None = None  # per step of the latest execute() call
        self.last_kv_load: tuple[int, int, float] | None = None  # host tokens, remote tokens, seconds (KV tiers)

    def execute(self, batch: Batch, now_ns: int, deadline_ns: int | None) -> np.ndarray:
        ctx = batch.decode_context
        if batch.prefills:
            chunks = [(n, seq.num_computed_tokens) for seq, n in batch.prefills]
            sampled = len(batch.decodes) + sum(
                1 for seq, n in batch.prefills if seq.num_computed_tokens + n >= seq.prefill_target)
            seconds = self.cost_model.step_seconds(chunks, len(batch.decodes), ctx, sampled)
            self.last_kv_load = None
            if batch.kv_hits is not None:
                # A prefix found in a KV tier is copied back before the step computes the rest of the prompt.
                host = sum(hit.host_tokens for _, hit in batch.kv_hits)
                remote = sum(hit.remote_tokens for _, hit in batch.kv_hits)
                if host or remote:
                    load = self.cost_model.kv_load_seconds(host, remote)
                    seconds += load
                    self.last_kv_load = (host, remote, load)
            durations = np.array([round(seconds * 1e9)], dtype=np.int64)
        else:
            self.last_kv_load = None
            sampled = len(batch.decodes)
            until = deadline_ns - now_ns if deadline_ns is not None else None
            durations = self.cost_model.decode_run_ns(sampled, ctx, batch.max_steps, until)
        if self.cost_model.cpu_moe_layers:
            self.last_offload = self.cost_model.offload(batch.num_tokens, sampled)
        return self._apply_pauses(durations, now_ns)

    def _apply_pauses(self, durations: np.ndarray, now_ns: int) -> np.ndarray:
        self.last_pause_ns = 0
        while self.pauses and self.pauses[0][0] < now_ns:
            self.pauses.pop(0)  # fell while the engine was idle
        if not self.pauses:
            return durations
        start, length = self.pauses[0]
        ends = now_ns + np.cumsum(durations)
        if start >= ends[-1]:
            return durations
        self.pauses.pop(0)
        step = int(np.searchsorted(ends, start, side="right"))
        durations = durations[: step + 1].copy()
        durations[step] += length
        self.last_pause_ns = length
        return durations
