"""ITL spikes attributed to colliding prefills from request-level data only: no engine step spans.

What vLLM gives without extra instrumentation is one `llm_request` span per request (arrival, first
scheduling, first token, finish; the `gen_ai.latency.*` attributes), and, where a client streamed the reply,
the time of each token (vLLM's iteration log lines are read by `infertrace.analyzers.itl_iterations`). From the
spans and the token times, per engine instance:

1. clocks: token times a client recorded (`clock="client"`) are late by the network and jittered per token.
   Each request's offset is its first token as the client saw it less its first token on the span; a
   candidate's prefill interval is moved onto the client's clock by its own offset (the median offset when it
   has no token times), and the spread of the offsets (half the 10–90% range) is the timing noise. The
   tolerance below is that noise, and never less than `tolerance_floor_ns`;
2. the decode baseline is the engine's, not each victim's: the `baseline_quantile` of every gap (on a client's
   clock, the mean of up to `smooth_gaps` consecutive gaps of a request: tokens received in one burst read as
   gaps of zero) between two tokens of any request on the instance within `baseline_window_ns` of the gap (the
   whole instance when fewer than `baseline_min_gaps` are there). Stalled steps make gaps longer, never
   shorter, so a low quantile stays at the decode step while most gaps are stalled (a request with few tokens,
   whose own median is a stall, is judged against the engine's step);
3. a spike is a gap whose excess over the baseline is at least `stall_ratio` times the baseline and at least
   `min_excess_ns`, plus the timing noise (a gap between two client-timed tokens carries two jitters);
4. a candidate is every request's prefill interval (first scheduling to first token). The requests decoding
   across it are the gaps of other requests that overlap it by more than the tolerance (a prefill that touches
   a gap by a nanosecond, e.g. times rebuilt from float seconds, did not stall it). Each such request's delay
   there is the sum of its gaps' excess over the engine's median normal gap (the baseline is a low quantile,
   so a normal gap's excess over it is positive on average; summed over many gaps that would read as a stall),
   each capped at the time the gap spends inside the interval plus the noise (a prefill meeting the last
   milliseconds of a long pause is not blamed for the pause). Summing keeps a stall whole when a client's jitter
   splits it over two gaps. But a stall is one step, and on an engine that splits its prefills into chunks of
   about a decode step (a small token budget: read from all its prefills at once, by the decoding requests'
   tokens seen inside them per decode step, about one there and none where prefills run in one step or few
   large chunks) a prefill whose every chunk adds a little, under a stall, adds up to one over many steps. There
   the sum is divided by the steps each decoding request saw (one more than its tokens inside, at most the
   decode steps that fit) less one: a prompt's last chunk is its rest, which may add nothing. A true stall
   delays every request decoding then, while one request's jitter moves one gap: the median (per-step) delay
   must be a stall by a margin of 1.5 times the timing noise over the square root of their number, and over
   the steps (a sum of consecutive gaps carries the jitter of its two end tokens only); or each request's most
   delayed single gap must be, by two tokens' jitter (twice the noise) over the square root of their number. A
   prefill in one step (a gap of each decoding request spans it) is also timed by its own span, without the
   client's jitter: its length less the decode step, or its whole length on an engine whose decodes wait for
   prefills (prefill-first: read from all its one-step prefills at once, a decoding request's gap across one
   being longer by a whole decode step); that, and a median delay reaching a stall, names it. On an engine of
   small chunks one step is shown only where two decode steps do not fit: with a jitter about a decode step, a
   gap about as long as the prefill is also what two chunks adding nothing look like.
   A prefill longer than four times the instance's median time per uncached token times its tokens, plus 20 ms,
   was held by something else (a host pause) and is not blamed. Victims are the requests delayed by a stall (plus the
   noise); the window is the candidate's interval narrowed to their stalled gaps, widened by the tolerance plus two
   jitters. Prefills run back to back (prefill-first) keep their own windows: the next one starts where the last ended;
5. a candidate is cleared when some request on the instance had a clearly normal gap (short by more than two
   tokens' jitter could make a stalled one) wholly inside its prefill interval, away from its ends by the
   tolerance plus that jitter: one of its steps demonstrably did not stall the decodes beside it;
6. culprit windows on an instance that overlap by more than the tolerance and half the shorter window are one
   stall (prefills batched in the same steps); each culprit's confidence is its share of the stall's estimated
   prefill work (uncached prompt tokens spread evenly over its interval), times how clearly it overlaps the
   window beyond the timing noise (`overlap / (overlap + noise)`: 1 on the engine's own clock, less for a prefill
   that meets a client-timed window by about a jitter). A request whose spans give no prompt length (TGI's carry
   no token counts) has its prefill's length stand in for its tokens (at the instance's median time per uncached
   token, where other requests give one), it is not told apart from a prefill held by a host pause (step 4's
   rule needs its tokens), its `uncached_tokens` is None, and a note says how many;
7. spikes no candidate explains are reported as windows without a culprit (`unexplained`): without step
   spans a preemption's recompute and a host pause look alike (no request was prefilling).

Times are integer nanoseconds throughout: a float64 cannot hold a nanosecond at epoch scale.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from infertrace.store.store import Store

Clock = Literal["engine", "client"]


@dataclass(frozen=True)
class RequestOnlyParams:
    stall_ratio: float = 0.5
    min_excess_ns: int = 2_000_000
    min_confidence: float = 0.0  # attributions below it are dropped
    baseline_quantile: float = 0.25
    baseline_window_ns: int = 10_000_000_000
    baseline_min_gaps: int = 20
    tolerance_floor_ns: int = 100_000
    smooth_gaps: int = 4  # client times: the decode step is read from means of this many consecutive gaps


@dataclass(frozen=True)
class RequestCulprit:
    request_id: str
    tenant: str | None
    uncached_tokens: int | None  # None: the spans give no prompt length (TGI's)
    confidence: float  # share of the window's estimated prefill work, discounted by timing noise
    contained: bool  # its whole prefill interval lies inside the window


@dataclass(frozen=True)
class RequestStall:
    """A window on one instance in which one or more decoding requests were stalled, on the spans' clock (client
    times are moved back by the culprits' own offsets, or the median offset for a window without a culprit)."""

    instance: str
    start_ns: int
    end_ns: int
    victims: tuple[str, ...]
    worst_itl_ns: int
    excess_ns: int  # the largest victim excess over the engine's decode baseline
    culprits: tuple[RequestCulprit, ...]


@dataclass(frozen=True)
class RequestOnlyAttribution:
    params: RequestOnlyParams
    stalls: tuple[RequestStall, ...]
    spikes: int  # victim gaps that were spikes
    requests_with_token_times: int
    clock: str = "engine"
    clock_offset_ns: int = 0  # median: token clock − span clock (client only)
    timing_noise_ns: int = 0
    tolerance_ns: int = 0
    decode_baseline_ns: dict[str, int] = field(default_factory=dict)  # per instance, median over the run
    notes: tuple[str, ...] = ()  # what could not be analysed, and why

    def pairs(self) -> list[tuple[str, int, int, str, float]]:
        """(instance, window start, window end, culprit, confidence)."""
        return [(s.instance, s.start_ns, s.end_ns, c.request_id, c.confidence) for s in self.stalls
                for c in s.culprits]

    @property
    def unexplained(self) -> tuple[RequestStall, ...]:
        return tuple(s for s in self.stalls if not s.culprits)


# ---------------------------------------------------------------------------------- the attribution
def attribute_from_requests(requests: pd.DataFrame, token_times: pd.DataFrame,
                            params: RequestOnlyParams | None = None, clock: Clock = "engine") -> RequestOnlyAttribution:
    """`requests`: request_id, instance, tenant, scheduled_ns, first_token_ns, input_tokens, cached_tokens
    (the `requests` relation has them; with disaggregation a request has one row per worker). `token_times`:
    request_id, time_ns (and instance, when known), one row per token; `clock`: "engine" when the times are
    the engine's (the store's `tokens`), "client" when a streaming client recorded them."""
    p = params or RequestOnlyParams()
    notes: list[str] = []
    if token_times.empty:
        notes.append("no token times: spikes between tokens cannot be seen (ingest a client's token times, or "
                     "vLLM's iteration log)")
        return RequestOnlyAttribution(p, (), 0, 0, clock, notes=tuple(notes))
    placed = requests.dropna(subset=["request_id"]).drop_duplicates("request_id", keep="last").set_index(
        "request_id")
    tok = token_times.dropna(subset=["request_id", "time_ns"])
    if "instance" not in tok or tok["instance"].isna().all():
        tok = tok.assign(instance=placed["instance"].reindex(tok["request_id"]).to_numpy())
    unplaced = tok.loc[tok["instance"].isna(), "request_id"].nunique()
    if unplaced:
        notes.append(f"{unplaced} requests with token times are on no known instance (no engine span names one "
                     "for them): their tokens were left out")
    n_requests = int(tok["request_id"].nunique())
    tok = tok.dropna(subset=["instance"]).astype({"time_ns": np.int64, "instance": str, "request_id": str})
    tok = tok.sort_values(["request_id", "time_ns"], kind="stable")
    rid = tok["request_id"].to_numpy()
    inst = tok["instance"].to_numpy()
    t = tok["time_ns"].to_numpy(dtype=np.int64)

    offsets, noise = _clock_offsets(placed, rid, t, clock)
    tol = max(p.tolerance_floor_ns, noise)
    median_offset = int(np.median(list(offsets.values()))) if offsets else 0

    same = np.zeros(len(t), dtype=bool)
    if len(t) > 1:
        same[1:] = (rid[1:] == rid[:-1]) & (inst[1:] == inst[:-1])
    ends = np.flatnonzero(same)
    if not len(ends):
        notes.append("no request has two token times: no gap between tokens to judge")
        return RequestOnlyAttribution(p, (), 0, n_requests, clock, median_offset, noise, tol, notes=tuple(notes))
    g = _Gaps(rid[ends], inst[ends], t[ends - 1], t[ends])
    base = _engine_baseline(g, _smoothed_gaps(same, t, p.smooth_gaps if clock == "client" else 1)[ends], p)
    excess = g.itl - base
    spike = excess >= np.maximum(np.rint(p.stall_ratio * base).astype(np.int64), p.min_excess_ns) + noise

    prefill = requests.dropna(subset=["instance", "scheduled_ns", "first_token_ns"])
    missing = int(requests["request_id"].nunique()) - int(prefill["request_id"].nunique())
    if missing:
        notes.append(f"{missing} requests have no prefill interval (no instance, first scheduling or first token "
                     "on their span): they cannot be named as culprits")
    unsized = int(prefill.loc[prefill["input_tokens"].isna(), "request_id"].nunique())
    if unsized:
        notes.append(f"{unsized} requests have no prompt length on their spans (TGI's carry none) nor on a gateway's "
                     "span in their trace: as culprits, their prefill's length stands in for their tokens, and a "
                     "prefill of theirs held by a host pause cannot be told from a long one")
    stalls: list[RequestStall] = []
    baselines: dict[str, int] = {}
    for instance in sorted(set(g.instance.tolist())):
        on = g.instance == instance
        baselines[instance] = int(np.median(base[on]))
        rows = prefill[prefill["instance"].astype(str) == instance]
        cands = _Candidates(rows, offsets, median_offset if clock == "client" else 0)
        stalls += _instance_stalls(instance, g.take(on), base[on], excess[on], spike[on], cands, tol, noise, p)
    stalls.sort(key=lambda s: (s.instance, s.start_ns, s.end_ns))
    return RequestOnlyAttribution(p, tuple(stalls), int(spike.sum()), n_requests, clock, median_offset, noise, tol,
                                  baselines, tuple(notes))


def _clock_offsets(placed: pd.DataFrame, rid: np.ndarray, t: np.ndarray, clock: Clock) -> tuple[dict[str, int], int]:
    """Per request with token times and a first token on its span: first token time − span first token (client
    clock only), and the timing noise: half the 10–90% range of those offsets."""
    if clock != "client" or not len(t):
        return {}, 0
    first = np.r_[True, rid[1:] != rid[:-1]]
    span_first = placed["first_token_ns"].reindex(rid[first])
    known = span_first.notna().to_numpy()
    ids = rid[first][known]
    off = t[first][known] - span_first.to_numpy()[known].astype(np.int64)
    if not len(off):
        return {}, 0
    lo, hi = np.quantile(off, [0.1, 0.9])
    return dict(zip(ids.tolist(), off.tolist(), strict=True)), round(float(hi - lo) / 2)


class _Gaps:
    """Gaps between two consecutive tokens of one request on one instance: (start, end] in ns."""

    def __init__(self, rid: np.ndarray, instance: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        self.rid, self.instance, self.start, self.end = rid, instance, start, end
        self.itl = end - start

    def take(self, index: np.ndarray) -> _Gaps:
        return _Gaps(self.rid[index], self.instance[index], self.start[index], self.end[index])

    def __len__(self) -> int:
        return len(self.rid)


def _smoothed_gaps(same: np.ndarray, t: np.ndarray, k: int) -> np.ndarray:
    """Per token (sorted by request, then time; `same`: the token before is the same request's): the mean of the
    up to `k` gaps of its request ending at it. A client's jitter, and tokens it received in one burst (gaps of
    zero), cancel in the sum; a decode step is then not read as shorter than it is."""
    start = np.flatnonzero(~same)
    first = start[np.cumsum(~same) - 1]  # the request's first token
    back = np.minimum(np.arange(len(t)) - first, k)
    n = np.maximum(back, 1)
    return (t - t[np.arange(len(t)) - back]) // n


def _engine_baseline(g: _Gaps, smoothed: np.ndarray, p: RequestOnlyParams) -> np.ndarray:
    """Per gap: the `baseline_quantile` of the (smoothed) gaps of every request on its instance ending within
    `baseline_window_ns` (centred) of its end, in buckets of a quarter window."""
    base = np.empty(len(g), dtype=np.int64)
    width = max(p.baseline_window_ns // 4, 1)
    for instance in set(g.instance.tolist()):
        idx = np.flatnonzero(g.instance == instance)
        order = idx[np.argsort(g.end[idx], kind="stable")]
        itl = smoothed[order]
        bucket = (g.end[order] - g.end[order][0]) // width
        whole = round(float(np.quantile(itl, p.baseline_quantile)))
        buckets, first = np.unique(bucket, return_index=True)
        last = np.r_[first[1:], len(order)]
        for k, b in enumerate(buckets.tolist()):
            lo = int(np.searchsorted(bucket, b - 2, "left"))
            hi = int(np.searchsorted(bucket, b + 2, "right"))
            q = round(float(np.quantile(itl[lo:hi], p.baseline_quantile))) if hi - lo >= p.baseline_min_gaps \
                else whole
            base[order[first[k]:last[k]]] = q
    return base


class _Candidates:
    """One instance's prefill intervals on the token clock, sorted by start."""

    def __init__(self, rows: pd.DataFrame, offsets: dict[str, int], default_offset: int) -> None:
        rows = rows.sort_values("scheduled_ns", kind="stable")
        self.ids = rows["request_id"].astype(str).to_numpy()
        shift = np.array([offsets.get(r, default_offset) for r in self.ids], dtype=np.int64)
        self.tenants = rows["tenant"].to_numpy() if "tenant" in rows else np.full(len(rows), None)
        self.start = rows["scheduled_ns"].to_numpy(dtype=np.int64) + shift
        self.end = rows["first_token_ns"].to_numpy(dtype=np.int64) + shift
        order = np.argsort(self.start, kind="stable")
        self.ids, self.tenants, self.start, self.end = self.ids[order], self.tenants[order], self.start[order], \
            self.end[order]
        self.shift = shift[order]
        self.default_shift = default_offset
        uncached = (rows["input_tokens"].fillna(0) - rows["cached_tokens"].fillna(0)).clip(lower=1).to_numpy(
            dtype=np.float64)[order]
        self.sized = rows["input_tokens"].notna().to_numpy(dtype=bool)[order]  # the spans give its prompt length
        # The instance's median time per uncached token over the prefills whose length is known; where none is,
        # a prefill's length stands in for its tokens at one token per ns (only shares of it are used).
        lengths = (self.end - self.start).astype(np.float64)
        self.per_token = float(np.median(lengths[self.sized] / uncached[self.sized])) if self.sized.any() else 0.0
        self.uncached = np.where(self.sized, uncached, lengths / (self.per_token or 1.0))


@dataclass
class _Claim:
    """A candidate's window and the spike gaps it stalled."""

    cand: int
    lo: int
    hi: int
    gaps: list[int]


def _instance_stalls(instance: str, g: _Gaps, base: np.ndarray, excess: np.ndarray, spike: np.ndarray,
                     cands: _Candidates, tol: int, noise: int, p: RequestOnlyParams) -> list[RequestStall]:
    sp = np.flatnonzero(spike)
    sp = sp[np.argsort(g.start[sp], kind="stable")]
    every = np.argsort(g.start, kind="stable")
    e_start, e_end = g.start[every], g.end[every]
    longest = int((e_end - e_start).max()) if len(every) else 0
    threshold = np.maximum(p.stall_ratio * base, p.min_excess_ns)
    # The baseline is a low quantile: a normal gap's excess over it is positive on average (client jitter, the
    # steps' own spread). Summed over many gaps that bias would read as a stall, so sums are taken over the
    # median normal gap instead.
    shift = int(np.median(excess[~spike])) if (~spike).any() else 0
    centred = excess - shift
    step = base + shift  # the engine's decode step: its median normal gap
    # What a prefill's own step may plausibly cost: four times the instance's median time per uncached token,
    # plus 20 ms; a longer one held something else (a host pause). Only where the prompt's length is known.
    per_token = cands.per_token
    # A gap is shown normal only beyond what two tokens' jitter could take off a stalled one.
    normal = np.flatnonzero(centred < threshold - 2 * noise)
    normal = normal[np.argsort(g.start[normal], kind="stable")]
    n_start = g.start[normal]
    n_earliest_end = np.minimum.accumulate(g.end[normal][::-1])[::-1] if len(normal) else normal
    margin = tol + 2 * noise  # another request's token is off the candidate's own by up to about this
    evidence = []
    for j in range(len(cands.ids)):
        s, f = int(cands.start[j]), int(cands.end[j])
        a = int(np.searchsorted(e_start, s - longest, "left"))
        b = int(np.searchsorted(e_start, f - tol, "left"))
        over = every[a:b]
        over = over[(g.end[over] > s + tol) & (g.rid[over] != cands.ids[j])]
        if not len(over):
            continue
        # Every request decoding across the prefill: its delay there is the sum of its gaps' excess (a stall that
        # jitter splits over two gaps, or a prefill spread over several steps, still adds up). A true stall delays
        # all of them; one request's jitter does not. A gap can have been delayed inside the prefill by no more
        # than the time it spends there (its edges are uncertain by the timing noise).
        requests, which = np.unique(g.rid[over], return_inverse=True)
        spent = np.minimum(g.end[over], f) - np.maximum(g.start[over], s) + noise
        delay = np.bincount(which, weights=np.minimum(centred[over], spent).astype(np.float64),
                            minlength=len(requests))
        spanning = np.zeros(len(requests), dtype=np.int64)  # each request's longest gap across the prefill
        np.maximum.at(spanning, which, g.itl[over])
        # The steps each request saw there: one more than its tokens inside (away from the ends by the tolerance),
        # and no more than fit in the prefill (each step holds at least the decodes: a decode step).
        decode_step = max(int(np.median(step[over])), 1)
        fit = max(1, (f - s) // decode_step)
        steps = np.minimum(1 + np.bincount(which, weights=(g.end[over] < f - tol).astype(np.float64),
                                           minlength=len(requests)), fit)
        peak = np.zeros(len(requests), dtype=np.float64)  # each request's most delayed single gap there
        np.maximum.at(peak, which, np.minimum(centred[over], spent).astype(np.float64))
        inner = (f - s - 2 * tol) / decode_step  # the step boundaries that could be seen inside, one per step
        evidence.append((j, s, f, over, which, delay, float(np.median(spanning)), steps, fit, peak, inner))
    # Whether the decodes wait for a prefill (prefill-first: a decoding request's gap spans the decode step and
    # the prefill) or share its step (decode-first, chunked: its gap is the prefill's step) is the engine's
    # policy: read from all its one-step prefills at once, where one request's jitter averages out.
    lag = [sp - (f - s) for _, s, f, over, _, _, sp, *_ in evidence if sp >= (f - s) - noise]
    # (measured on the bank: a whole step under prefill-first, at most half of one under chunked scheduling)
    decodes_wait = len(lag) >= 5 and float(np.median(lag)) >= 0.75 * float(np.median(step))
    # Whether the engine splits its prefills into chunks of about a decode step (a small token budget) or runs
    # them in one step (or few large chunks) is its configuration too: read from all its prefills with room for
    # a step boundary inside (away from their ends by the tolerance), where one request's jitter averages out: the
    # decoding requests' tokens seen there per decode step, about one on the first and none on the second.
    seen = [(float(np.median(steps)) - 1) / inner for *_, steps, _, _, inner in evidence if inner >= 1]
    small_chunks = len(seen) >= 5 and float(np.mean(seen)) >= 0.5
    claims: list[_Claim] = []
    for j, s, f, over, which, delay, spanning, steps, fit, peak, _ in evidence:
        n = len(delay)
        needed = float(np.median(threshold[over]))
        if not small_chunks:
            steps = np.ones(n)  # a prefill is one step (or few): a token inside it is a client's jitter
        # A stall is one step that added `needed`: a delay summed over several steps (a chunked prefill whose every
        # chunk adds a little) is not one. Its mean per step is the least its longest step added (a sum of
        # consecutive gaps carries the jitter of its two end tokens only, so the mean's noise falls with the steps);
        # a single gap shows one long step among short ones (unequal chunks) when it is longer than two tokens'
        # jitter could make a normal one (the median over the decoding requests: by that over their root).
        full = np.maximum(steps - 1, 1)  # a prompt's last chunk is its rest, which may add nothing: the others
        per_step = np.median(delay / full) >= needed + 1.5 * noise / (np.sqrt(n) * float(np.median(full)))
        clear = bool(per_step or np.median(peak) >= needed + 2 * noise / np.sqrt(n))
        # A prefill in one step (a gap of each decoding request spans it: no token inside) is timed by its own span
        # on the engine's clock, without the client's jitter: its step less the decode step is what it added when
        # the decodes ran beside it, its whole step when they waited for it. The victims' delay need then only
        # reach a stall, not clear the noise too. On an engine of small chunks a gap about as long as the prefill
        # is, with a jitter about a decode step, also what two chunks adding nothing look like: one step is then
        # shown only where two do not fit.
        one_step = spanning >= (f - s) - noise and (fit == 1 or not small_chunks)
        own = (f - s) - (0 if decodes_wait else float(np.median(step[over])))
        if cands.sized[j] and own > 4 * per_token * cands.uncached[j] + 20_000_000:
            continue  # far longer than its prompt can cost: it was held by something else (a host pause)
        timed = one_step and own >= needed and np.median(delay) >= needed
        if not (clear or timed):
            continue
        k = int(np.searchsorted(n_start, s + margin, "left"))
        if k < len(normal) and int(n_earliest_end[k]) < f - margin:
            continue  # a clearly normal gap inside its prefill: one of its steps did not stall the decodes
        victim = delay >= (needed + noise if clear else needed)
        hit = over[victim[which] & ((centred[over] >= threshold[over] - noise) | spike[over])]
        if not len(hit):
            continue
        # another request's token is off the candidate's own by up to two jitters: so is the window's edge
        lo, hi = max(s, int(g.start[hit].min()) - margin), min(f, int(g.end[hit].max()) + margin)
        if hi - lo > tol or (hi > lo and f - s <= tol):
            claims.append(_Claim(j, lo, hi, hit.tolist()))
    stalls: list[RequestStall] = []
    claimed = np.zeros(len(g), dtype=bool)
    claims.sort(key=lambda c: (c.lo, c.hi))
    i = 0
    while i < len(claims):
        lo, hi, members = claims[i].lo, claims[i].hi, [claims[i]]
        i += 1
        # prefills batched in the same steps are one stall; ones that merely touch (chunks of the next prompt in
        # the last step of this one) keep their own windows
        while i < len(claims) and min(hi, claims[i].hi) - claims[i].lo > max(
                tol, min(hi - lo, claims[i].hi - claims[i].lo) // 2):
            hi = max(hi, claims[i].hi)
            members.append(claims[i])
            i += 1
        stall = _stall(instance, lo, hi, members, g, excess, cands, noise, p)
        for c in members:
            claimed[c.gaps] = True
        if stall.culprits:
            stalls.append(stall)
        else:
            claimed[[x for c in members for x in c.gaps]] = False
    rest = sp[~claimed[sp]]
    for group in _common_groups(g.start[rest], g.end[rest]):
        gaps = rest[group]
        stalls.append(RequestStall(instance, int(g.start[gaps].max()) - cands.default_shift,
                                   int(g.end[gaps].min()) - cands.default_shift,
                                   tuple(sorted(set(g.rid[gaps].tolist()))), int(g.itl[gaps].max()),
                                   int(excess[gaps].max()), ()))
    return stalls


def _common_groups(starts: np.ndarray, ends: np.ndarray) -> Iterable[np.ndarray]:
    """Indices (into the given arrays, sorted by start) grouped greedily so that each group's intervals share a
    common part."""
    order = np.argsort(starts, kind="stable")
    group: list[int] = []
    lo = hi = 0
    for i in order.tolist():
        s, e = int(starts[i]), int(ends[i])
        if group and max(lo, s) < min(hi, e):
            lo, hi = max(lo, s), min(hi, e)
            group.append(i)
            continue
        if group:
            yield np.array(group)
        group, lo, hi = [i], s, e
    if group:
        yield np.array(group)


def _stall(instance: str, lo: int, hi: int, members: list[_Claim], g: _Gaps, excess: np.ndarray,
           cands: _Candidates, noise: int, p: RequestOnlyParams) -> RequestStall:
    gaps = np.unique(np.array([x for c in members for x in c.gaps], dtype=np.int64))
    js = sorted({c.cand for c in members})
    s, f = cands.start[js], cands.end[js]
    overlap = np.maximum(np.minimum(f, hi) - np.maximum(s, lo), 0)
    work = cands.uncached[js] * overlap.astype(np.float64) / np.maximum(f - s, 1).astype(np.float64)
    share = work / work.sum() if work.sum() > 0 else np.full(len(js), 1 / len(js))
    clear = overlap / (overlap + noise) if noise else np.ones(len(js))
    culprits = [RequestCulprit(str(cands.ids[j]), cands.tenants[j],
                               int(cands.uncached[j]) if cands.sized[j] else None, float(sh * cl),
                               bool(x >= lo and y <= hi))
                for j, sh, cl, x, y in zip(js, share, clear, s, f, strict=True) if sh * cl >= p.min_confidence]
    culprits.sort(key=lambda c: -c.confidence)
    victims = tuple(sorted(set(g.rid[gaps].tolist())))
    back = round(float(np.median(cands.shift[js])))  # onto the spans' clock: the culprits' own offsets
    return RequestStall(instance, lo - back, hi - back, victims, int(g.itl[gaps].max()), int(excess[gaps].max()),
                        tuple(culprits))


def token_source(store: Store) -> str | None:
    """Which token times the request-only method can read on the store: 'client_tokens' (a streaming client's,
    ingested), 'tokens' (the engine's own per-token spans: SGLang, TGI, the reference engine) or None."""
    if store.sql("SELECT count(*) FROM client_tokens").fetchall()[0][0]:
        return "client_tokens"
    if store.sql("SELECT count(*) FROM tokens").fetchall()[0][0]:
        return "tokens"
    return None


def attribute_store_requests(store: Store, params: RequestOnlyParams | None = None,
                             tokens: str | None = None) -> RequestOnlyAttribution:
    """The request-only attribution on a store: the engine request spans for the requests and, for the token
    times, a client's (`client_tokens`, on the client's clock: offsets estimated) when the store has them, else
    the `tokens` relation (no step membership is used). `tokens` forces one of the two."""
    requests = store.sql("SELECT request_id, instance, tenant, scheduled_ns, first_token_ns, input_tokens, "
                         "cached_tokens FROM requests").df()
    which = tokens or token_source(store) or "tokens"
    if which == "client_tokens":
        times = store.sql("SELECT request_id, time_ns FROM client_tokens").df()
        return attribute_from_requests(requests, times, params, clock="client")
    times = store.sql("SELECT request_id, instance, time_ns FROM tokens").df()
    return attribute_from_requests(requests, times, params)
