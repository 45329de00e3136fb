"""What really happened inside the engines, recorded by the simulator itself and written apart from the
traces: every stalled step with its victims and culprits, every preemption, every host pause.

A step stalls its victims when it delays their next token by more than half the decode-only step they would
otherwise have had, and by at least 2 ms (`STALL_RATIO`, `STALL_MIN_EXCESS_NS`). Victims are the decoding
requests of the engine: the decodes in the step or, when the step computes prefills only (prefill-first
policy), the running requests that had to wait for it. Culprits are every prefill chunk computed in the
step (a chunk that recomputes a preempted request is flagged `recompute`). The excess is:

- prefill-only step: its whole duration (the victims got no token from it), less any host pause;
- mixed step: its duration less the decode-only duration of its decodes (cost model), less any pause;
- a host pause in a step stalls its victims by the pause.

Causes per stalled step: `prefill`, `recompute` and/or `host_pause`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reference_engine.engine.sequence import Sequence

if TYPE_CHECKING:
    from reference_engine.engine.llm_engine import LLMEngine, StepReport

STALL_RATIO = 0.5
STALL_MIN_EXCESS_NS = 2_000_000


class StallRecorder:
    """An engine observer that records stalled steps, preemptions and host pauses for the ground truth."""

    def __init__(self, instance_id: str, engine: LLMEngine) -> None:
        self.instance_id = instance_id
        self.engine = engine
        self.stalled_steps: list[dict[str, Any]] = []
        self.preemptions: list[dict[str, Any]] = []
        self.host_pauses: list[dict[str, Any]] = []

    def on_step(self, report: StepReport) -> None:
        batch = report.batch
        for seq in batch.preempted:
            self.preemptions.append({"engine": self.instance_id, "request": seq.request_id,
                                     "time_ns": report.start_ns, "step_index": report.index})
        if not batch.prefills and not report.pause_ns:
            return
        durations = report.durations
        last = len(durations) - 1
        step_start = report.start_ns + int(durations[:last].sum())
        duration = int(durations[last])
        pause = report.pause_ns
        if pause:
            self.host_pauses.append({"engine": self.instance_id, "step_index": report.index + last,
                                     "start_ns": step_start, "duration_ns": pause})
        prefilling = {id(seq) for seq, _ in batch.prefills}
        if batch.decodes:
            victims = batch.decodes
            # num_computed_tokens is after the step: each decode added one token, as its context had before.
            ctx = sum(s.num_computed_tokens for s in victims)
            decode_only = int(self.engine.executor.cost_model.decode_run_ns(  # type: ignore[attr-defined]
                len(victims), ctx, 1)[0])
            prefill_excess = duration - pause - decode_only if batch.prefills else 0
        else:
            victims = [s for s in self.engine.scheduler.running
                       if id(s) not in prefilling and not s.is_prefilling and s.num_output_tokens > 0]
            ctx = sum(s.num_computed_tokens + 1 for s in victims)
            decode_only = int(self.engine.executor.cost_model.decode_run_ns(  # type: ignore[attr-defined]
                len(victims), ctx, 1)[0]) if victims else 0
            prefill_excess = duration - pause
        if not victims:
            return
        threshold = max(STALL_RATIO * decode_only, STALL_MIN_EXCESS_NS)
        causes = []
        culprits = []
        if batch.prefills and prefill_excess >= threshold:
            for seq, chunk in batch.prefills:
                recompute = seq.preemptions > 0
                culprits.append({"request": seq.request_id, "tenant": seq.request.tenant, "chunk_tokens": chunk,
                                 "computed_tokens": seq.num_computed_tokens - chunk, "recompute": recompute})
            if any(not c["recompute"] for c in culprits):
                causes.append("prefill")
            if any(c["recompute"] for c in culprits):
                causes.append("recompute")
        if pause >= threshold:
            causes.append("host_pause")
        if not causes:
            return
        self.stalled_steps.append({
            "engine": self.instance_id, "step_index": report.index + last, "start_ns": step_start,
            "end_ns": step_start + duration, "duration_ns": duration, "decode_only_ns": decode_only,
            "pause_ns": pause, "causes": causes, "culprits": culprits,
            "victims": [s.request_id for s in victims]})

    def on_finish(self, seq: Sequence) -> None:
        pass


def itl_truth(recorders: list[StallRecorder]) -> dict[str, Any]:
    steps = sorted((s for r in recorders for s in r.stalled_steps), key=lambda s: (s["end_ns"], s["engine"]))
    return {
        "stall_ratio": STALL_RATIO,
        "stall_min_excess_ns": STALL_MIN_EXCESS_NS,
        "stalled_steps": steps,
        "preemptions": sorted((p for r in recorders for p in r.preemptions),
                              key=lambda p: (p["time_ns"], p["engine"], p["request"])),
        "host_pauses": sorted((p for r in recorders for p in r.host_pauses),
                              key=lambda p: (p["start_ns"], p["engine"])),
    }
