"""ITL stalls from vLLM's iteration log (`--enable-logging-iteration-details`), joined to the request spans by
time: which iterations stalled the decoding requests, when, and whose prefill was in them.

A line gives an iteration's context (prefill) requests and tokens, its generation (decode) requests and an
elapsed time, stamped with the logging process's local wall clock in whole seconds. Per log (one engine core,
`iteration_log.log` naming its instance):

1. end times on the log's clock: each iteration ends in its stamp's second and at least its elapsed time after
   the one before (the timer leaves out the scheduler's own time, so never more), and at most the next one's
   elapsed time before the next. Forward and backward passes give each end a lower and an upper bound; the
   estimate is their midpoint (idle time between iterations is not assumed away: a second boundary resets
   the bounds);
2. the clock offset between the log and the spans (time zone, the whole-second stamps, and vLLM V1's
   API-server clock on the spans) is estimated from the data: lone prefill iterations whose context tokens are
   exactly one request's prompt, or end a run of lone prefill iterations (a chunked prompt's chunks) whose
   tokens are, less a whole number of KV blocks where the spans count no cached tokens (anchors), end when that
   request's first token is produced; the run's elapsed times must also fit the request's prefill on its span
   (first scheduling to first token), which a chunk before the prompt's last does not by a whole iteration. The
   offset is the one that puts the most anchored first tokens inside their iterations' bounds;
3. placement on the spans' clock: an anchor is kept only where the log's own times agree with its neighbours
   (the elapsed times between two anchors fit between their first tokens, and, where the spans show the engine
   running requests throughout, with at most twice the median scheduler time per iteration beside them: a
   request whose prompt merely happens to match is dropped). The scheduler's time per iteration, which vLLM's
   timer leaves out, is read between anchors with no idle period between them. Every other iteration is carried
   from the anchors before and after it through the elapsed times plus that scheduler time, waiting out the
   engine's idle periods (times when no request was between its first scheduling and its finish on the spans);
   a request's first scheduling or first token within a few ms of one placed iteration anchors it too;
4. a stall is an iteration with context tokens that delayed requests decoding beside it or waiting for it:
   its wall time (elapsed plus the scheduler's time) less the decode-only wall time of its generation requests
   (the median of the log's generation-only iterations of that size, interpolated; for a prefill-only
   iteration on an engine that makes decodes wait for prefills, the whole wall time and the decode-only time of
   the requests that were decoding then, from the spans) is at least `stall_ratio` times that decode-only time
   and at least `min_excess_ns`. On an engine that runs decodes beside prefills (the log has mixed iterations:
   vLLM V1), a prefill-only iteration stalls no one: a decoding request left out of it had been preempted;
5. its culprits are the requests whose prefill interval on the spans (first scheduling to first token) holds
   the iteration, within the placement's tolerance: scheduled before it began, first token not before it
   ended. A lone context request computes at most its whole prompt there, so a request whose prompt is smaller
   than the iteration's context tokens is not it (a preempted request's recompute: its prompt and the tokens it
   had generated). Candidates are ranked by how close their first token is to the end, and the named set is
   cut at `context_requests`; the confidence is 1 when the named requests' uncached prompt tokens can account
   for the iteration's context tokens, less when the candidates were more than the line's count or their
   tokens fall short.

Iterations with no context tokens that still ran long (host pauses) are stalls without a culprit, as is a stall
far longer than its context tokens can cost (four times the median excess per context token of the log's mixed
iterations, plus 20 ms: a host pause during a small chunk), and a recompute that no fresh prefill could have
shared.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from infertrace.analyzers.itl_requests import RequestCulprit, RequestOnlyAttribution, RequestOnlyParams, RequestStall
from infertrace.store.store import Store

QUARTER_HOUR_NS = 15 * 60 * 10**9


@dataclass(frozen=True)
class IterationParams:
    stall_ratio: float = 0.5
    min_excess_ns: int = 2_000_000
    match_window_ns: int = 3_000_000  # around the offset's peak: matches that refine it


@dataclass(frozen=True)
class IterationCulprit:
    request_id: str
    tenant: str | None
    uncached_tokens: int
    confidence: float


@dataclass(frozen=True)
class IterationStall:
    instance: str
    log: str
    iteration: int
    line: int
    end_ns: int  # estimated, on the spans' clock
    end_uncertainty_ns: int  # half the width of the bounds on the log's clock
    elapsed_ns: int
    decode_only_ns: int
    excess_ns: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    culprits: tuple[IterationCulprit, ...]


@dataclass(frozen=True)
class LogPlacement:
    log: str
    instance: str | None  # None: no instance of the store matches the log's name and several exist
    iterations: int
    offset_ns: int | None  # spans' clock − log's clock
    matched: int  # prefill iterations whose end met a first token within the match window
    prefill_iterations: int


@dataclass(frozen=True)
class IterationAttribution:
    params: IterationParams
    stalls: tuple[IterationStall, ...]
    logs: tuple[LogPlacement, ...]
    unexplained: int  # stalled iterations with no culprit named (no context tokens, or far beyond their cost)
    notes: tuple[str, ...] = field(default=())

    def pairs(self) -> list[tuple[str, int, str, float]]:
        """(instance, iteration end, culprit, confidence)."""
        return [(s.instance, s.end_ns, c.request_id, c.confidence) for s in self.stalls for c in s.culprits]


def _stamp_seconds(stamps: pd.Series, year: int) -> np.ndarray:
    """'MM-DD HH:MM:SS' as seconds since the epoch, read as UTC in `year` (the offset absorbs the time zone)."""
    parsed = pd.to_datetime(str(year) + "-" + stamps.astype(str), format="%Y-%m-%d %H:%M:%S", errors="coerce")
    seconds = (parsed - pd.Timestamp("1970-01-01")) // pd.Timedelta(seconds=1)
    return seconds.to_numpy(dtype="float64")


def log_clock_ends(log: pd.DataFrame, year: int) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration (rows in line order): estimated end on the log's clock and half the bounds' width, in ns."""
    elapsed = log["elapsed_ns"].to_numpy(dtype=np.int64)
    seconds = _stamp_seconds(log["stamp"], year)
    known = ~np.isnan(seconds)
    lo_stamp = np.where(known, np.nan_to_num(seconds).astype(np.int64) * 10**9, np.iinfo(np.int64).min // 2)
    hi_stamp = np.where(known, lo_stamp + 10**9 - 1, np.iinfo(np.int64).max // 2)
    n = len(elapsed)
    lo = np.empty(n, dtype=np.int64)
    hi = np.empty(n, dtype=np.int64)
    for i in range(n):
        lo[i] = lo_stamp[i] if i == 0 else max(lo_stamp[i], lo[i - 1] + elapsed[i])
    for i in range(n - 1, -1, -1):
        hi[i] = hi_stamp[i] if i == n - 1 else min(hi_stamp[i], hi[i + 1] - elapsed[i + 1])
    hi = np.maximum(hi, lo)
    return lo + (hi - lo) // 2, (hi - lo) // 2


def coarse_offset(ends: np.ndarray, first_tokens: np.ndarray) -> int:
    """The time zone: the spans' clock less the log's, to the nearest quarter hour."""
    return round((int(np.median(first_tokens)) - int(np.median(ends))) / QUARTER_HOUR_NS) * QUARTER_HOUR_NS


def anchor_iterations(log: pd.DataFrame, lo: np.ndarray, hi: np.ndarray, requests: pd.DataFrame,
                      slack_ns: int) -> dict[int, list[int]]:
    """Prefill iterations whose finishing prompt is recognised: iteration row → the request row whose first token
    (on the spans' clock, `lo`/`hi` already moved onto it) falls in its bounds and whose uncached prompt tokens
    are its context tokens, or the sum of a run of single-prefill iterations ending with it (a chunked prompt),
    or, when the span counts no cached tokens, a whole number of 16-token KV blocks more (a prefix-cache hit).
    The run's elapsed times must also fit the request's own prefill on its span (first scheduling to first token:
    at least their sum, less `slack_ns`, and at most 2 ms of scheduler time per iteration more): a count of
    tokens that fits by chance, or a chunk before the prompt's last, is one whole iteration or more off.
    Kept only when exactly one request fits and that request fits no other iteration."""
    first = requests["first_token_ns"].to_numpy(dtype=np.int64)
    order = np.argsort(first, kind="stable")
    first_sorted = first[order]
    cached = requests["cached_tokens"].to_numpy(dtype=np.float64)
    prompt = requests["input_tokens"].fillna(0).to_numpy(dtype=np.int64)
    uncached = prompt - np.nan_to_num(cached).astype(np.int64)
    known_cache = ~np.isnan(cached)
    scheduled = requests["scheduled_ns"].to_numpy(dtype=np.float64) if "scheduled_ns" in requests else \
        np.full(len(requests), np.nan)
    prefill = first - np.nan_to_num(scheduled, nan=0.0).astype(np.int64)
    known_prefill = ~np.isnan(scheduled)
    ctx_req = log["context_requests"].to_numpy()
    ctx_tok = log["context_tokens"].to_numpy(dtype=np.int64)
    elapsed = log["elapsed_ns"].to_numpy(dtype=np.int64)
    anchors: dict[int, list[int]] = {}
    for i in np.flatnonzero(ctx_req == 1).tolist():
        a = int(np.searchsorted(first_sorted, lo[i] - slack_ns, "left"))
        b = int(np.searchsorted(first_sorted, hi[i] + slack_ns, "right"))
        cand = order[a:b]
        target = np.where(known_cache[cand], uncached[cand], prompt[cand])
        # the runs of single-prefill iterations ending with this one (a chunked prompt's chunks): their tokens
        # and elapsed times, one column per run length
        run = ctx_req[max(i - 64, 0):i + 1][::-1] == 1
        length = int(np.argmin(run)) if not run.all() else len(run)
        sums = np.cumsum(ctx_tok[i - length + 1:i + 1][::-1])
        took = np.cumsum(elapsed[i - length + 1:i + 1][::-1])
        extra = target[:, None] - sums[None, :]
        tokens_fit = (extra == 0) | (~known_cache[cand][:, None] & (extra > 0) & (extra % 16 == 0))
        spent = prefill[cand][:, None]
        time_fit = ~known_prefill[cand][:, None] | (
            (spent >= took[None, :] - slack_ns)
            & (spent <= took[None, :] + 2_000_000 * np.arange(1, length + 1)[None, :] + slack_ns))
        fits = cand[(tokens_fit & time_fit).any(axis=1)]
        if len(fits) == 1:
            anchors[i] = [int(fits[0])]
    taken: dict[int, int] = {}
    for rows in anchors.values():
        taken[rows[0]] = taken.get(rows[0], 0) + 1
    return {i: rows for i, rows in anchors.items() if taken[rows[0]] == 1}  # a request anchors one iteration


def fine_offset(lo: np.ndarray, hi: np.ndarray, anchors: dict[int, list[int]], first: np.ndarray) -> int:
    """The offset (added to the log's clock) that puts the most anchored first tokens inside their iterations'
    bounds: each anchor allows [first − hi, first − lo]; the point covered by most of them, the middle of that
    segment."""
    events = []
    for i, rows in anchors.items():
        f = int(first[rows[0]])
        events += [(f - int(hi[i]), 0), (f - int(lo[i]), 1)]
    events.sort()
    best, depth, start, segment = -1, 0, 0, (0, 0)
    for x, kind in events:
        if kind == 0:
            depth += 1
            if depth > best:
                best, start = depth, x
                segment = (x, x)
        else:
            if depth == best and segment[0] == start:
                segment = (start, x)
            depth -= 1
    return (segment[0] + segment[1]) // 2


def _decode_levels(log: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    gen_only = log[(log["context_tokens"] == 0) & (log["generation_requests"] > 0) & ~log["dummy"]]
    levels = gen_only.groupby("generation_requests")["elapsed_ns"].median()
    return levels.index.to_numpy(dtype=np.float64), levels.to_numpy(dtype=np.float64)


@dataclass(frozen=True)
class PlacedLog:
    """One engine core's log and where its iterations end on the spans' clock."""

    placement: LogPlacement
    log: pd.DataFrame  # its lines, in order
    requests: pd.DataFrame  # its instance's requests with a first token
    ends: np.ndarray  # each iteration's end on the spans' clock
    half: np.ndarray  # half the width of each end's bounds on the log's clock
    overhead_ns: float  # the scheduler's time per iteration, which the elapsed times leave out
    anchors: dict[int, list[int]]  # iteration -> the rows of `requests` whose first token it produced


def place_logs(iterations: pd.DataFrame, requests: pd.DataFrame, params: IterationParams | None = None
               ) -> tuple[list[PlacedLog], list[LogPlacement], list[str]]:
    """Each log of `iterations` (the `iteration_log` relation) placed on the spans' clock by `requests`
    (request_id, instance, tenant, scheduled_ns, first_token_ns, finish_ns, input_tokens, cached_tokens, and any
    other column, kept): the logs placed, every log's placement (those that could not be placed too), and notes
    on those that could not."""
    p = params or IterationParams()
    notes: list[str] = []
    timed = requests.dropna(subset=["instance", "first_token_ns"])
    instances = sorted(set(timed["instance"].astype(str)))
    year = datetime.fromtimestamp(int(timed["first_token_ns"].median()) // 10**9, UTC).year if len(timed) else \
        datetime.now(UTC).year
    placed_logs: list[PlacedLog] = []
    logs: list[LogPlacement] = []
    for name, log in iterations.groupby("log", sort=True):
        log = log.sort_values("line", kind="stable").reset_index(drop=True)
        name = str(name)
        instance = name if name in instances else (instances[0] if len(instances) == 1 else None)
        ends, half = log_clock_ends(log, year)
        prefill_rows = (log["context_tokens"] > 0).to_numpy() & ~log["dummy"].to_numpy()
        if instance is None:
            notes.append(f"log {name}: no engine instance of the store is named so, and the store has "
                         f"{len(instances)}: name the log after its instance")
            logs.append(LogPlacement(name, None, len(log), None, 0, int(prefill_rows.sum())))
            continue
        mine = timed[timed["instance"].astype(str) == instance].reset_index(drop=True)
        first = mine["first_token_ns"].to_numpy(dtype=np.int64)
        lo, hi = ends - half, ends + half
        if not prefill_rows.any() or not len(first):
            notes.append(f"log {name}: no prefill iteration or no first token to place it by: not analysed")
            logs.append(LogPlacement(name, instance, len(log), None, 0, int(prefill_rows.sum())))
            continue
        coarse = coarse_offset(ends[prefill_rows], first)
        anchors = anchor_iterations(log, lo + coarse, hi + coarse, mine, p.match_window_ns)
        offset = coarse + fine_offset(lo + coarse, hi + coarse, anchors, first) if anchors else coarse
        logs.append(LogPlacement(name, instance, len(log), offset, len(anchors), int(prefill_rows.sum())))
        elapsed = log["elapsed_ns"].to_numpy(dtype=np.int64)
        idle = idle_periods(mine)
        slack = p.match_window_ns
        exact = {i: int(first[r[0]]) for i, r in anchors.items()}
        exact = consistent_anchors(elapsed, exact, scheduler_overhead(elapsed, exact, idle), idle, slack)
        anchors = {i: r for i, r in anchors.items() if i in exact}
        overhead = scheduler_overhead(elapsed, exact, idle)
        placed = place_ends(log, lo + offset, hi + offset, exact, overhead, idle, slack)
        scheduled = mine["scheduled_ns"].fillna(mine["first_token_ns"]).to_numpy(dtype=np.int64)
        more = timed_anchors(placed, elapsed, prefill_rows, first, scheduled, p.match_window_ns)
        kept = consistent_anchors(elapsed, {**more, **exact}, overhead, idle, slack)
        placed = place_ends(log, lo + offset, hi + offset, kept, overhead, idle, slack)
        placed_logs.append(PlacedLog(logs[-1], log, mine, placed, half, overhead, anchors))
    return placed_logs, logs, notes


def attribute_iterations(iterations: pd.DataFrame, requests: pd.DataFrame,
                         params: IterationParams | None = None) -> IterationAttribution:
    """`iterations`: the `iteration_log` relation; `requests`: request_id, instance, tenant, scheduled_ns,
    first_token_ns, finish_ns, input_tokens, cached_tokens."""
    p = params or IterationParams()
    if iterations.empty:
        return IterationAttribution(p, (), (), 0, ("no iteration log lines",))
    placed_logs, logs, notes = place_logs(iterations, requests, p)
    stalls: list[IterationStall] = []
    unexplained = 0
    for placed in placed_logs:
        found, without_culprit = _log_stalls(placed.placement.log, str(placed.placement.instance), placed.log,
                                             placed.ends, placed.half, placed.requests, placed.anchors,
                                             placed.overhead_ns, p)
        stalls += found
        unexplained += without_culprit
    stalls.sort(key=lambda s: (s.instance, s.end_ns))
    return IterationAttribution(p, tuple(stalls), tuple(logs), unexplained, tuple(notes))


def timed_anchors(placed: np.ndarray, elapsed: np.ndarray, prefill_rows: np.ndarray, first: np.ndarray,
                  scheduled: np.ndarray, window_ns: int) -> dict[int, int]:
    """More anchors once the log is placed: a request's first token that lies within `window_ns` of exactly one
    prefill iteration's placed end (the next nearest at least twice as far) marks that end; its first scheduling
    marks the start of the iteration that computed its first chunk (that end is then the scheduling plus the
    iteration's elapsed time). Spans alone say when a chunked prompt started and finished."""
    rows = np.flatnonzero(prefill_rows)
    out: dict[int, int] = {}
    if len(rows) < 2:
        return out
    for times, shift in ((first, np.zeros(len(elapsed), dtype=np.int64)), (scheduled, elapsed)):
        marks = placed[rows] - shift[rows]
        order = np.argsort(marks, kind="stable")
        found_rows, found = rows[order], marks[order]
        for t in times.tolist():
            k = int(np.searchsorted(found, t))
            near = sorted((abs(int(found[j]) - t), j) for j in (k - 2, k - 1, k, k + 1) if 0 <= j < len(found))
            if near and near[0][0] <= window_ns and (len(near) == 1 or near[1][0] >= 2 * max(near[0][0], 1)):
                row = int(found_rows[near[0][1]])
                out.setdefault(row, t + int(shift[row]))
    return out


def scheduler_overhead(elapsed: np.ndarray, anchored: dict[int, int], idle: tuple[np.ndarray, np.ndarray]) -> float:
    """The scheduler's own time per iteration, which the logged elapsed time leaves out: the median, over pairs of
    anchors up to 50 iterations apart with no idle period of the spans between them, of the time between them
    the elapsed times do not cover, per iteration (a wrong anchor falls outside 0-2 ms or in the median's
    tails)."""
    cum = np.cumsum(elapsed)
    keys = sorted(anchored)
    gaps = [((anchored[b] - anchored[a]) - int(cum[b] - cum[a])) / (b - a) for a, b in itertools.pairwise(keys)
            if 0 < b - a <= 50 and _idle_between(idle, anchored[a], anchored[b]) is None]
    busy = [g for g in gaps if 0 <= g <= 2_000_000]
    return float(np.median(busy)) if busy else 0.0


def idle_periods(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """When the engine was running no request (none between its first scheduling and its finish on the spans), as
    sorted (start, end) arrays: the only times it can have idled between iterations (a request waits unscheduled
    only while the engine is busy). The spans' times are late by the API server's output latency, a fraction of
    the slack the placement allows."""
    start = requests["scheduled_ns"].fillna(requests["first_token_ns"])
    finish = requests["finish_ns"].fillna(requests["first_token_ns"])
    order = np.argsort(start.to_numpy(dtype=np.int64), kind="stable")
    s, f = start.to_numpy(dtype=np.int64)[order], finish.to_numpy(dtype=np.int64)[order]
    if not len(s):
        return np.array([], dtype=np.int64), np.array([], dtype=np.int64)
    busy_until = np.maximum.accumulate(f)
    hole = np.flatnonzero(s[1:] > busy_until[:-1])
    return busy_until[hole], s[hole + 1]


def _idle_between(idle: tuple[np.ndarray, np.ndarray], t0: int, t1: int) -> tuple[int, int] | None:
    """The start of the first and the end of the last idle period wholly between t0 and t1, or None."""
    k0 = int(np.searchsorted(idle[0], t0, "left"))
    k1 = int(np.searchsorted(idle[1], t1, "right"))
    return (int(idle[0][k0]), int(idle[1][k1 - 1])) if k1 > k0 else None


def consistent_anchors(elapsed: np.ndarray, anchored: dict[int, int], overhead: float,
                       idle: tuple[np.ndarray, np.ndarray], slack_ns: int, lookback: int = 30) -> dict[int, int]:
    """The largest set of anchors that the log's own times agree with: between two kept anchors the elapsed times
    must fit (iterations do not overlap), and where the engine cannot have idled between them (it had requests
    throughout, by the spans: it steps again at once while any is running or waiting) the time between them is
    the elapsed times plus at most twice the median scheduler time per iteration. `slack_ns` allows for the
    anchors' own error (the spans' first token is late by the API server's output latency). A wrong anchor
    (another request whose prompt happens to fit the iteration's context tokens) breaks these bounds with its
    neighbours and is dropped."""
    keys = sorted(anchored)
    if len(keys) < 2:
        return dict(anchored)
    cum = np.r_[0, np.cumsum(elapsed)]  # cum[b + 1] − cum[a + 1]: elapsed of iterations a+1 … b
    best = [1] * len(keys)
    back = [-1] * len(keys)
    for k, b in enumerate(keys):
        for m in range(max(k - lookback, 0), k):
            a = keys[m]
            between = anchored[b] - anchored[a]
            work = int(cum[b + 1] - cum[a + 1])
            fits = between >= work - slack_ns
            if fits and _idle_between(idle, anchored[a], anchored[b]) is None:
                fits = between <= work + 2 * overhead * (b - a) + slack_ns
            if fits and best[m] + 1 > best[k]:
                best[k], back[k] = best[m] + 1, m
    k = int(np.argmax(best))
    kept: dict[int, int] = {}
    while k >= 0:
        kept[keys[k]] = anchored[keys[k]]
        k = back[k]
    return kept


def _carried_forward(end: int, steps: np.ndarray, idle: tuple[np.ndarray, np.ndarray], slack_ns: int) -> np.ndarray:
    """The ends of the iterations after one that ended at `end`, each `steps` long: an iteration that would run into
    an idle period of the spans (the engine had no request) began when it ended (a request arrived)."""
    starts, ends = idle
    k = int(np.searchsorted(ends, end - slack_ns, "right"))
    out = np.empty(len(steps), dtype=np.int64)
    pos = end
    for j, step in enumerate(steps.tolist()):
        while k < len(starts) and pos + step > int(starts[k]) + slack_ns:
            pos = max(pos, int(ends[k]))
            k += 1
        pos += step
        out[j] = pos
    return out


def _carried_back(end: int, steps: np.ndarray, idle: tuple[np.ndarray, np.ndarray], slack_ns: int) -> np.ndarray:
    """The ends of the iterations before one that ended at `end` (`steps`: theirs and its own lengths, in line
    order; the last is its own): an iteration that would have begun before an idle period of the spans ended
    was the first after it, and the one before it ended when the period began."""
    starts, ends = idle
    k = int(np.searchsorted(starts, end + slack_ns, "left")) - 1
    out = np.empty(len(steps) - 1, dtype=np.int64)
    pos = end
    for j in range(len(steps) - 1, 0, -1):
        pos -= int(steps[j])
        while k >= 0 and pos < int(ends[k]) - slack_ns:
            pos = min(pos, int(starts[k]))
            k -= 1
        out[j - 1] = pos
    return out


def place_ends(log: pd.DataFrame, lo: np.ndarray, hi: np.ndarray, anchored: dict[int, int], overhead: float,
               idle: tuple[np.ndarray, np.ndarray], slack_ns: int) -> np.ndarray:
    """Every iteration's end on the spans' clock: an anchored one at its request's first token; the others carried
    from the anchors around them through the elapsed times plus the scheduler's time per iteration (`overhead`),
    waiting out the idle periods of the spans (`idle_periods`), and held within their stamps' bounds. Between two
    anchors, where the two carries agree within `slack_ns` the time they leave over is spread evenly (the
    scheduler's time varies); where they do not (idle time the spans do not show), the nearer anchor's carry is
    kept. With no anchor, the bounds' midpoint."""
    n = len(log)
    step = log["elapsed_ns"].to_numpy(dtype=np.int64) + round(overhead)
    out = lo + (hi - lo) // 2
    keys = sorted(anchored)
    if not keys:
        return out
    first, last = keys[0], keys[-1]
    out[:first] = _carried_back(anchored[first], step[:first + 1], idle, slack_ns)
    out[last + 1:] = _carried_forward(anchored[last], step[last + 1:], idle, slack_ns)
    for a, b in itertools.pairwise(keys):
        if b - a < 2:
            continue
        fwd = _carried_forward(anchored[a], step[a + 1:b], idle, slack_ns)
        bwd = _carried_back(anchored[b], step[a + 1:b + 1], idle, slack_ns)
        i = np.arange(a + 1, b)
        spread = fwd + np.rint((bwd - fwd) * (i - a) / (b - a)).astype(np.int64)
        nearer = np.where(i - a <= b - i, fwd, bwd)
        out[a + 1:b] = np.where(np.abs(bwd - fwd) <= slack_ns, spread, nearer)
    for i, t in anchored.items():
        out[i] = t
    free = np.ones(n, dtype=bool)
    free[keys] = False
    out[free] = np.minimum(np.maximum(out[free], lo[free]), hi[free])
    return out


def _log_stalls(name: str, instance: str, log: pd.DataFrame, ends: np.ndarray, half: np.ndarray,
                requests: pd.DataFrame, anchors: dict[int, list[int]], overhead: float,
                p: IterationParams) -> tuple[list[IterationStall], int]:
    sizes, levels = _decode_levels(log)
    scheduler = round(overhead)

    def decode_only(n: int) -> int:
        """The wall time of a decode-only iteration of n requests: the log's elapsed time plus the scheduler's."""
        if not len(sizes) or n <= 0:
            return 0
        return round(float(np.interp(n, sizes, levels))) + scheduler

    first = requests["first_token_ns"].to_numpy(dtype=np.int64)
    sched = requests["scheduled_ns"].fillna(requests["first_token_ns"]).to_numpy(dtype=np.int64)
    finish = requests["finish_ns"].fillna(requests["first_token_ns"]).to_numpy(dtype=np.int64)
    ids = requests["request_id"].astype(str).to_numpy()
    tenants = requests["tenant"].to_numpy() if "tenant" in requests else np.full(len(ids), None)
    uncached = (requests["input_tokens"].fillna(0) - requests["cached_tokens"].fillna(0)).clip(lower=0).to_numpy(
        dtype=np.int64)
    tol = p.match_window_ns  # how far an iteration's placed end may be off
    # Whether the engine runs decodes in the same iterations as prefills (chunked, decode-first: vLLM V1's only
    # policy) or makes them wait (prefill-first): read from the log's own mix of iterations.
    real = log[~log["dummy"] & (log["context_tokens"] > 0)]
    shares_steps = int((real["generation_requests"] > 0).sum()) >= max(1, 0.05 * len(real))
    out: list[IterationStall] = []
    rows = log.to_dict("records")
    per_token: list[float] = []  # every mixed iteration's excess per context token: what a prompt token costs
    for i, row in enumerate(rows):
        if row["dummy"]:
            continue
        end, elapsed = int(ends[i]), int(row["elapsed_ns"])
        wall = elapsed + scheduler
        gen = int(row["generation_requests"])
        if gen and row["context_tokens"]:
            per_token.append(max(wall - decode_only(gen), 0) / row["context_tokens"])
        if row["context_tokens"] == 0:
            base = decode_only(gen)
            if gen and wall - base >= max(p.stall_ratio * base, p.min_excess_ns):
                out.append(IterationStall(instance, name, int(row["iteration"]), int(row["line"]), end, int(half[i]),
                                          elapsed, base, wall - base, 0, 0, gen, ()))
            continue
        if gen:
            base = decode_only(gen)
            excess = wall - base
        elif shares_steps:
            continue  # decodes run beside prefills here: one not in this iteration was preempted, not waiting
        else:
            edge = 1_000_000  # the spans' first tokens and finishes are late by the API server's output latency
            waiting = int(((first <= end - elapsed + edge) & (first < end - edge) & (finish > end + edge)).sum())
            if not waiting:
                continue
            base, excess = decode_only(waiting), wall  # the waiting decodes lose the whole step
        if excess < max(p.stall_ratio * base, p.min_excess_ns):
            continue
        if i in anchors:
            named = np.array(anchors[i])
            confidence = 1.0
        else:
            # a request in the iteration was scheduled before it began and had no first token before it ended;
            # the one context request of an iteration computes at most its whole prompt there (more is a
            # preempted request's recompute: its prompt and the tokens it had generated)
            held = np.flatnonzero((sched <= end - elapsed + tol) & (first >= end - tol))
            if int(row["context_requests"]) == 1:
                held = held[uncached[held] >= int(row["context_tokens"])]
            held = held[np.argsort(np.abs(first[held] - end), kind="stable")]
            named = held[:int(row["context_requests"])]
            cover = min(1.0, int(uncached[named].sum()) / row["context_tokens"]) if row["context_tokens"] else 1.0
            confidence = cover * (len(named) / len(held)) if len(held) else 0.0
        culprits = tuple(IterationCulprit(str(ids[j]), tenants[j], int(uncached[j]), round(confidence, 4))
                         for j in named)
        out.append(IterationStall(instance, name, int(row["iteration"]), int(row["line"]), end, int(half[i]), elapsed,
                                  base, excess, int(row["context_requests"]), int(row["context_tokens"]), gen,
                                  culprits))
    out = _implausible_cleared(out, per_token)
    return out, sum(1 for s in out if not s.culprits)


def _implausible_cleared(stalls: list[IterationStall], per_token: list[float],
                         factor: float = 4.0) -> list[IterationStall]:
    """A stall far longer than its context tokens can cost (the median excess per context token of the log's
    mixed iterations, stalled or not, `factor` times over, plus 20 ms) had another cause too, e.g. a host pause
    during a small chunk: its prefills are not named. (The rate is read from every mixed iteration: on a
    stall-free engine too few iterations stall to read it from the stalls alone.)"""
    if len(per_token) < 5:
        return stalls
    rate = float(np.median(per_token))
    return [replace(s, culprits=()) if s.culprits and s.excess_ns > factor * rate * s.context_tokens + 2 * 10**7
            else s for s in stalls]


def attribute_store_iterations(store: Store, params: IterationParams | None = None) -> IterationAttribution:
    iterations = store.sql("SELECT * FROM iteration_log").df()
    requests = store.sql("SELECT request_id, instance, tenant, scheduled_ns, first_token_ns, finish_ns, input_tokens, "
                         "cached_tokens FROM requests").df()
    return attribute_iterations(iterations, requests, params)


def as_windows(attr: IterationAttribution, half_width_ns: int = 5_000_000) -> RequestOnlyAttribution:
    """The iteration stalls as request-only stall windows (end ± `half_width_ns`), for scoring and for joining."""
    stalls = tuple(RequestStall(s.instance, s.end_ns - half_width_ns, s.end_ns + half_width_ns, (), s.elapsed_ns,
                                s.excess_ns, tuple(RequestCulprit(c.request_id, c.tenant, c.uncached_tokens,
                                                                  c.confidence, True) for c in s.culprits))
                   for s in attr.stalls)
    return RequestOnlyAttribution(RequestOnlyParams(attr.params.stall_ratio, attr.params.min_excess_ns), stalls,
                                  len(stalls), 0, "iteration log", notes=attr.notes)


def join_iterations(windows: RequestOnlyAttribution, attr: IterationAttribution,
                    tolerance_ns: int = 5_000_000) -> RequestOnlyAttribution:
    """The iteration log's stalls (placed within a millisecond, culprits named by their context tokens) as
    windows, and the token-time windows that hold no iteration the log placed (a stall the log's decode-only
    levels missed): where both saw the stall, the log's names are kept."""
    iterations = as_windows(attr, tolerance_ns)
    by_instance: dict[str, np.ndarray] = {}
    for s in attr.stalls:
        by_instance.setdefault(s.instance, np.array([], dtype=np.int64))
    for inst in by_instance:
        by_instance[inst] = np.array(sorted(s.end_ns for s in attr.stalls if s.instance == inst), dtype=np.int64)
    kept = []
    for w in windows.stalls:
        e = by_instance.get(w.instance, np.array([], dtype=np.int64))
        a = int(np.searchsorted(e, w.start_ns - tolerance_ns, "left"))
        b = int(np.searchsorted(e, w.end_ns + tolerance_ns, "right"))
        if a == b:
            kept.append(w)
    stalls = tuple(sorted([*iterations.stalls, *kept], key=lambda s: (s.instance, s.start_ns, s.end_ns)))
    return replace(windows, stalls=stalls, clock=f"{windows.clock} + iteration log",
                   notes=(*windows.notes, *attr.notes))
