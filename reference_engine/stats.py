"""What a simulation did, for the one-paragraph summary: requests, tokens, TTFT and ITL percentiles,
prefix-cache hit rate. An engine observer, like the tracer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference_engine.engine.llm_engine import StepReport
from reference_engine.engine.sequence import Sequence


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


class SimulationStats:
    def __init__(self) -> None:
        self._last_token: dict[Sequence, int] = {}
        self._single_gaps: list[int] = []
        self._run_gaps: list[tuple[np.ndarray, int]] = []  # (gaps after a run's first step, members)
        self._ttft: list[int] = []
        self.requests = self.rejected = self.prompt_tokens = self.cached = self.output_tokens = 0
        self.preemptions = self.steps = 0
        self.first_ns: int | None = None
        self.last_ns = 0

    def on_step(self, report: StepReport) -> None:
        durations, decodes = report.durations, report.batch.decodes
        end = report.end_ns
        last = self._last_token
        gaps = self._single_gaps
        if decodes:
            first_end = report.start_ns + int(durations[0])
            gaps += [first_end - last[seq] for seq in decodes]
            last.update(dict.fromkeys(decodes, end))
            if len(durations) > 1:
                self._run_gaps.append((durations[1:], len(decodes)))
        for seq, _ in report.batch.prefills:
            if not seq.is_prefilling:
                previous = last.get(seq)
                if previous is not None:  # recomputed after a preemption
                    gaps.append(end - previous)
                last[seq] = end
        self.steps += len(durations)
        self.first_ns = report.start_ns if self.first_ns is None else self.first_ns
        self.last_ns = end

    def on_finish(self, seq: Sequence) -> None:
        self._last_token.pop(seq, None)
        self.requests += 1
        if seq.error is not None:
            self.rejected += 1
            return
        self.prompt_tokens += seq.num_prompt_tokens
        self.cached += max(seq.num_cached_tokens, 0)
        self.output_tokens += seq.num_output_tokens
        self.preemptions += seq.preemptions
        assert seq.first_token_ns is not None
        self._ttft.append(seq.first_token_ns - seq.request.arrival_ns)

    def itl_ns(self) -> np.ndarray:
        parts = [np.asarray(self._single_gaps, dtype=np.int64)]
        parts += [np.repeat(gaps, members) for gaps, members in self._run_gaps]
        return np.concatenate(parts)

    def summary(self) -> Summary:
        ttft = np.asarray(self._ttft, dtype=np.float64) / 1e9
        itl = self.itl_ns() / 1e9

        def pct(values: np.ndarray, q: float) -> float:
            return float(np.percentile(values, q)) if len(values) else float("nan")

        return Summary(self.requests, self.rejected, self.prompt_tokens, self.cached, self.output_tokens,
                       pct(ttft, 50), pct(ttft, 99), pct(itl, 50), pct(itl, 99), self.preemptions, self.steps,
                       (self.last_ns - (self.first_ns or 0)) / 1e9)
