"""What a simulation did, for the one-paragraph summary: requests, tokens, TTFT and ITL percentiles,
prefix-cache hit rate. An engine observer, like the tracer, or a reader of the tracer's facts."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass

import numpy as np

from reference_engine.engine.llm_engine import StepReport
from reference_engine.engine.sequence import Sequence
from reference_engine.telemetry.tracer import RequestFacts, StepFacts


@dataclass(frozen=True)
class Summary:
    requests: int
    rejected: int
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    preemptions: int
    steps: int
    simulated_s: float

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def paragraph(self) -> str:
        return (f"{self.requests} requests ({self.rejected} rejected) over {self.simulated_s:.1f} simulated s "
                f"in {self.steps} engine steps: {self.prompt_tokens} prompt tokens, of which "
                f"{self.prefix_hit_rate:.1%} came from the prefix cache, and {self.output_tokens} generated "
                f"tokens. TTFT p50 {self.ttft_p50_s * 1e3:.1f} ms, p99 {self.ttft_p99_s * 1e3:.1f} ms; "
                f"ITL p50 {self.itl_p50_s * 1e3:.1f} ms, p99 {self.itl_p99_s * 1e3:.1f} ms; "
                f"{self.preemptions} preemptions.")


def weighted_percentile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """`np.percentile(np.repeat(values, counts), q)` (its default, linear method) to the last bit, without
    building the repeated array: the two order statistics around the quantile's position, then numpy's own
    interpolation arithmetic."""
    return weighted_percentiles(values, counts)(q)


def weighted_percentiles(values: np.ndarray, counts: np.ndarray) -> Callable[[float], float]:
    """`weighted_percentile` for any q, the values sorted once (a distribution's many quantiles cost one sort)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    ends = np.cumsum(counts[order])  # ends[i]: rank after the last copy of the i-th smallest value
    n = int(ends[-1])

    def at(q: float) -> float:
        quantile = q / 100
        position = (n - 1) * quantile  # numpy's virtual index, same operations
        if position >= n - 1:
            return float(ordered[-1])
        if position < 0:
            return float(ordered[0])
        below = math.floor(position)
        a, b = (float(ordered[np.searchsorted(ends, rank, side="right")]) for rank in (below, below + 1))
        gamma = position - below
        diff = b - a
        return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma

    return at


class SimulationStats:
    """An engine observer (`on_step`, `on_finish`: the engine's own objects), or a reader of the tracer's plain
    facts (`add_step`, `add_request`: what the span writer's process gets, telemetry/background.py, so that a traced
    simulation keeps its summary there instead of in the simulator's process). Either way the same arithmetic on
    the same values: a request is known by its `Sequence` in the one and by its id in the other."""

    def __init__(self) -> None:
        self._last_token: dict[Hashable, int] = {}
        self._single_gaps: list[int] = []
        self._run_gaps: list[np.ndarray | list[int]] = []  # gaps after a run's first step, one array per run
        self._run_members: list[int] = []  # sequences that got a token at each of those steps
        self._ttft: list[int] = []
        self.requests = self.rejected = self.prompt_tokens = self.cached = self.output_tokens = 0
        self.preemptions = self.steps = 0
        self.first_ns: int | None = None
        self.last_ns = 0

    def on_step(self, report: StepReport) -> None:
        self._step(report.start_ns, report.end_ns, report.durations, report.batch.decodes,
                   [seq for seq, _ in report.batch.prefills if not seq.is_prefilling])

    def add_step(self, step: StepFacts) -> None:
        self._step(step.start_ns, step.end_ns, step.durations, step.decode_ids,
                   [rid for rid, _, _, samples_token in step.prefills if samples_token])

    def _step(self, start_ns: int, end_ns: int, durations: np.ndarray | list[int], decodes: Collection[Hashable],
              sampled: list[Hashable]) -> None:
        """`decodes` got a token at the end of every step, `sampled` (prefills that completed their prompt) one at
        the end of the last."""
        last = self._last_token
        gaps = self._single_gaps
        if decodes:
            first_end = start_ns + int(durations[0])
            gaps += [first_end - last[key] for key in decodes]
            last.update(dict.fromkeys(decodes, end_ns))
            if len(durations) > 1:
                self._run_gaps.append(durations[1:])
                self._run_members.append(len(decodes))
        for key in sampled:
            previous = last.get(key)
            if previous is not None:  # recomputed after a preemption
                gaps.append(end_ns - previous)
            last[key] = end_ns
        self.steps += len(durations)
        self.first_ns = start_ns if self.first_ns is None else self.first_ns
        self.last_ns = end_ns

    def on_finish(self, seq: Sequence) -> None:
        self._finish(seq, seq.error, seq.num_prompt_tokens, seq.num_cached_tokens, seq.num_output_tokens,
                     seq.preemptions, seq.first_token_ns, seq.request.arrival_ns)

    def add_request(self, request: RequestFacts) -> None:
        self._finish(request.request_id, request.error, request.prompt_tokens, request.cached_tokens,
                     request.output_tokens, request.preemptions, request.first_token_ns, request.arrival_ns)

    def _finish(self, key: Hashable, error: str | None, prompt_tokens: int, cached_tokens: int, output_tokens: int,
                preemptions: int, first_token_ns: int | None, arrival_ns: int) -> None:
        self._last_token.pop(key, None)
        self.requests += 1
        if error is not None:
            self.rejected += 1
            return
        self.prompt_tokens += prompt_tokens
        self.cached += max(cached_tokens, 0)
        self.output_tokens += output_tokens
        self.preemptions += preemptions
        assert first_token_ns is not None
        self._ttft.append(first_token_ns - arrival_ns)

    def itl_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Every inter-token gap (ns) with how many tokens had it: a run's later steps give each member one."""
        runs = self._run_gaps
        values = np.concatenate([np.asarray(self._single_gaps, dtype=np.int64), *runs])
        counts = np.concatenate([np.ones(len(self._single_gaps), dtype=np.int64),
                                 np.repeat(np.asarray(self._run_members, dtype=np.int64), [len(g) for g in runs])])
        return values, counts

    def summary(self) -> Summary:
        ttft = np.asarray(self._ttft, dtype=np.float64) / 1e9
        values, counts = self.itl_counts()
        itl = values / 1e9

        def pct(values: np.ndarray, q: float) -> float:
            return float(np.percentile(values, q)) if len(values) else float("nan")

        def itl_pct(q: float) -> float:
            return weighted_percentile(itl, counts, q) if len(itl) else float("nan")

        return Summary(self.requests, self.rejected, self.prompt_tokens, self.cached, self.output_tokens,
                       pct(ttft, 50), pct(ttft, 99), itl_pct(50), itl_pct(99), self.preemptions, self.steps,
                       (self.last_ns - (self.first_ns or 0)) / 1e9)
