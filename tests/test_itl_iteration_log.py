"""vLLM's iteration log joined to the request spans, on hand-built logs whose answer is known: each case is a way
the method went wrong on a bank of vLLM V1 telemetry (an iteration placed across the engine's idle time, a
prefill-only step's wall time read without the scheduler's time, a preempted request's recompute blamed on a
fresh prefill)."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd

from infertrace.analyzers.itl_iterations import attribute_iterations
from infertrace.store.side_inputs import parse_iteration_log

T0 = 1_767_225_600 * 10**9  # 2026-01-01 00:00:00 UTC
MS = 10**6


def _log(iterations: list[tuple[float, int, int, int, float]]) -> pd.DataFrame:
    """(end ms, context requests, context tokens, generation requests, elapsed ms) per iteration, as vLLM V1
    logs them on engine core e0."""
    lines = []
    for k, (end_ms, ctx, ctx_tokens, gen, elapsed_ms) in enumerate(iterations):
        stamp = datetime.fromtimestamp((T0 + round(end_ms * MS)) // 10**9, UTC).strftime("%m-%d %H:%M:%S")
        lines.append(f"(EngineCore_DP0 pid=9) INFO {stamp} [core.py:397] Iteration({k}): {ctx} context requests, "
                     f"{ctx_tokens} context tokens, {gen} generation requests, {gen} generation tokens, iteration "
                     f"elapsed time: {elapsed_ms:.2f} ms")
    return parse_iteration_log(iter(lines), "e0").to_pandas()


def _requests(rows: list[tuple[str, float, float, float, float, int]]) -> pd.DataFrame:
    """(request, arrival ms, first scheduling ms, first token ms, finish ms, prompt tokens) on engine e0; vLLM V1
    spans count no cached tokens."""
    return pd.DataFrame({
        "request_id": [r[0] for r in rows], "instance": ["e0"] * len(rows), "tenant": ["t"] * len(rows),
        "arrival_ns": [T0 + round(r[1] * MS) for r in rows], "scheduled_ns": [T0 + round(r[2] * MS) for r in rows],
        "first_token_ns": [T0 + round(r[3] * MS) for r in rows], "finish_ns": [T0 + round(r[4] * MS) for r in rows],
        "input_tokens": [r[5] for r in rows], "cached_tokens": [None] * len(rows)})


def _decodes(start_ms: float, count: int, gen: int, step_ms: float = 10.0) -> list[tuple[float, int, int, int, float]]:
    return [(start_ms + (k + 1) * step_ms, 0, 0, gen, step_ms) for k in range(count)]


def test_a_stall_after_the_engines_idle_time_is_placed_from_the_anchor_after_it_not_carried_across_the_idle() -> None:
    # Prefill-first. "a" is prefilled alone (0-100 ms) and decodes until 300 ms; the engine then has no request
    # until 600 ms. "d1" and "d2" are prefilled together (600-610 ms) and decode; "c1" and "c2" arrive at 650 ms
    # and are prefilled together in a 40 ms iteration while d1 and d2 wait (the stall, ending at 690 ms); "e"
    # arrives at 985 ms and is prefilled alone once they finish (990-1030 ms), "f" alone at 1950-1998 ms. Only
    # the lone prefills anchor the log (their first tokens end them); the stall is 26 iterations after a's and
    # 31 before e's, but the engine idled after a's: it is placed from e's.
    iterations = [(100, 1, 1000, 0, 100), *_decodes(100, 20, 1), (610, 2, 600, 0, 10), *_decodes(610, 4, 2),
                  (690, 2, 3000, 0, 40), *_decodes(690, 30, 2), (1030, 1, 3000, 0, 40), *_decodes(1030, 10, 1),
                  (1998, 1, 2500, 0, 48), *_decodes(1998, 5, 1)]
    requests = _requests([("a", 0, 0, 100, 300, 1000), ("d1", 600, 600, 610, 990, 300),
                          ("d2", 600, 600, 610, 990, 300), ("c1", 650, 650, 690, 700, 1500),
                          ("c2", 650, 650, 690, 700, 1500), ("e", 985, 990, 1030, 1130, 3000),
                          ("f", 1950, 1950, 1998, 2048, 2500)])
    result = attribute_iterations(_log(iterations), requests)
    (stall,) = [s for s in result.stalls if s.context_tokens == 3000 and s.generation_requests == 0
                and s.context_requests == 2]
    assert abs(stall.end_ns - (T0 + 690 * MS)) <= 1 * MS
    assert sorted(c.request_id for c in stall.culprits) == ["c1", "c2"]


def test_a_prefill_only_iteration_stalls_the_waiting_decodes_by_its_elapsed_time_plus_the_schedulers() -> None:
    # Prefill-first, a small model: decode iterations of 2.0 ms (1.75 ms logged: vLLM's timer leaves out the
    # scheduler's 0.25 ms). Lone prefills of distinct sizes anchor the log every 10 iterations; "p" (200 tokens)
    # is prefilled in 2.2 ms (1.95 ms logged) while "d" waits: d's token is 2.2 ms late, a stall (over 2 ms and
    # over half a decode step), though the logged time alone is under 2 ms.
    iterations, rows, t = [], [("d", 0, 0, 2, 10_000, 50)], 2.0
    iterations.append((t, 1, 50, 0, 1.75))
    for k in range(8):
        iterations += [(t + 2.0 * (j + 1), 0, 0, 1, 1.75) for j in range(9)]
        t += 18.0
        tokens = 1000 + 7 * k
        iterations.append((t + 2.0, 1, tokens, 0, 1.75))
        rows.append((f"q{k}", t - 5, t, t + 2.0, t + 2.0, tokens))  # one-token requests: prefilled, done
        t += 2.0
    iterations += [(t + 2.0 * (j + 1), 0, 0, 1, 1.75) for j in range(9)]
    t += 18.0
    iterations.append((t + 2.2, 1, 200, 0, 1.95))
    rows.append(("p", t - 5, t, t + 2.2, t + 30, 200))
    iterations += [(t + 2.2 + 2.0 * (j + 1), 0, 0, 2, 1.75) for j in range(9)]
    result = attribute_iterations(_log(iterations), _requests(rows))
    stalls = [s for s in result.stalls if s.context_tokens == 200]
    assert len(stalls) == 1
    assert [c.request_id for c in stalls[0].culprits] == ["p"]
    assert abs(stalls[0].excess_ns - round(2.2 * MS)) <= 20_000


def test_a_preempted_requests_recompute_is_not_blamed_on_a_prefill_it_did_not_hold() -> None:
    # Decode-first (chunked): prefills share iterations with the decodes. At 500 ms an iteration recomputes a
    # preempted request (900 context tokens: its prompt and what it had generated) beside 4 decodes, 8 ms over
    # their 10 ms step. Near it on the spans: "q" (a 56-token prompt, scheduled before it, first token 2 ms
    # after it: too small to be its 900 tokens) and "p" (scheduled 2.5 ms after it ended: not in it). Neither is
    # named; the stall is reported without a culprit.
    iterations: list[tuple[float, int, int, int, float]] = []
    rows = [(f"d{k}", 0.0, 0.0, 5.0, 2000.0, 100) for k in range(4)]
    t = 0.0
    for k in range(40):
        t += 10.0
        if k % 8 == 3:  # whole small prompts beside the decodes, below a stall: they anchor the log
            iterations.append((t, 1, 300 + k, 4, 10.0))
            rows.append((f"c{k}", t - 12, t - 10, t, t + 50, 300 + k))
        else:
            iterations.append((t, 0, 0, 4, 10.0))
    iterations.append((t + 18.0, 1, 900, 4, 18.0))
    end = t + 18.0
    iterations += _decodes(end, 10, 4)
    rows += [("q", end - 30, end - 20, end + 2, end + 40, 56), ("p", end - 1, end + 2.5, end + 60, end + 90, 9000)]
    result = attribute_iterations(_log(iterations), _requests(rows))
    (stall,) = [s for s in result.stalls if s.context_tokens == 900]
    assert stall.culprits == ()


def test_a_chunked_prompt_with_a_prefix_cache_hit_is_anchored_by_its_last_chunk_not_an_earlier_one() -> None:
    # Decode-first, chunked (V1's mixed iterations). "d" decodes throughout in 10 ms steps; "p" (1,951 tokens,
    # 1,024 of them a prefix-cache hit its span does not report) is prefilled in two chunks beside it: 511 tokens
    # ending at 520 ms (20 ms), then 416 ending at 537 ms (17 ms) with p's first token. The first chunk's tokens
    # are also a whole number of KV blocks short of p's prompt: taken for p's whole (cached) prompt, it would
    # move both stalls 17 ms late. p's span (scheduled 500 ms, first token 537 ms) holds both iterations, not one.
    iterations = [(10, 1, 50, 0, 10), *_decodes(10, 49, 1), (520, 1, 511, 1, 20), (537, 1, 416, 1, 17),
                  *_decodes(537, 30, 1)]
    requests = _requests([("d", 0, 0, 10, 840, 50), ("p", 500, 500, 537, 537, 1951)])
    result = attribute_iterations(_log(iterations), requests)
    ends = {s.context_tokens: s.end_ns for s in result.stalls}
    assert abs(ends[511] - (T0 + 520 * MS)) <= 1 * MS
    assert abs(ends[416] - (T0 + 537 * MS)) <= 1 * MS
    assert {c.request_id for s in result.stalls for c in s.culprits} == {"p"}
