"""The request-only ITL attribution on hand-built token times whose answer is known: each case is a way the
method failed on real traffic (empty or unplaced token tables, back-to-back prefills, a 1-ns boundary, a
victim whose own median ITL is already stalled).

Times are at the scale of real epoch nanoseconds (≈ 1.8e18), where a float64 cannot hold a nanosecond."""

from __future__ import annotations

import numpy as np
import pandas as pd

from infertrace.analyzers.itl_requests import attribute_from_requests

T0 = 1_767_225_600_123_456_789
MS = 10**6


def _requests(rows: list[tuple[str, str | None, int, int, int]]) -> pd.DataFrame:
    """(request, instance, prefill start ms, first token ms, uncached prompt tokens)."""
    return pd.DataFrame({
        "request_id": [r[0] for r in rows], "instance": [r[1] for r in rows], "tenant": ["t"] * len(rows),
        "scheduled_ns": [T0 + r[2] * MS for r in rows], "first_token_ns": [T0 + r[3] * MS for r in rows],
        "input_tokens": [r[4] for r in rows], "cached_tokens": [0] * len(rows)})


def _tokens(request: str, times_ms: list[int]) -> list[tuple[str, int]]:
    return [(request, T0 + t * MS) for t in times_ms]


def _table(*parts: list[tuple[str, int]]) -> pd.DataFrame:
    return pd.DataFrame([row for part in parts for row in part], columns=["request_id", "time_ns"])


def _steady(request: str, start_ms: int, end_ms: int, step_ms: int = 10) -> list[int]:
    return list(range(start_ms, end_ms + 1, step_ms))


def test_an_empty_token_table_gives_no_stalls_and_says_there_were_no_token_times() -> None:
    requests = _requests([("a", "e0", 0, 40, 100)])
    result = attribute_from_requests(requests, pd.DataFrame({"request_id": [], "time_ns": []}))
    assert result.stalls == ()
    assert result.requests_with_token_times == 0
    assert any("no token times" in note for note in result.notes)


def test_tokens_of_requests_on_no_known_instance_are_counted_not_fatal() -> None:
    requests = _requests([("a", None, 0, 40, 100), ("b", None, 0, 40, 100)])
    tokens = _table(_tokens("a", _steady("a", 40, 200)), _tokens("b", [40, 50, 120, 130]))
    result = attribute_from_requests(requests, tokens)
    assert result.stalls == ()
    assert any("2 requests" in note and "instance" in note for note in result.notes)


def test_back_to_back_prefills_under_prefill_first_are_each_named_for_their_own_step() -> None:
    # Prefill-first: decode step 90–100 ms, then p1 prefills alone 100–140 ms and p2 140–180 ms, then a decode
    # step 180–190 ms. "a" decoded throughout (one gap 100 → 190 ms); p1's first token came at 140 ms, its second
    # at 190 ms (p2 stalled it). The window of p1 is its own step; p2's is its own.
    requests = _requests([("a", "e0", -500, -490, 100), ("p1", "e0", 100, 140, 1500), ("p2", "e0", 140, 180, 1500)])
    tokens = _table(_tokens("a", [*_steady("a", -490, 100), *_steady("a", 190, 400)]),
                    _tokens("p1", [140, *_steady("p1", 190, 400)]), _tokens("p2", _steady("p2", 180, 400)))
    result = attribute_from_requests(requests, tokens)
    by_culprit = {c.request_id: s for s in result.stalls for c in s.culprits}
    assert set(by_culprit) == {"p1", "p2"}
    p1, p2 = by_culprit["p1"], by_culprit["p2"]
    assert (p1.start_ns, p1.end_ns) == (T0 + 100 * MS, T0 + 140 * MS)
    assert (p2.start_ns, p2.end_ns) == (T0 + 140 * MS, T0 + 180 * MS)
    assert p1.victims == ("a",) and p2.victims == ("a", "p1")
    assert [c.confidence for c in p1.culprits] == [1.0] and [c.confidence for c in p2.culprits] == [1.0]


def test_a_prefill_ending_a_nanosecond_into_a_host_pause_gap_is_not_blamed_for_it() -> None:
    # A prefill step 100–140 ms, then a decode step held by a 150 ms host pause (140–300 ms). The prefill's
    # first token, rebuilt from float seconds, reads 1 ns late: it touches the paused gap by 1 ns only.
    requests = _requests([("a", "e0", -500, -490, 100), ("b", "e0", -500, -490, 100), ("p", "e0", 100, 140, 1500)])
    requests.loc[2, "first_token_ns"] += 1
    # "p" asked for one token: it is no victim of the pause itself.
    decode = [*_steady("x", -490, 90), 140, *_steady("x", 300, 500)]
    tokens = _table(_tokens("a", decode), _tokens("b", decode), _tokens("p", [140]))
    result = attribute_from_requests(requests, tokens)
    paused = [s for s in result.stalls if s.start_ns >= T0 + 140 * MS]
    assert len(paused) == 1 and paused[0].culprits == ()
    assert all(c.request_id != "p" or s.end_ns <= T0 + 140 * MS + 1 for s in result.stalls for c in s.culprits)


def test_a_lone_candidate_within_the_client_clock_noise_of_a_stall_is_not_blamed_and_one_beyond_it_is_less_than_sure(
) -> None:
    # Five requests decode every 10 ms, then a 150 ms pause stalls all of them (gap 100 → 250 ms). A client saw
    # them 0, 0.5, 1, 1.5 and 2 ms late (timing noise ≈ 0.8 ms). "p" has no client tokens: its prefill is moved by
    # the median offset (1 ms). Ending 0.3 ms into the earliest victim's gap, within the noise, it is not blamed;
    # ending 15 ms into every victim's gap (a stall's worth of its own), it is, with a confidence below 1.
    def run(prefill_end_ms: float) -> list[tuple[str, float]]:
        end = T0 + round(prefill_end_ms * MS)
        requests = _requests([(f"d{k}", "e0", -500, -490, 100) for k in range(5)] + [("p", "e0", 96, 100, 1500)])
        requests.loc[5, "first_token_ns"] = end
        tokens = _table(*[[(r, t + k * 500_000) for r, t in _tokens(f"d{k}", [*_steady("x", -490, 100),
                                                                                 *_steady("x", 250, 500)])]
                          for k in range(5)])
        result = attribute_from_requests(requests, tokens, clock="client")
        assert result.timing_noise_ns == 800_000 and result.clock_offset_ns == 1_000_000
        return [(c.request_id, c.confidence) for s in result.stalls for c in s.culprits]

    assert run(99.3) == []
    ((culprit, confidence),) = run(115.0)
    assert culprit == "p" and 0.5 < confidence < 1.0


def test_a_victim_with_few_tokens_is_judged_against_the_engine_decode_step_not_its_own_median() -> None:
    # Code-completion traffic: "v" gets 5 tokens and three of its four gaps were stalled by prefills (its own
    # median ITL is 50 ms, a stall). Other requests on the engine decode every 10 ms before and after: the
    # engine's decode step is 10 ms, and each of p1, p2, p3 stalled v.
    requests = _requests([("d1", "e0", -1000, -990, 100), ("d2", "e0", 150, 170, 100), ("v", "e0", -20, 10, 100),
                          ("p1", "e0", 10, 50, 1500), ("p2", "e0", 60, 100, 1500), ("p3", "e0", 110, 150, 1500)])
    tokens = _table(_tokens("d1", _steady("d1", -990, 10)), _tokens("d2", _steady("d2", 170, 900)),
                    _tokens("v", [10, 60, 110, 160, 170]),
                    _tokens("p1", [50, 60]), _tokens("p2", [100, 110]), _tokens("p3", [150, 160]))
    result = attribute_from_requests(requests, tokens)
    named = {(c.request_id, s.victims) for s in result.stalls for c in s.culprits}
    assert {("p1", ("v",)), ("p2", ("v",)), ("p3", ("v",))} <= named
    assert all(s.excess_ns >= 30 * MS for s in result.stalls if s.culprits)


def test_a_request_with_an_inflated_median_does_not_clear_the_prefill_that_stalled_it() -> None:
    # "p" prefilled in chunks 0–130 ms that stalled the decodes: "d" (10 ms steps before) got tokens at 60 and
    # 120 ms. "w" got three tokens, at 0, 60 and 120 ms: by its own median (60 ms) its gap 0–60 ms is normal and,
    # lying inside p's prefill, would clear p; against the engine's 10 ms decode step it is a stall too.
    requests = _requests([("d", "e0", -1000, -990, 100), ("w", "e0", -30, 0, 100), ("p", "e0", 0, 130, 6000)])
    tokens = _table(_tokens("d", [*_steady("d", -990, 0), 60, *_steady("d", 120, 900)]),
                    _tokens("w", [0, 60, 120]), _tokens("p", [130, 140]))
    result = attribute_from_requests(requests, tokens)
    assert "p" in {c.request_id for s in result.stalls for c in s.culprits}


def test_a_culprit_window_is_its_own_prefill_step_in_exact_epoch_nanoseconds() -> None:
    requests = _requests([("a", "e0", -500, -490, 100), ("p", "e0", 100, 140, 1500)])
    tokens = _table(_tokens("a", [*_steady("a", -490, 100), *_steady("a", 150, 400)]), _tokens("p", [140, 150]))
    requests["scheduled_ns"] += 7
    requests["first_token_ns"] += 7
    (stall,) = [s for s in attribute_from_requests(requests, tokens).stalls if s.culprits]
    assert (stall.start_ns, stall.end_ns) == (T0 + 100 * MS + 7, T0 + 140 * MS + 7)
    assert isinstance(stall.start_ns, int) and isinstance(stall.excess_ns, int)


def test_a_prefill_held_by_a_host_pause_far_beyond_its_prompts_cost_is_not_blamed_for_the_pause() -> None:
    # Prefills on this engine cost about 0.03 ms a token (p1, p2: 1500 tokens in 40 ms). "p" (200 tokens) was
    # scheduled at 100 ms and, held by a 190 ms host pause, got its first token at 300 ms: the decodes beside it
    # were stalled, but not by its prompt.
    requests = _requests([("a", "e0", -500, -490, 100), ("b", "e0", -500, -490, 100),
                          ("p1", "e0", -300, -260, 1500), ("p2", "e0", 500, 540, 1500), ("p", "e0", 100, 300, 200)])
    decode = [*_steady("x", -490, -300), *_steady("x", -260, 100), *_steady("x", 310, 500), *_steady("x", 540, 700)]
    tokens = _table(_tokens("a", decode), _tokens("b", decode), _tokens("p1", [-260, -250]),
                    _tokens("p2", [540, 550]), _tokens("p", [300, 310]))
    result = attribute_from_requests(requests, tokens)
    named = {c.request_id for s in result.stalls for c in s.culprits}
    assert {"p1", "p2"} <= named and "p" not in named
    assert any(not s.culprits and s.start_ns <= T0 + 110 * MS and s.end_ns >= T0 + 300 * MS for s in result.stalls)


def test_a_prefill_that_meets_only_the_last_milliseconds_of_a_long_stalled_gap_is_not_blamed_for_it() -> None:
    # A 190 ms host pause holds the decodes (gap 100 → 300 ms); "p" prefilled 297–304 ms, a 7 ms step like a
    # decode step of 10 ms would hide. It overlaps the stalled gap by 3 ms: less than a stall (5 ms) could be its.
    requests = _requests([("a", "e0", -500, -490, 100), ("b", "e0", -500, -490, 100), ("p", "e0", 297, 304, 100)])
    decode = [*_steady("x", -490, 100), *_steady("x", 300, 600)]
    tokens = _table(_tokens("a", decode), _tokens("b", decode), _tokens("p", [304, 314]))
    result = attribute_from_requests(requests, tokens)
    assert "p" not in {c.request_id for s in result.stalls for c in s.culprits}
    assert any(not s.culprits and s.end_ns == T0 + 300 * MS for s in result.stalls)


def test_a_stall_that_a_clients_late_token_splits_over_two_gaps_is_still_found() -> None:
    # Decode steps of 10 ms; "p" prefilled in a mixed step 100–118 ms (8 ms over the decode step: a stall). The
    # client got every decoder's token of 100 ms 4 ms late, so the stall shows as two gaps of 14 ms (4 ms over
    # the step each, neither a spike); each decoder's delay across p's prefill is their sum.
    engine = [*_steady("x", -490, 100), *_steady("x", 118, 600)]
    requests = _requests([(f"d{k}", "e0", -500, -490, 100) for k in range(4)] + [("p", "e0", 100, 118, 1500)])
    parts = [[(f"d{k}", T0 + (t + k) * MS + (4 * MS if t == 100 else 0)) for t in engine] for k in range(4)]
    parts.append([("p", T0 + 119 * MS + MS // 2), ("p", T0 + 129 * MS + MS // 2)])
    result = attribute_from_requests(requests, _table(*parts), clock="client")
    assert result.spikes == 0  # no single gap shows the stall
    (stall,) = [s for s in result.stalls if s.culprits]
    assert [c.request_id for c in stall.culprits] == ["p"]
    assert stall.start_ns <= T0 + 118 * MS <= stall.end_ns  # the step's end, back on the spans' clock


def _chunked_engine(chunk_steps_ms: list[list[float]], prefills: int, decoders: int = 1, seed: int = 15,
                    decode_ms: float = 2.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A decode-first engine with a 2 ms decode step: `decoders` long requests decode throughout, and every
    40 ms a new request prefills in steps of the next of `chunk_steps_ms` (each step holding the decodes and one
    chunk), then decodes 5 tokens. A streaming client receives every token 2 ms late plus a jitter uniform in 0–5 ms (in
    order: a token never arrives before the one before it), as in the evaluation bank's noisiest scenarios."""
    rng = np.random.default_rng(seed)
    t, times, rows = 0.0, {f"d{k}": [] for k in range(decoders)}, []
    for k in range(decoders):
        rows.append((f"d{k}", 0, 0))
    for i in range(prefills):
        chunks = chunk_steps_ms[i % len(chunk_steps_ms)]
        for _ in range(round((40 - sum(chunks)) / decode_ms) - 5):  # decode-only steps
            t += decode_ms
            for d in range(decoders):
                times[f"d{d}"].append(t)
        start = t
        for length in chunks:
            t += length
            for d in range(decoders):
                times[f"d{d}"].append(t)
        rows.append((f"p{i}", start, t))
        times[f"p{i}"] = [t]
        for _ in range(5):
            t += decode_ms
            for r in (*[f"d{d}" for d in range(decoders)], f"p{i}"):
                times[r].append(t)
    requests = pd.DataFrame({
        "request_id": [r[0] for r in rows], "instance": "e0", "tenant": "t",
        "scheduled_ns": [T0 + round(r[1] * MS) for r in rows],
        "first_token_ns": [T0 + round((r[2] if r[0].startswith("p") else decode_ms) * MS) for r in rows],
        "input_tokens": 600, "cached_tokens": 0})
    client = []
    for r, ts in times.items():
        arrive = np.maximum.accumulate(np.array(ts) + 2.0 + rng.uniform(0, 5, len(ts)))
        client += [(r, T0 + round(x * MS)) for x in arrive]
    return requests, pd.DataFrame(client, columns=["request_id", "time_ns"])


def test_two_steps_of_a_chunked_prefill_that_add_nothing_are_not_read_as_one_long_step_through_a_clients_jitter(
) -> None:
    # Each prefill is two to five 2.2 ms steps (its chunks add 0.2 ms to the 2 ms decode step: no stall). The
    # client's jitter (0–5 ms) often hides the decoder's token between two of them, so its gap spans a two-step
    # prefill's 4.4 ms: read as one step, the prefill would have added 2.4 ms, a stall.
    requests, tokens = _chunked_engine([[2.2] * 2, [2.2] * 3, [2.2] * 2, [2.2] * 4, [2.2] * 2, [2.2] * 5],
                                       prefills=60)
    result = attribute_from_requests(requests, tokens, clock="client")
    assert result.timing_noise_ns > 1_500_000  # the case: jitter about a decode step
    assert [c.request_id for s in result.stalls for c in s.culprits] == []


def test_a_long_chunked_prefill_whose_every_step_adds_a_little_is_not_a_stall() -> None:
    # Eight 3 ms steps: each chunk adds 1 ms, under the 2 ms a stall needs; the decoder's delay summed over the
    # prefill is 8 ms.
    requests, tokens = _chunked_engine([[3.0] * 8], prefills=40)
    result = attribute_from_requests(requests, tokens, clock="client")
    assert [c.request_id for s in result.stalls for c in s.culprits] == []


def test_a_chunked_prefill_with_one_long_step_among_short_ones_is_still_named() -> None:
    # A full chunk (a 7 ms step: 5 ms over the decode step) then the prompt's short remainder (2.2 ms): the mean
    # per step is under the larger step's excess, the long gap itself shows the stall.
    requests, tokens = _chunked_engine([[7.0, 2.2]], prefills=40, decoders=3)
    result = attribute_from_requests(requests, tokens, clock="client")
    named = {c.request_id for s in result.stalls for c in s.culprits}
    assert len(named) >= 36 and named <= {f"p{i}" for i in range(40)}


def test_prefills_without_a_prompt_length_are_named_by_their_prefills_length_and_said_unsized() -> None:
    # As the back-to-back case, but the spans give no prompt length (TGI's carry no token counts): each prefill
    # still gets its own window, its uncached tokens are unknown rather than made up, and a note says so.
    requests = _requests([("a", "e0", -500, -490, 100), ("p1", "e0", 100, 140, 1500), ("p2", "e0", 140, 180, 1500)])
    requests["input_tokens"] = None
    requests["cached_tokens"] = None
    tokens = _table(_tokens("a", [*_steady("a", -490, 100), *_steady("a", 190, 400)]),
                    _tokens("p1", [140, *_steady("p1", 190, 400)]), _tokens("p2", _steady("p2", 180, 400)))
    result = attribute_from_requests(requests, tokens)
    by_culprit = {c.request_id: c for s in result.stalls for c in s.culprits}
    assert set(by_culprit) == {"p1", "p2"}
    assert [c.uncached_tokens for c in by_culprit.values()] == [None, None]
    assert [c.confidence for c in by_culprit.values()] == [1.0, 1.0]
    assert any(n.startswith("3 requests have no prompt length on their spans") for n in result.notes)


def test_two_unsized_prefills_in_one_window_share_it_by_how_long_each_prefilled_in_it() -> None:
    # Decode-first with chunks: "a" decodes at 10 ms steps, and two prompts prefill side by side, p1 for 120 ms
    # and p2 for the last 40 ms of it; every step of theirs stalls "a" by 30 ms. Without token counts the longer
    # prefill in the window carries the larger share.
    requests = _requests([("a", "e0", -500, -490, 100), ("p1", "e0", 100, 220, 1500), ("p2", "e0", 180, 220, 500)])
    requests["input_tokens"] = None
    decode = [*_steady("a", -490, 100), *range(140, 221, 40), *_steady("a", 230, 500)]
    tokens = _table(_tokens("a", decode), _tokens("p1", [220, *_steady("p1", 230, 500)]),
                    _tokens("p2", [220, *_steady("p2", 230, 500)]))
    result = attribute_from_requests(requests, tokens)
    shares = {c.request_id: c.confidence for s in result.stalls for c in s.culprits}
    assert set(shares) == {"p1", "p2"} and shares["p1"] > shares["p2"] > 0, result.stalls
