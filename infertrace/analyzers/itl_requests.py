"""ITL spikes attributed to colliding prefills from request-level data only: no engine step spans.

What vLLM gives without extra instrumentation is one `llm_request` span per request (arrival, first
scheduling, first token, finish; the `gen_ai.latency.*` attributes), and, where a client streamed the reply,
the time of each token; or vLLM's iteration log lines (`Iteration(N): … context tokens, … generation
tokens, iteration elapsed time: X ms`). From those:

1. a victim's spike is a gap between two of its tokens that exceeds its own median ITL by at least
   `stall_ratio` times that median and at least `min_excess_ns`;
2. the victims' gaps on one engine instance that overlap are merged into one stall window (their
   intersection: the stall lies in every victim's gap);
3. the culprits are the other requests on that instance whose prefill interval (first scheduling to first
   token) overlaps the window. Each carries a confidence: its share of the prefill work estimated to fall
   in the window (uncached prompt tokens spread evenly over its prefill interval), so a single prefill
   contained in the window has confidence 1 and a long chunked prefill overlapping it among others less;
4. a prefill is cleared when a request decoding on that instance received two consecutive tokens at its
   normal pace while that prefill was running, before its last step (a whole non-spike gap inside its
   prefill interval, ending before its first token): its full chunks demonstrably did not stall the
   decodes beside them, so a spike during it has another cause (with chunked prefill under a small
   budget, a host pause or a preemption would otherwise always find a prefill to blame). The last step
   is excluded: a prefill's final chunk is usually smaller than the others, so a normal gap there proves
   nothing about the rest.

Without step spans a preemption's recompute and a host pause look alike (no request was prefilling): the
window is then reported with no culprit (`unexplained`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pandas as pd

from infertrace.store.store import Store


@dataclass(frozen=True)
class RequestOnlyParams:
    stall_ratio: float = 0.5
    min_excess_ns: int = 2_000_000
    min_confidence: float = 0.0  # attributions below it are dropped


@dataclass(frozen=True)
class RequestCulprit:
    request_id: str
    tenant: str | None
    uncached_tokens: int
    confidence: float  # share of the window's estimated prefill work
    contained: bool  # its whole prefill interval lies inside the window


@dataclass(frozen=True)
class RequestStall:
    """A window on one instance in which several (or one) decoding requests' gaps overlapped."""

    instance: str
    start_ns: int  # the window: the intersection of the victims' gaps
    end_ns: int
    victims: tuple[str, ...]
    worst_itl_ns: int
    excess_ns: int  # the largest victim excess over its own median ITL
    culprits: tuple[RequestCulprit, ...]


@dataclass(frozen=True)
class RequestOnlyAttribution:
    params: RequestOnlyParams
    stalls: tuple[RequestStall, ...]
    spikes: int  # victim gaps that were spikes
    requests_with_token_times: int

    def pairs(self) -> list[tuple[str, int, int, str, float]]:
        """(instance, window start, window end, culprit, confidence)."""
        return [(s.instance, s.start_ns, s.end_ns, c.request_id, c.confidence) for s in self.stalls
                for c in s.culprits]


# ---------------------------------------------------------------------------------- the attribution
def attribute_from_requests(requests: pd.DataFrame, token_times: pd.DataFrame,
                            params: RequestOnlyParams | None = None) -> RequestOnlyAttribution:
    """`requests`: request_id, instance, tenant, scheduled_ns, first_token_ns, input_tokens, cached_tokens
    (the `requests` relation has them; with disaggregation a request has one row per worker). `token_times`:
    request_id, time_ns (and instance, when known), one row per token as a streaming client recorded them."""
    p = params or RequestOnlyParams()
    if "instance" not in token_times:  # one engine request span per request: its instance
        where = requests.drop_duplicates("request_id", keep="last").set_index("request_id")["instance"]
        token_times = token_times.assign(instance=where.reindex(token_times["request_id"]).to_numpy())
    tok = token_times[["request_id", "instance", "time_ns"]].dropna(subset=["instance"]).sort_values(
        ["request_id", "time_ns"], kind="stable")
    rid = tok["request_id"].to_numpy()
    inst = tok["instance"].to_numpy()
    t = tok["time_ns"].to_numpy(dtype=np.int64)
    same = np.r_[False, (rid[1:] == rid[:-1]) & (inst[1:] == inst[:-1])]
    itl = np.where(same, t - np.r_[0, t[:-1]], -1)
    gaps = pd.DataFrame({"request_id": rid[same], "instance": inst[same], "start_ns": t[np.r_[same[1:], False]],
                         "end_ns": t[same], "itl_ns": itl[same]})
    if gaps.empty:
        return RequestOnlyAttribution(p, (), 0, int(tok["request_id"].nunique()))
    median = gaps.groupby("request_id")["itl_ns"].transform("median").to_numpy(dtype=np.float64)
    excess = gaps["itl_ns"].to_numpy() - median
    is_spike = excess >= np.maximum(p.stall_ratio * median, p.min_excess_ns)
    spikes = gaps[is_spike].copy()
    spikes["excess_ns"] = excess[is_spike]
    spikes = spikes.sort_values(["instance", "start_ns", "end_ns"])

    stalls: list[RequestStall] = []
    prefill = requests.dropna(subset=["scheduled_ns", "first_token_ns"])
    by_instance = {str(k): _Candidates(v) for k, v in prefill.groupby("instance")}
    normal = _NormalGaps(gaps[~is_spike])
    for instance, rows in spikes.groupby("instance", sort=True):
        cands = by_instance.get(str(instance))
        for window in _windows(rows):
            stalls.append(_attribute(str(instance), window, cands, normal, p))
    return RequestOnlyAttribution(p, tuple(stalls), len(spikes), int(tok["request_id"].nunique()))


def _windows(rows: pd.DataFrame) -> Iterable[tuple[int, int, list[str], int, int]]:
    """Groups of spikes whose gaps share a common interval (greedy, in start order): (window start, end,
    victims, worst ITL, largest excess)."""
    starts = rows["start_ns"].to_numpy()
    ends = rows["end_ns"].to_numpy()
    ids = rows["request_id"].to_numpy()
    itls = rows["itl_ns"].to_numpy()
    excess = rows["excess_ns"].to_numpy()
    begin, lo, hi = 0, 0, 0
    for i in range(len(rows) + 1):
        if i < len(rows) and i > begin and starts[i] < hi and max(lo, starts[i]) < min(hi, ends[i]):
            lo, hi = max(lo, starts[i]), min(hi, ends[i])
            continue
        if i > begin:
            yield int(lo), int(hi), list(ids[begin:i]), int(itls[begin:i].max()), int(excess[begin:i].max())
        if i < len(rows):
            begin, lo, hi = i, starts[i], ends[i]


class _Candidates:
    """One instance's prefill intervals, sorted by first scheduling."""

    def __init__(self, rows: pd.DataFrame) -> None:
        rows = rows.sort_values("scheduled_ns")
        self.ids = rows["request_id"].to_numpy()
        self.tenants = rows["tenant"].to_numpy() if "tenant" in rows else np.full(len(rows), None)
        self.start = rows["scheduled_ns"].to_numpy(dtype=np.int64)
        self.end = rows["first_token_ns"].to_numpy(dtype=np.int64)
        self.uncached = (rows["input_tokens"].fillna(0) - rows["cached_tokens"].fillna(0)).clip(lower=1).to_numpy(
            dtype=np.float64)
        self.longest = int((self.end - self.start).max()) if len(rows) else 0


class _NormalGaps:
    """Per instance, every request's gaps between two tokens that were not spikes, sorted by start, with the
    earliest end among the gaps from each one on (a suffix minimum)."""

    def __init__(self, gaps: pd.DataFrame) -> None:
        self.by_instance: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for instance, rows in gaps.groupby("instance", sort=False):
            order = np.argsort(rows["start_ns"].to_numpy(), kind="stable")
            ends = rows["end_ns"].to_numpy()[order]
            self.by_instance[str(instance)] = (rows["start_ns"].to_numpy()[order],
                                               np.minimum.accumulate(ends[::-1])[::-1])

    def any_inside(self, instance: str, start: int, end: int) -> bool:
        """Whether a request on the instance had a whole normal gap starting at or after `start` and ending
        before `end`."""
        found = self.by_instance.get(instance)
        if found is None:
            return False
        starts, earliest_end = found
        k = int(np.searchsorted(starts, start, side="left"))
        return k < len(starts) and bool(earliest_end[k] < end)


def _attribute(instance: str, window: tuple[int, int, list[str], int, int], cands: _Candidates | None,
               normal: _NormalGaps, p: RequestOnlyParams) -> RequestStall:
    lo, hi, victim_list, worst, excess = window
    victims = tuple(sorted(set(victim_list)))
    culprits: list[RequestCulprit] = []
    if cands is not None and len(cands.ids):
        a = int(np.searchsorted(cands.start, lo - cands.longest, side="left"))
        b = int(np.searchsorted(cands.start, hi, side="left"))
        idx = np.arange(a, b)
        idx = idx[(cands.end[idx] > lo) & ~np.isin(cands.ids[idx], victims)]
        idx = idx[[not normal.any_inside(instance, int(cands.start[j]), int(cands.end[j])) for j in idx]]
        if len(idx):
            s, f = cands.start[idx], cands.end[idx]
            overlap = (np.minimum(f, hi) - np.maximum(s, lo)).astype(np.float64)
            work = cands.uncached[idx] * overlap / np.maximum(f - s, 1).astype(np.float64)
            share = work / work.sum() if work.sum() > 0 else np.full(len(idx), 1 / len(idx))
            for j, sh, x, y in zip(idx, share, s, f, strict=True):
                if sh >= p.min_confidence:
                    culprits.append(RequestCulprit(str(cands.ids[j]), cands.tenants[j], int(cands.uncached[j]),
                                                   float(sh), bool(x >= lo and y <= hi)))
    culprits.sort(key=lambda c: -c.confidence)
    return RequestStall(instance, lo, hi, victims, worst, excess, tuple(culprits))


def attribute_store_requests(store: Store, params: RequestOnlyParams | None = None) -> RequestOnlyAttribution:
    """The request-only attribution on a store: `llm_request` spans for the requests and, standing in for a
    streaming client's records, the token times of the `tokens` relation (no step membership is used)."""
    requests = store.sql("SELECT request_id, instance, tenant, scheduled_ns, first_token_ns, input_tokens, "
                         "cached_tokens FROM requests WHERE instance IS NOT NULL").df()
    tokens = store.sql("SELECT request_id, instance, time_ns FROM tokens").df()
    return attribute_from_requests(requests, tokens, params)


# ------------------------------------------------------------------------------- vLLM iteration logs
ITERATION_LINE = re.compile(
    r"(?:(?P<level>[A-Z]+)\s+(?P<date>\d{2}-\d{2})\s+(?P<time>\d{2}:\d{2}:\d{2}(?:\.\d+)?)\s.*?)?"
    r"Iteration\((?P<iteration>\d+)\):\s+"
    r"(?P<ctx_req>\d+)\s+context requests,\s+(?P<ctx_tok>\d+)\s+context tokens,\s+"
    r"(?P<gen_req>\d+)\s+generation requests,\s+(?P<gen_tok>\d+)\s+generation tokens,\s+"
    r"iteration elapsed time:\s+(?P<elapsed>[0-9.]+)\s*ms")


@dataclass(frozen=True)
class Iteration:
    iteration: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_ns: int
    logged_at: str | None  # the log line's own timestamp (vLLM: MM-DD HH:MM:SS), when present


def parse_iteration_log(lines: Iterable[str]) -> list[Iteration]:
    """vLLM's per-iteration log lines; other lines are skipped."""
    out = []
    for line in lines:
        m = ITERATION_LINE.search(line)
        if m is None:
            continue
        stamp = f"{m['date']} {m['time']}" if m["date"] else None
        out.append(Iteration(int(m["iteration"]), int(m["ctx_req"]), int(m["ctx_tok"]), int(m["gen_req"]),
                             int(m["gen_tok"]), round(float(m["elapsed"]) * 1e6), stamp))
    return out


def iteration_spikes(iterations: list[Iteration], params: RequestOnlyParams | None = None,
                     year: int | None = None) -> pd.DataFrame:
    """The iterations that stalled their generation requests: elapsed time above the median of
    generation-only iterations with the same number of generation requests (nearest such, else all), by
    the stall threshold, with context tokens in them. End times are the log timestamp of the first line
    plus the cumulative elapsed time (vLLM's stamps have whole seconds: the offset is within a second).
    Columns: iteration, end_ns, elapsed_ns, context_tokens, generation_requests, decode_only_ns,
    excess_ns."""
    p = params or RequestOnlyParams()
    if not iterations:
        return pd.DataFrame(columns=["iteration", "end_ns", "elapsed_ns", "context_tokens", "generation_requests",
                                     "decode_only_ns", "excess_ns"])
    df = pd.DataFrame([vars(i) for i in iterations])
    anchor = 0
    if df["logged_at"].iloc[0]:
        stamp = datetime.strptime(f"{year or datetime.now().year}-{df['logged_at'].iloc[0]}".split(".")[0],
                                  "%Y-%m-%d %H:%M:%S")
        anchor = int(stamp.timestamp()) * 10**9
    df["end_ns"] = anchor + df["elapsed_ns"].cumsum()
    gen_only = df[(df["context_tokens"] == 0) & (df["generation_requests"] > 0)]
    levels = gen_only.groupby("generation_requests")["elapsed_ns"].median()
    if levels.empty:
        base = np.zeros(len(df))
    else:
        base = np.interp(df["generation_requests"], levels.index.to_numpy(), levels.to_numpy())
    df["decode_only_ns"] = np.rint(base).astype(np.int64)
    df["excess_ns"] = df["elapsed_ns"] - np.where(df["generation_requests"] > 0, df["decode_only_ns"], 0)
    stalled = (df["context_tokens"] > 0) & (df["generation_requests"] > 0) & (
        df["excess_ns"] >= np.maximum(p.stall_ratio * df["decode_only_ns"], p.min_excess_ns))
    return df.loc[stalled, ["iteration", "end_ns", "elapsed_ns", "context_tokens", "generation_requests",
                            "decode_only_ns", "excess_ns"]].reset_index(drop=True)
