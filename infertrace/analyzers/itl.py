"""ITL spikes attributed to the prefills that collided with them, from `engine_step` spans.

In a continuous-batching engine a decoding request gets one token per step, so its inter-token latency is
the time of the steps between two of its tokens. When a step computes a prefill chunk next to the decodes
(or, under prefill-first scheduling, a prefill-only step runs while they wait), that step is longer than
the decode-only step the victims would otherwise have had. Per engine:

1. the decode-only step cost is fitted to the engine's own decode-only steps,
   `duration ≈ f(num_decodes) + c·context_tokens` (a free level per batch size, one slope for context),
   and scaled by the nearest decode-only steps in time, so an engine that slowed down as a whole is not
   read as a spike;
2. every step with a prefill chunk or a host pause is a candidate; its victims are the requests whose gap
   between two tokens contains it; its excess is its duration less any pause and, when the victims decoded
   in it, less their predicted decode-only step;
3. a step stalls its victims when the excess is at least `stall_ratio` times their decode-only step and
   at least `min_excess_ns` (the ground truth's definition, `reference_engine/ground_truth.py`); the excess
   is split over its prefill chunks in proportion to their estimated cost (a per-engine fit of excess
   against chunk tokens and attention pairs); chunks that recompute a preempted request are labelled
   `recompute`, a pause at least as large as the threshold `host_pause`;
4. decode-only steps that exceed their local prediction by the same threshold are counted as
   `unexplained` spikes.

`analyze_itl(store)` returns an `ItlAnalysis`: the stalls (with culprits and victims), per-culprit and
per-victim summaries, and per engine the ITL p50/p99, the share of tokens at or above p99 that a prefill
collision caused, p99 without those collisions, and what a prefill chunk budget would bound it to.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc
from scipy.optimize import nnls

from infertrace.analyzers import materialize_once, query_text
from infertrace.store.store import Store

CAUSES = ("prefill", "recompute", "host_pause")


@dataclass(frozen=True)
class ItlParams:
    stall_ratio: float = 0.5  # a stall adds at least this fraction of the victims' decode-only step...
    min_excess_ns: int = 2_000_000  # ...and at least this much
    max_gap_steps: int = 4096  # longer gaps between two tokens are not expanded into steps
    chunk_budget_tokens: int = 512  # the counterfactual prefill chunk budget in the engine summaries


@dataclass(frozen=True)
class DecodeStepModel:
    """An engine's decode-only step cost: `level(num_decodes) + ns_per_context_token · context_tokens`."""

    instance: str
    batch_sizes: tuple[int, ...]  # the batch sizes the levels were measured at
    levels_ns: tuple[float, ...]
    ns_per_context_token: float
    steps: int  # decode-only runs it was fitted on
    median_abs_error: float  # relative, on those runs

    def predict(self, num_decodes: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
        level = np.interp(num_decodes, self.batch_sizes, self.levels_ns)
        return level + self.ns_per_context_token * context_tokens


@dataclass(frozen=True)
class ChunkCulprit:
    request_id: str
    tenant: str | None
    chunk_tokens: int
    computed_tokens: int  # already in the KV cache before the chunk
    recompute: bool  # the chunk recomputed a request that had been preempted
    share: float  # of the step's excess
    excess_ns: int  # share · the step's excess


@dataclass(frozen=True)
class Stall:
    """One step that stalled the decoding requests of its engine."""

    instance: str
    model: str | None
    policy: str | None
    step_index: int
    start_ns: int
    end_ns: int
    duration_ns: int
    decode_only_ns: int  # the victims' predicted decode-only step
    excess_ns: int  # what the prefills added (duration − pause − decode-only step when the victims decoded in it)
    pause_ns: int
    threshold_ns: int
    causes: tuple[str, ...]
    culprits: tuple[ChunkCulprit, ...]
    victims: tuple[str, ...]
    victim_itls_ns: tuple[int, ...]  # each victim's ITL across the step

    @property
    def added_ns(self) -> int:
        """What the stall added to each victim's ITL: the prefills' excess and the pause."""
        return self.excess_ns * bool(self.culprits) + self.pause_ns * ("host_pause" in self.causes)


@dataclass(frozen=True)
class CulpritSummary:
    request_id: str
    tenant: str | None
    instance: str
    prompt_tokens: int | None
    cached_tokens: int | None
    chunk_tokens: int  # computed in stalling steps
    stalls: int
    victims: int  # distinct requests stalled
    stall_ns: int  # Σ share of the steps' excess: engine time the prefill added
    victim_stall_ns: int  # Σ over victims: total delay handed out to decoding requests
    recompute: bool


@dataclass(frozen=True)
class VictimSummary:
    request_id: str
    instance: str
    stalls: int
    worst_itl_ns: int
    added_ns: int  # Σ of the stalls' added time
    top_culprit: str | None  # the culprit that added the most to this request


@dataclass(frozen=True)
class EngineItl:
    instance: str
    model: str | None
    policy: str | None
    tokens: int  # tokens with an ITL
    itl_p50_ns: int
    itl_p99_ns: int
    decode_step_p50_ns: int
    stalls: dict[str, int]  # per cause
    unexplained_spikes: int
    prefill_share_of_p99: float  # of tokens with ITL ≥ p99, the share a prefill collision stalled
    itl_p99_without_prefill_ns: int  # p99 with every prefill collision's excess removed
    chunk_budget_tokens: int
    itl_p99_with_chunk_budget_ns: int  # p99 if no step's prefill excess exceeded one chunk of that budget
    decode_model: DecodeStepModel | None


@dataclass(frozen=True)
class ItlAnalysis:
    params: ItlParams
    engines: tuple[EngineItl, ...]
    stalls: tuple[Stall, ...]
    culprits: tuple[CulpritSummary, ...]  # by victim_stall_ns, largest first
    victims: tuple[VictimSummary, ...]  # by added_ns, largest first
    unexplained: tuple[tuple[str, int], ...] = field(default=())  # (instance, end_ns) of unexplained spikes

    def pairs(self, include_recompute: bool = False) -> set[tuple[str, int, str]]:
        """(instance, step index, culprit request) for every stall attributed to a prefill."""
        return {(s.instance, s.step_index, c.request_id) for s in self.stalls for c in s.culprits
                if include_recompute or not c.recompute}


# ------------------------------------------------------------------------------------------ fitting
def fit_decode_model(instance: str, num_decodes: np.ndarray, context: np.ndarray,
                     duration: np.ndarray) -> DecodeStepModel | None:
    """Fixed effects per batch size, one slope for context; outliers (beyond 5 MADs) dropped once."""
    if len(duration) == 0:
        return None
    n = num_decodes.astype(np.int64)
    ctx = context.astype(np.float64)
    dur = duration.astype(np.float64)
    keep = np.ones(len(dur), dtype=bool)
    slope = 0.0
    for _ in range(2):
        _, inverse = np.unique(n[keep], return_inverse=True)
        counts = np.bincount(inverse)
        mean_ctx = np.bincount(inverse, ctx[keep]) / counts
        mean_dur = np.bincount(inverse, dur[keep]) / counts
        dx = ctx[keep] - mean_ctx[inverse]
        dy = dur[keep] - mean_dur[inverse]
        denom = float(dx @ dx)
        slope = max(float(dx @ dy) / denom, 0.0) if denom > 0 else 0.0
        levels = pd.Series(dur[keep] - slope * ctx[keep]).groupby(n[keep]).median()
        pred = np.interp(n, levels.index.to_numpy(), levels.to_numpy()) + slope * ctx
        resid = dur - pred
        mad = float(np.median(np.abs(resid[keep]))) * 1.4826
        new_keep = np.abs(resid) <= max(5 * mad, 1e-3 * float(np.median(dur)))
        if new_keep.sum() < 3 or (new_keep == keep).all():
            break
        keep = new_keep
    levels = pd.Series(dur[keep] - slope * ctx[keep]).groupby(n[keep]).median()
    pred = np.interp(n, levels.index.to_numpy(), levels.to_numpy()) + slope * ctx
    rel = float(np.median(np.abs(dur - pred) / np.maximum(dur, 1.0)))
    return DecodeStepModel(instance, tuple(int(x) for x in levels.index), tuple(float(x) for x in levels),
                           slope, len(dur), rel)


def _local_scale(times: np.ndarray, ratios: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Median ratio (measured / predicted) of the two decode-only runs before and the two after each time."""
    if len(times) == 0:
        return np.ones(len(at))
    idx = np.searchsorted(times, at)
    picks = np.stack([np.clip(idx + k, 0, len(times) - 1) for k in (-2, -1, 0, 1)], axis=1)
    return np.median(ratios[picks], axis=1)


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> int:
    """The smallest value whose cumulative weight (over distinct values, in order) reaches q of the total."""
    if len(values) == 0:
        return 0
    order = np.argsort(values, kind="stable")  # near-linear on the concatenation of a few sorted runs
    ordered = values[order]
    last = np.flatnonzero(np.append(ordered[1:] != ordered[:-1], True))  # last element of each distinct value
    cum = np.cumsum(weights[order])[last]  # integer-valued weights: the same sums as per distinct value first
    if cum[-1] <= 0:
        return 0
    return int(ordered[last[min(int(np.searchsorted(cum, q * cum[-1], side="left")), len(last) - 1)]])


def _counterfactual_p99(values: np.ndarray, weights: np.ndarray, olds: np.ndarray, cuts: np.ndarray) -> int:
    """p99 of the ITLs with each listed token's ITL (`olds`, one (victim, ITL) token each) reduced by its cut."""
    olds = olds.astype(np.int64)
    news = olds - cuts.astype(np.int64)
    return _weighted_quantile(np.concatenate([values, np.sort(olds), np.sort(news)]),
                              np.concatenate([weights, -np.ones(len(olds)), np.ones(len(news))]), 0.99)


def _chunk_cost_fit(excess: np.ndarray, tokens: np.ndarray, pairs: np.ndarray) -> tuple[float, float, float]:
    """excess ≈ α + β·tokens + γ·attention pairs, non-negative, on single-prefill steps."""
    if len(excess) < 3:
        return 0.0, 0.0, 0.0
    scale = np.array([1.0, max(float(tokens.max()), 1.0), max(float(pairs.max()), 1.0)])
    design = np.column_stack([np.ones(len(tokens)), tokens, pairs]) / scale
    coef, _ = nnls(design, excess.astype(np.float64))
    alpha, beta, gamma = coef / scale
    return float(alpha), float(beta), float(gamma)


# ----------------------------------------------------------------------------------------- analysis
def _register(store: Store) -> None:
    materialize_once(store, ("steps", "step_membership", "requests"))
    store.con.execute(f"CREATE OR REPLACE TEMP TABLE itl_token_gaps AS {query_text('itl_token_gaps')}")


def analyze_itl(store: Store, params: ItlParams | None = None) -> ItlAnalysis:
    """ITL spikes and their causes on every engine in the store."""
    p = params or ItlParams()
    _register(store)
    decode = store.sql(query_text("itl_decode_steps")).df()
    cand = store.sql(query_text("itl_stall_candidates"), {"max_gap_steps": p.max_gap_steps}).df()
    itls = _itl_distributions(store)

    models: dict[str, DecodeStepModel] = {}
    local: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    unexplained: list[tuple[str, int]] = []
    for instance, rows in decode.groupby("instance", sort=True):
        m = fit_decode_model(str(instance), rows["num_decodes"].to_numpy(), rows["decode_context_tokens"].to_numpy(),
                             rows["duration_ns"].to_numpy())
        if m is None:
            continue
        models[str(instance)] = m
        times = rows["end_ns"].to_numpy()
        pred = m.predict(rows["num_decodes"].to_numpy(), rows["decode_context_tokens"].to_numpy())
        ratios = rows["duration_ns"].to_numpy() / np.maximum(pred, 1.0)
        local[str(instance)] = (times, ratios)
        # Unexplained spikes: a decode-only run whose first step exceeds the prediction scaled by its
        # neighbours (not itself) by the stall threshold.
        if len(times) >= 5:
            neigh = np.stack([ratios[np.clip(np.arange(len(times)) + k, 0, len(times) - 1)] for k in (-2, -1, 1, 2)],
                             axis=1)
            expected = pred * np.median(neigh, axis=1)
            excess = rows["duration_ns"].to_numpy() - expected
            spikes = excess >= np.maximum(p.stall_ratio * expected, p.min_excess_ns)
            unexplained += [(str(instance), int(t)) for t in times[spikes]]

    stalls = _stalls(store, cand, models, local, p)
    return _summaries(store, p, stalls, itls, cand, models, unexplained)


def _stalls(store: Store, cand: pd.DataFrame, models: dict[str, DecodeStepModel],
            local: dict[str, tuple[np.ndarray, np.ndarray]], p: ItlParams) -> list[dict[str, Any]]:
    if cand.empty:
        return []
    cand = cand.copy()
    n_victims = cand["victims"].map(len).to_numpy()
    mixed = cand["num_decodes"].to_numpy() > 0
    num = np.where(mixed, cand["num_decodes"].to_numpy(), n_victims)
    ctx = np.where(mixed, cand["decode_context_tokens"].fillna(0).to_numpy(), cand["victim_context_tokens"].to_numpy())
    decode_only = np.zeros(len(cand))
    for instance, idx in cand.groupby("instance").indices.items():
        m = models.get(str(instance))
        if m is None:
            continue
        times, ratios = local[str(instance)]
        scale = _local_scale(times, ratios, cand["start_ns"].to_numpy()[idx])
        decode_only[idx] = m.predict(num[idx], ctx[idx]) * scale
    decode_only = np.where(num > 0, decode_only, 0.0)
    pause = cand["pause_ns"].to_numpy()
    duration = cand["duration_ns"].to_numpy()
    excess = duration - pause - np.where(mixed, decode_only, 0.0)
    threshold = np.maximum(p.stall_ratio * decode_only, p.min_excess_ns)
    has_victims = n_victims > 0
    prefill_stall = has_victims & (cand["num_prefills"].to_numpy() > 0) & (excess >= threshold)
    pause_stall = has_victims & (pause >= threshold)
    cand["decode_only_ns"] = np.rint(decode_only).astype(np.int64)
    cand["excess_ns"] = np.rint(np.maximum(excess, 0)).astype(np.int64)
    cand["threshold_ns"] = np.rint(threshold).astype(np.int64)
    cand["prefill_stall"] = prefill_stall
    cand["pause_stall"] = pause_stall
    # Chunks of every candidate with victims: for the stalls' culprits, and to fit chunk cost.
    chosen = cand[has_victims & (cand["num_prefills"].to_numpy() > 0)]
    chunks = store.sql(query_text("itl_stall_chunks"), {
        "instances": chosen["instance"].tolist(), "step_indexes": chosen["step_index"].astype(int).tolist()}).df()
    chunks["pairs"] = (chunks["chunk_tokens"] * chunks["computed_tokens"]
                       + chunks["chunk_tokens"] * (chunks["chunk_tokens"] + 1) // 2).astype(np.float64)
    cost_fit: dict[str, tuple[float, float, float]] = {}
    single = chosen[chosen["num_prefills"] == 1].merge(chunks, on=["instance", "step_index"])
    for instance, rows in single.groupby("instance"):
        cost_fit[str(instance)] = _chunk_cost_fit(rows["excess_ns"].to_numpy(), rows["chunk_tokens"].to_numpy(),
                                                  rows["pairs"].to_numpy())
    by_step: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in _records(chunks):
        by_step[(row["instance"], int(row["step_index"]))].append(row)
    out = []
    for row in _records(cand[prefill_stall | pause_stall]):
        key = (row["instance"], int(row["step_index"]))
        culprits: list[ChunkCulprit] = []
        causes: list[str] = []
        if row["prefill_stall"]:
            rows = by_step.get(key, [])
            _, beta, gamma = cost_fit.get(row["instance"], (0.0, 0.0, 0.0))
            weights = [float(beta * c["chunk_tokens"] + gamma * c["pairs"]) for c in rows]
            if _sum(weights) <= 0:
                weights = [float(c["chunk_tokens"]) for c in rows]
            total = _sum(weights)
            shares = [w / total for w in weights] if total > 0 else [1 / max(len(rows), 1)] * len(rows)
            for c, share in zip(rows, shares, strict=True):
                culprits.append(ChunkCulprit(c["request_id"], c["tenant"], int(c["chunk_tokens"]),
                                             int(c["computed_tokens"]), bool(c["recompute"]), float(share),
                                             round(float(share) * row["excess_ns"])))
            if any(not c.recompute for c in culprits):
                causes.append("prefill")
            if any(c.recompute for c in culprits):
                causes.append("recompute")
        if row["pause_stall"]:
            causes.append("host_pause")
        row["culprits"] = culprits
        row["causes"] = causes
        row["chunk_rows"] = by_step.get(key, [])
        row["cost_fit"] = cost_fit.get(row["instance"], (0.0, 0.0, 0.0))
        out.append(row)
    return out


def _opt_int(value: Any) -> int | None:
    return None if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA else int(value)


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """`frame.to_dict("records")` (Python scalars), column by column: several times faster on many rows."""
    names = [str(c) for c in frame.columns]
    columns = [_column_list(frame[c]) for c in names]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def _column_list(column: pd.Series) -> list[Any]:
    """A column's values as `DataFrame.to_dict("records")` gives them (Python scalars; a null is None, or NaN
    in a NaN-null column), but through Arrow in one call rather than element by element."""
    na_value = getattr(column.dtype, "na_value", None)
    if hasattr(column.array, "__arrow_array__"):
        arrow = column.array.__arrow_array__()
        values = arrow.to_pylist()
        if arrow.null_count and na_value is not pd.NA and na_value is not None:
            values = [na_value if v is None else v for v in values]
        return values
    values = column.tolist()
    if column.dtype == object:
        values = [None if v is pd.NA else v for v in values]
    return values


def _sum(values: list[float]) -> float:
    """`np.sum` of a short list of floats, bit for bit (numpy adds fewer than 8 values in order)."""
    return float(sum(values)) if len(values) < 8 else float(np.sum(values))


def _mean(values: list[float]) -> float:
    """`np.mean` of a short list, bit for bit (numpy sums fewer than 8 values in order), without its overhead."""
    return sum(values) / len(values) if len(values) < 8 else float(np.mean(values))


def _top_culprits(victim_codes: np.ndarray, victim_stall: np.ndarray, stall_culprits: list[tuple[ChunkCulprit, ...]],
                  culprit_ids: pd.Index) -> np.ndarray:
    """Per victim code, the culprit that added the most to it over all its stalls (ties: the first met, in stall
    order then culprit order); -1 where none. Returns codes into `culprit_ids`."""
    per_stall = np.array([len(c) for c in stall_culprits], dtype=np.int64)
    flat = [c for cs in stall_culprits for c in cs]
    top = np.full(int(victim_codes.max()) + 1 if len(victim_codes) else 0, -1, dtype=np.int64)
    if not flat:
        return top
    c_code = culprit_ids.get_indexer([c.request_id for c in flat]).astype(np.int64)
    c_excess = np.array([c.excess_ns for c in flat], dtype=np.int64)
    c_start = np.cumsum(per_stall) - per_stall  # first culprit of each stall in the flat arrays
    n = per_stall[victim_stall]  # culprits per victim row
    keep = n > 0
    rows = np.repeat(np.flatnonzero(keep), n[keep])
    within = np.arange(len(rows)) - np.repeat(np.cumsum(n[keep]) - n[keep], n[keep])
    flat_idx = c_start[victim_stall[rows]] + within  # position in `flat`: stall order, then culprit order
    frame = pd.DataFrame({"victim": victim_codes[rows], "culprit": c_code[flat_idx], "excess": c_excess[flat_idx],
                          "first": flat_idx})
    agg = frame.groupby(["victim", "culprit"], sort=False).agg(excess=("excess", "sum"), first=("first", "min"))
    agg = agg.reset_index().sort_values(["victim", "excess", "first"], ascending=[True, False, True])
    best = agg.drop_duplicates("victim", keep="first")
    top[best["victim"].to_numpy()] = best["culprit"].to_numpy()
    return top


def _itl_distributions(store: Store) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per engine (by name), its ITLs sorted and how many tokens had each (`itl_token_itls`), through Arrow."""
    table = store.sql(query_text("itl_token_itls")).to_arrow_table()
    if table.num_rows == 0:
        return {}
    instance = pc.dictionary_encode(table["instance"].combine_chunks())
    codes = instance.indices.to_numpy(zero_copy_only=False)
    names = instance.dictionary.to_pylist()
    values = table["itl_ns"].to_numpy().astype(np.int64)
    weights = table["tokens"].to_numpy().astype(np.float64)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for code, name in enumerate(names):  # null instances have no code here
        mine = np.flatnonzero(codes == code)
        if len(mine):
            order = mine[np.argsort(values[mine], kind="stable")]
            out[str(name)] = (values[order], weights[order])
    return dict(sorted(out.items()))


def _summaries(store: Store, p: ItlParams, stall_rows: list[dict[str, Any]],
               itls: dict[str, tuple[np.ndarray, np.ndarray]],
               cand: pd.DataFrame, models: dict[str, DecodeStepModel],
               unexplained: list[tuple[str, int]]) -> ItlAnalysis:
    stalls = tuple(Stall(
        instance=r["instance"], model=r["model"], policy=r["policy"], step_index=int(r["step_index"]),
        start_ns=int(r["start_ns"]), end_ns=int(r["end_ns"]), duration_ns=int(r["duration_ns"]),
        decode_only_ns=int(r["decode_only_ns"]), excess_ns=int(r["excess_ns"]), pause_ns=int(r["pause_ns"]),
        threshold_ns=int(r["threshold_ns"]), causes=tuple(r["causes"]), culprits=tuple(r["culprits"]),
        victims=tuple(r["victims"]), victim_itls_ns=tuple(np.asarray(r["victim_itls_ns"], dtype=np.int64).tolist()))
        for r in stall_rows)

    # Per culprit.
    culprit_acc: dict[tuple[str, str], dict[str, Any]] = {}
    for s in stalls:
        for c in s.culprits:
            a = culprit_acc.get((s.instance, c.request_id))
            if a is None:
                a = culprit_acc[(s.instance, c.request_id)] = {
                    "tenant": c.tenant, "chunk_tokens": 0, "stalls": 0, "victims": set(), "stall_ns": 0,
                    "victim_stall_ns": 0, "recompute": c.recompute}
            a["chunk_tokens"] += c.chunk_tokens
            a["stalls"] += 1
            a["victims"].update(s.victims)
            a["stall_ns"] += c.excess_ns
            a["victim_stall_ns"] += c.excess_ns * len(s.victims)

    # Per victim, vectorized: one row per (stall, victim).
    n_victims = np.array([len(s.victims) for s in stalls], dtype=np.int64)
    victim_stall = np.repeat(np.arange(len(stalls)), n_victims)
    stall_instance = np.array([s.instance for s in stalls], dtype=object)
    victim_ids = np.array([v for s in stalls for v in s.victims], dtype=object)
    victim_itls = np.array([x for s in stalls for x in s.victim_itls_ns], dtype=np.int64)
    victim_added = np.array([s.added_ns for s in stalls], dtype=np.int64)[victim_stall]
    # (instance, victim) codes in order of first appearance, from integer codes (no string tuples).
    inst_codes, inst_names = pd.factorize(stall_instance[victim_stall])
    id_codes, id_names = pd.factorize(victim_ids)
    victim_codes, pair_codes = pd.factorize(inst_codes.astype(np.int64) * max(len(id_names), 1) + id_codes)
    pair_codes = np.asarray(pair_codes, dtype=np.int64)
    inst_list = np.asarray(inst_names, dtype=object).tolist()
    id_list = np.asarray(id_names, dtype=object).tolist()
    victim_keys = [(inst_list[c // max(len(id_names), 1)], id_list[c % max(len(id_names), 1)])
                   for c in pair_codes.tolist()]
    victims_frame = pd.DataFrame({"code": victim_codes, "itl": victim_itls, "added": victim_added})
    per_victim = victims_frame.groupby("code", sort=True).agg(
        stalls=("itl", "size"), worst=("itl", "max"), added=("added", "sum"))
    culprit_ids = pd.Index(sorted({c.request_id for s in stalls for c in s.culprits}))
    top = _top_culprits(victim_codes, victim_stall, [s.culprits for s in stalls], culprit_ids).tolist()
    culprit_list = [str(c) for c in culprit_ids.tolist()]

    prompts: dict[str, tuple[int | None, int | None]] = {}
    if culprit_acc:
        ids = sorted({rid for _, rid in culprit_acc})
        for rid, inp, cached in store.sql(
                "SELECT r.request_id, r.input_tokens, r.cached_tokens FROM requests r "
                "JOIN (SELECT unnest($ids::VARCHAR[]) AS request_id) w ON w.request_id = r.request_id",
                {"ids": ids}).fetchall():
            prompts[rid] = (_opt_int(inp), _opt_int(cached))
    culprits = tuple(sorted((CulpritSummary(
        rid, a["tenant"], inst, *prompts.get(rid, (None, None)), a["chunk_tokens"], a["stalls"], len(a["victims"]),
        a["stall_ns"], a["victim_stall_ns"], a["recompute"]) for (inst, rid), a in culprit_acc.items()),
        key=lambda c: (-c.victim_stall_ns, c.request_id)))
    victims = tuple(sorted((VictimSummary(
        victim_keys[code][1], victim_keys[code][0], int(n), max(int(worst), 0), int(added),
        culprit_list[top[code]] if top[code] >= 0 else None)
        for code, n, worst, added in zip(per_victim.index.to_numpy(), per_victim["stalls"].to_numpy(),
                                         per_victim["worst"].to_numpy(), per_victim["added"].to_numpy(), strict=True)),
        key=lambda v: (-v.added_ns, v.request_id)))

    # Per stall: the prefill excess its victims would lose without the collision, and with a chunk budget.
    prefill_excess = np.zeros(len(stalls), dtype=np.int64)
    bounded_excess = np.zeros(len(stalls), dtype=np.int64)
    for k, (s, row) in enumerate(zip(stalls, stall_rows, strict=True)):
        excess = sum(c.excess_ns for c in s.culprits if not c.recompute)
        if not excess:
            continue
        _, beta, gamma = row["cost_fit"]
        budget = p.chunk_budget_tokens
        ctx = _mean([c.computed_tokens + c.chunk_tokens / 2 for c in s.culprits]) if s.culprits else 0.0
        chunk_cost = beta * budget + gamma * (budget * ctx + budget * (budget + 1) / 2)
        prefill_excess[k] = excess
        bounded_excess[k] = max(excess - round(chunk_cost), 0)
    # Each victim token once (a gap may span several stalls): its ITL and the prefill excess in it.
    cut_rows = prefill_excess[victim_stall] > 0
    cuts = pd.DataFrame({"victim": victim_codes[cut_rows], "itl": victim_itls[cut_rows],
                         "removed": prefill_excess[victim_stall][cut_rows],
                         "bounded": bounded_excess[victim_stall][cut_rows]})
    cuts = cuts.groupby(["victim", "itl"], sort=False)[["removed", "bounded"]].sum().reset_index()
    cuts["instance"] = pair_codes[cuts["victim"].to_numpy()] // max(len(id_names), 1)
    cuts_by_instance = {inst_list[int(k)]: rows for k, rows in cuts.groupby("instance", sort=False)}

    engines = []
    meta = cand.groupby("instance")[["model", "policy"]].first().to_dict("index") if not cand.empty else {}
    stalls_by_instance: dict[str, list[Stall]] = defaultdict(list)
    for s in stalls:
        stalls_by_instance[s.instance].append(s)
    unexplained_by_instance: dict[str, int] = defaultdict(int)
    for i, _ in unexplained:
        unexplained_by_instance[i] += 1
    for inst, (values, weights) in itls.items():
        p99 = _weighted_quantile(values, weights, 0.99)
        mine = stalls_by_instance.get(inst, [])
        by_cause = {c: sum(c in s.causes for s in mine) for c in CAUSES}
        mine_cuts = cuts_by_instance.get(inst, cuts.iloc[:0])
        olds = mine_cuts["itl"].to_numpy(dtype=np.int64)
        p99_tokens = float(weights[values >= p99].sum())
        stalled_p99 = int((olds >= p99).sum())
        share = stalled_p99 / p99_tokens if p99_tokens else 0.0

        m = models.get(inst)
        decode_p50 = _weighted_quantile(values, weights, 0.5)
        info = meta.get(inst, {})
        engines.append(EngineItl(
            inst, info.get("model"), info.get("policy"), int(weights.sum()), decode_p50, p99,
            int(np.median(m.levels_ns)) if m else decode_p50, by_cause,
            unexplained_by_instance.get(inst, 0), share,
            _counterfactual_p99(values, weights, olds, mine_cuts["removed"].to_numpy()),
            p.chunk_budget_tokens,
            _counterfactual_p99(values, weights, olds, mine_cuts["bounded"].to_numpy()), m))
    return ItlAnalysis(p, tuple(engines), stalls, culprits, victims, tuple(unexplained))
