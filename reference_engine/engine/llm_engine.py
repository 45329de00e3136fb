"""The engine: schedule, execute, post-process; observers (the tracer, statistics) hear what happened."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from reference_engine.engine.block_manager import BlockManager
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.cost_model import OffloadStep
from reference_engine.engine.executor import Executor, SimulatedExecutor
from reference_engine.engine.hardware import hardware
from reference_engine.engine.kv_tiers import KvTiers
from reference_engine.engine.models import ModelSpec, model
from reference_engine.engine.scheduler import Batch, Scheduler
from reference_engine.engine.sequence import Request, Sequence, SequenceStatus


@dataclass(slots=True)
class StepReport:
    index: int  # of the first step
    start_ns: int
    end_ns: int  # of the last step
    durations: np.ndarray  # int64 ns, one per step
    batch: Batch
    num_running: int  # after scheduling
    num_waiting: int
    kv_used_blocks: int  # at the end of the run
    kv_total_blocks: int
    pause_ns: int = 0
    offload: OffloadStep | None = None  # where offloaded experts ran, per step (None: none offloaded)
    kv_load: tuple[int, int, float] | None = None  # KV copied back from tiers: host tokens, remote tokens, seconds


NO_STEPS = np.zeros(0, dtype=np.int64)


class EngineObserver(Protocol):
    def on_step(self, report: StepReport) -> None: ...

    def on_finish(self, seq: Sequence) -> None: ...


def num_kv_blocks(config: EngineConfig, spec: ModelSpec) -> int:
    """KV blocks that fit in device memory left after the weights (per instance, over TP shards)."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    hw = hardware(config.hardware)
    free = hw.mem_bytes * config.tensor_parallel * config.gpu_memory_utilization - spec.weight_bytes
    free += len(config.host_expert_layers()) * spec.expert_layer_bytes
    blocks = int(free // (spec.kv_bytes_per_token * config.block_size))
    if blocks < 1:
        raise ValueError(f"{spec.name} does not fit on {config.tensor_parallel}× {hw.name} "
                         f"({spec.weight_bytes / 1e9:.0f} GB of weights)")
    return blocks


class LLMEngine:
    def __init__(self, config: EngineConfig, executor: Executor | None = None,
                 observers: Iterable[EngineObserver] = ()) -> None:
        self.config = config
        self.spec = model(config.model)
        host_blocks, remote_blocks = config.kv_tier_blocks()
        tiers = (KvTiers(host_blocks, remote_blocks) if host_blocks or remote_blocks or config.kv_reuse_accounting
                 else None)
        self.block_manager = BlockManager(num_kv_blocks(config, self.spec), config.block_size,
                                          config.enable_prefix_caching, tiers)
        self.scheduler = Scheduler(config, self.block_manager)
        self.executor = executor or SimulatedExecutor(config.cost_model())
        self.observers = list(observers)
        self.now_ns = 0
        self.step_index = 0

    def add_request(self, request: Request) -> Sequence:
        seq = Sequence(request)
        self.scheduler.add(seq)
        return seq

    def step(self, deadline_ns: int | None = None) -> list[Sequence]:
        """One step, or one run of identical decode-only steps; returns the sequences that ended."""
        batch = self.scheduler.schedule()
        durations = self.executor.execute(batch, self.now_ns, deadline_ns) if not batch.is_empty else NO_STEPS
        return self.postprocess(batch, durations)

    def postprocess(self, batch: Batch, durations: np.ndarray) -> list[Sequence]:
        """Advance the clock and the sequences, tell the observers; returns the sequences that ended."""
        start = self.now_ns
        for seq in batch.rejected:
            seq.finish_ns = start
        if batch.is_empty:
            if not batch.rejected and self.scheduler.has_work:
                raise RuntimeError(f"scheduler made no progress: {list(self.scheduler.waiting)[:3]}")
            self._notify_finished(batch.rejected)
            return batch.rejected
        for seq, _ in batch.prefills:
            if seq.first_scheduled_ns is None:
                seq.first_scheduled_ns = start
        num_running, num_waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        self.now_ns = start + sum(durations.tolist())  # a fifth of numpy's sum() on a few elements
        finished = self.scheduler.postprocess(batch, len(durations), self.now_ns)
        if self.observers:
            executor = self.executor
            report = StepReport(self.step_index, start, self.now_ns, durations, batch, num_running, num_waiting,
                                self.block_manager.num_used_blocks, self.block_manager.num_blocks,
                                getattr(executor, "last_pause_ns", 0), getattr(executor, "last_offload", None),
                                getattr(executor, "last_kv_load", None))
            for observer in self.observers:
                observer.on_step(report)
        self.step_index += len(durations)
        ended = batch.rejected + finished
        self._notify_finished(ended)
        return ended

    def _notify_finished(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            for observer in self.observers:
                observer.on_finish(seq)

    def run(self, requests: Iterable[Request],
            on_progress: Callable[[int, int], None] | None = None) -> list[Sequence]:
        """Serve requests arriving at their `arrival_ns` until all have ended; returns them in end order.
        `on_progress(ended, now_ns)` is called after every step."""
        pending = sorted(requests, key=lambda r: r.arrival_ns)
        ended: list[Sequence] = []
        i = 0
        if pending:
            self.now_ns = max(self.now_ns, pending[0].arrival_ns)
        # The loop makes no reference cycles, and every request it holds stays alive to its end: the cyclic
        # garbage collector would only rescan them, again and again. Reference counting still frees everything.
        collecting = gc.isenabled()
        gc.disable()
        try:
            while i < len(pending) or self.scheduler.has_work:
                while i < len(pending) and pending[i].arrival_ns <= self.now_ns:
                    self.add_request(pending[i])
                    i += 1
                if not self.scheduler.has_work:
                    self.now_ns = pending[i].arrival_ns
                    continue
                ended += self.step(pending[i].arrival_ns if i < len(pending) else None)
                if on_progress is not None:
                    on_progress(len(ended), self.now_ns)
        finally:
            if collecting:
                gc.enable()
        assert all(s.status is SequenceStatus.FINISHED for s in ended)
        return ended
