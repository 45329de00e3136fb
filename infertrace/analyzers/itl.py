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
   at least `min_excess_ns` (the ground truth's definition, `reference_engine/scenarios/ground_truth.py`); the excess
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
import pyarrow as pa
import pyarrow.compute as pc
from scipy.optimize import nnls

from infertrace.analyzers import materialize_once, query_text
from infertrace.store.ingest import gc_paused
from infertrace.store.store import Store

CAUSES = ("prefill", "recompute", "host_pause")
PARTITION_STEPS = 100_000  # candidate steps read and judged at once (`itl_stall_partitions`)


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
    materialize_once(store, ("step_membership",))
    for name in ("itl_request_tokens", "itl_token_gaps"):
        store.con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {query_text(name)}")


def analyze_itl(store: Store, params: ItlParams | None = None, *,
                partition_steps: int = PARTITION_STEPS) -> ItlAnalysis:
    """ITL spikes and their causes on every engine in the store. The stall candidates and their victims are
    read and judged per engine, in ranges of at most `partition_steps` candidate steps (`itl_stall_partitions`):
    what that stage holds at once is set by the range, not by the window; the result does not depend on it."""
    if partition_steps < 1:
        raise ValueError(f"partition_steps must be at least 1, got {partition_steps}")
    with gc_paused():  # millions of short-lived, acyclic objects: the collector's passes would cost ~10%
        return _analyze(store, params or ItlParams(), partition_steps)


def _analyze(store: Store, p: ItlParams, partition_steps: int) -> ItlAnalysis:
    if not store.pushes_down("itl_stall_candidates"):  # else every aggregation below runs where the spans are
        _register(store)
    decode = store.aggregate("itl_decode_steps", query_text("itl_decode_steps")).df()
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
    del decode  # not needed past here: freed before the stall candidates are read, range by range

    judged = _judge_partitions(store, models, local, p, partition_steps)
    found = _stalls(store, judged)
    return _summaries(store, p, found, itls, judged.frame, models, unexplained)


@dataclass(frozen=True)
class _Candidates:
    """`itl_stall_candidates` (one range of one engine's steps): the scalar columns as a table, each step's
    victims as flat arrays (step k's victims are rows `offsets[k]:offsets[k + 1]` of `victim_ids` and
    `victim_itls`)."""

    table: pa.Table
    offsets: np.ndarray
    victim_ids: pa.Array
    victim_itls: np.ndarray

    @classmethod
    def of(cls, table: pa.Table) -> _Candidates:
        ids = table["victims"].combine_chunks()
        lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        itls = table["victim_itls_ns"].combine_chunks().flatten().to_numpy(zero_copy_only=False).astype(np.int64)
        return cls(table.drop_columns(["victims", "victim_itls_ns"]), offsets, ids.flatten(), itls)

    def victims_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions in the flat victim arrays of the given steps' victims, in step order; new offsets)."""
        lengths = self.offsets[rows + 1] - self.offsets[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return _ranges(self.offsets[rows], lengths), offsets


@dataclass(frozen=True)
class _Found:
    """The stalls, and the same facts as flat arrays in stall order for the summaries: one row per
    (stall, victim) and one per (stall, culprit chunk)."""

    stalls: tuple[Stall, ...]
    victim_stall: np.ndarray
    victim_codes: np.ndarray  # per (stall, victim): the victim's position in `victim_names`
    victim_names: list[str]  # the victims' request ids, in order of first appearance
    victim_itls: np.ndarray
    culprits: pd.DataFrame  # stall, request_id, tenant, chunk_tokens, computed_tokens, recompute, share, excess_ns
    cost_fits: list[tuple[float, float, float]]  # per stall: its engine's chunk cost fit


@dataclass(frozen=True)
class _Judged:
    """Every stall candidate judged (`frame`: the scalar columns of `itl_stall_candidates` with decode_only_ns,
    excess_ns, threshold_ns, prefill_stall, pause_stall, victims (how many)), and the victims of the stalls
    only, in stall order: stall k's are rows `offsets[k]:offsets[k + 1]` of `victim_codes` (positions in
    `victim_names`, in order of first appearance) and `victim_itls`."""

    frame: pd.DataFrame
    offsets: np.ndarray
    victim_codes: np.ndarray
    victim_names: list[str]
    victim_itls: np.ndarray


def _judge_partitions(store: Store, models: dict[str, DecodeStepModel],
                      local: dict[str, tuple[np.ndarray, np.ndarray]], p: ItlParams, partition_steps: int) -> _Judged:
    """`itl_stall_candidates` read one range of one engine's steps at a time, each range's candidates judged
    and only its stalls' victims kept (as codes into one list of names): the candidates' lists of victims are
    never held for the whole window."""
    parts = store.aggregate("itl_stall_partitions", query_text("itl_stall_partitions"),
                            {"steps": partition_steps}).fetchall()
    if not parts:  # nothing to judge: one empty read for the columns
        parts = [(None, 0, -1, 0)]
    scalars: list[pa.Table] = []
    judged: list[dict[str, np.ndarray]] = []
    codes: list[np.ndarray] = []
    itls: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    names: dict[str, int] = {}
    for instance, first_step, last_step, _ in parts:
        cand = _Candidates.of(store.aggregate("itl_stall_candidates", query_text("itl_stall_candidates"), {
            "max_gap_steps": p.max_gap_steps, "instance": instance, "first_step": first_step,
            "last_step": last_step}).to_arrow_table())
        columns = _judge(cand, models, local, p)
        selected = np.flatnonzero(columns["prefill_stall"] | columns["pause_stall"])
        positions, offsets = cand.victims_of(selected)
        encoded = pc.dictionary_encode(cand.victim_ids.take(pa.array(positions, type=pa.int64())))
        to_global = np.array([names.setdefault(name, len(names)) for name in encoded.dictionary.to_pylist()],
                             dtype=np.int64)
        codes.append(to_global[encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)])
        itls.append(cand.victim_itls[positions])
        lengths.append(np.diff(offsets))
        scalars.append(cand.table)
        judged.append(columns)
    frame = pa.concat_tables(scalars).to_pandas()
    for column in judged[0]:
        frame[column] = np.concatenate([j[column] for j in judged])
    return _Judged(frame, np.concatenate([[0], np.cumsum(np.concatenate(lengths))]).astype(np.int64),
                   np.concatenate(codes), list(names), np.concatenate(itls))


def _judge(cand: _Candidates, models: dict[str, DecodeStepModel], local: dict[str, tuple[np.ndarray, np.ndarray]],
           p: ItlParams) -> dict[str, np.ndarray]:
    """Per candidate: its victims' decode-only step, its excess and threshold, and whether it stalls them by a
    prefill or by a pause."""
    frame = cand.table.to_pandas()
    n_victims = np.diff(cand.offsets)
    mixed = frame["num_decodes"].to_numpy() > 0
    num = np.where(mixed, frame["num_decodes"].to_numpy(), n_victims)
    ctx = np.where(mixed, frame["decode_context_tokens"].fillna(0).to_numpy(),
                   frame["victim_context_tokens"].to_numpy())
    decode_only = np.zeros(len(frame))
    for instance, idx in frame.groupby("instance").indices.items():
        m = models.get(str(instance))
        if m is None:
            continue
        times, ratios = local[str(instance)]
        scale = _local_scale(times, ratios, frame["start_ns"].to_numpy()[idx])
        decode_only[idx] = m.predict(num[idx], ctx[idx]) * scale
    decode_only = np.where(num > 0, decode_only, 0.0)
    pause = frame["pause_ns"].to_numpy()
    duration = frame["duration_ns"].to_numpy()
    excess = duration - pause - np.where(mixed, decode_only, 0.0)
    threshold = np.maximum(p.stall_ratio * decode_only, p.min_excess_ns)
    has_victims = n_victims > 0
    return {"decode_only_ns": np.rint(decode_only).astype(np.int64),
            "excess_ns": np.rint(np.maximum(excess, 0)).astype(np.int64),
            "threshold_ns": np.rint(threshold).astype(np.int64),
            "prefill_stall": has_victims & (frame["num_prefills"].to_numpy() > 0) & (excess >= threshold),
            "pause_stall": has_victims & (pause >= threshold),
            "victims": n_victims}


def _stalls(store: Store, judged: _Judged) -> _Found:
    frame = judged.frame
    # Chunks of every candidate with victims: for the stalls' culprits, and to fit chunk cost.
    chosen = frame[(frame["victims"].to_numpy() > 0) & (frame["num_prefills"].to_numpy() > 0)]
    chunks = store.aggregate("itl_stall_chunks", query_text("itl_stall_chunks"), {
        "instances": chosen["instance"].tolist(), "step_indexes": chosen["step_index"].astype(int).tolist()}).df()
    chunks["pairs"] = (chunks["chunk_tokens"] * chunks["computed_tokens"]
                       + chunks["chunk_tokens"] * (chunks["chunk_tokens"] + 1) // 2).astype(np.float64)
    cost_fit: dict[str, tuple[float, float, float]] = {}
    single = chosen[chosen["num_prefills"] == 1].merge(chunks, on=["instance", "step_index"])
    for instance, rows in single.groupby("instance"):
        cost_fit[str(instance)] = _chunk_cost_fit(rows["excess_ns"].to_numpy(), rows["chunk_tokens"].to_numpy(),
                                                  rows["pairs"].to_numpy())

    selected = np.flatnonzero(frame["prefill_stall"].to_numpy() | frame["pause_stall"].to_numpy())
    rows = frame.iloc[selected].reset_index(drop=True)
    rows["stall"] = np.arange(len(rows))
    culprits = _culprit_chunks(chunks, rows, cost_fit)
    # The victims as Python objects once per distinct value (a request is the victim of many stalls).
    ids = np.array(judged.victim_names, dtype=object)[judged.victim_codes].tolist()
    values, inverse = np.unique(judged.victim_itls, return_inverse=True)
    itls = np.array(values.tolist(), dtype=object)[inverse.reshape(-1)].tolist()
    stalls = _stall_objects(rows, culprits, ids, itls, judged.offsets.tolist())
    del ids, itls
    fits = [cost_fit.get(instance, (0.0, 0.0, 0.0)) for instance in rows["instance"].tolist()]
    return _Found(stalls, np.repeat(np.arange(len(rows)), np.diff(judged.offsets)), judged.victim_codes,
                  judged.victim_names, judged.victim_itls, culprits, fits)


def _stall_objects(rows: pd.DataFrame, culprits: pd.DataFrame, ids: list[str], itls: list[int],
                   bounds: list[int]) -> tuple[Stall, ...]:
    """One `Stall` per row of `rows`, with its culprit chunks and its victims (rows `bounds[k]:bounds[k + 1]`
    of `ids` and `itls`); its causes from whether its culprits recompute a preempted request and whether the
    host paused in it."""
    recompute = culprits["recompute"].to_numpy(dtype=bool)
    stall_of = culprits["stall"].to_numpy()
    n_recompute = np.bincount(stall_of[recompute], minlength=len(rows))
    n_fresh = np.bincount(stall_of[~recompute], minlength=len(rows))
    causes = [(("prefill",) if fresh else ()) + (("recompute",) if again else ()) + (("host_pause",) if paused else ())
              for fresh, again, paused in zip(n_fresh.tolist(), n_recompute.tolist(),
                                              rows["pause_stall"].tolist(), strict=True)]
    culprit_objects = [ChunkCulprit(*values) for values in zip(
        culprits["request_id"].tolist(), _none_for_null(culprits["tenant"]), culprits["chunk_tokens"].tolist(),
        culprits["computed_tokens"].tolist(), recompute.tolist(), culprits["share"].tolist(),
        culprits["excess_ns"].tolist(), strict=True)]
    culprit_offsets = np.concatenate([[0], np.cumsum(np.bincount(stall_of, minlength=len(rows)))]).tolist()
    return tuple(Stall(
        instance=instance, model=model, policy=policy, step_index=step_index, start_ns=start_ns, end_ns=end_ns,
        duration_ns=duration_ns, decode_only_ns=decode_only_ns, excess_ns=excess_ns, pause_ns=pause_ns,
        threshold_ns=threshold_ns, causes=causes[k],
        culprits=tuple(culprit_objects[culprit_offsets[k]:culprit_offsets[k + 1]]),
        victims=tuple(ids[bounds[k]:bounds[k + 1]]), victim_itls_ns=tuple(itls[bounds[k]:bounds[k + 1]]))
        for k, (instance, model, policy, step_index, start_ns, end_ns, duration_ns, decode_only_ns, excess_ns,
                pause_ns, threshold_ns) in enumerate(zip(
            rows["instance"].tolist(), _none_for_null(rows["model"]), _none_for_null(rows["policy"]),
            rows["step_index"].tolist(), rows["start_ns"].tolist(), rows["end_ns"].tolist(),
            rows["duration_ns"].tolist(), rows["decode_only_ns"].tolist(), rows["excess_ns"].tolist(),
            rows["pause_ns"].tolist(), rows["threshold_ns"].tolist(), strict=True)))


def _culprit_chunks(chunks: pd.DataFrame, rows: pd.DataFrame,
                    cost_fit: dict[str, tuple[float, float, float]]) -> pd.DataFrame:
    """The chunks of the prefill stalls (`rows` with prefill_stall), in stall order then request order, each
    with its share of the stall's excess: in proportion to its estimated cost under the engine's chunk cost
    fit (β·tokens + γ·attention pairs), by tokens when the fit gives nothing, evenly when there are none."""
    keys = rows.loc[rows["prefill_stall"], ["instance", "step_index", "stall", "excess_ns"]]
    out = chunks.merge(keys.rename(columns={"excess_ns": "stall_excess_ns"}), on=["instance", "step_index"])
    out = out.sort_values("stall", kind="stable").reset_index(drop=True)
    fit = out["instance"].map(lambda i: cost_fit.get(i, (0.0, 0.0, 0.0)))
    beta = np.array([f[1] for f in fit], dtype=np.float64)
    gamma = np.array([f[2] for f in fit], dtype=np.float64)
    tokens = out["chunk_tokens"].to_numpy(dtype=np.float64)
    weights = beta * tokens + gamma * out["pairs"].to_numpy(dtype=np.float64)
    starts = _segment_starts(out["stall"].to_numpy())
    counts = np.diff(np.r_[starts, len(out)]).astype(np.int64)
    total = np.repeat(_segment_sums(weights, starts, counts), counts)
    weights = np.where(total <= 0, tokens, weights)  # no cost from the fit: by tokens
    total = np.repeat(_segment_sums(weights, starts, counts), counts)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(total > 0, weights / total, 1.0 / np.repeat(counts, counts))
    out["share"] = share
    out["excess_ns"] = np.rint(share * out["stall_excess_ns"].to_numpy()).astype(np.int64)
    out["recompute"] = out["recompute"].astype(bool)
    return out[["stall", "request_id", "tenant", "chunk_tokens", "computed_tokens", "recompute", "share",
                "excess_ns"]]


def _is_null(value: Any) -> bool:
    """None, pd.NA or NaN: how a null reaches Python from DuckDB, Arrow or pandas."""
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def _none_for_null(column: pd.Series) -> list[Any]:
    """A column's values with every null as None."""
    return [None if _is_null(v) else v for v in column.tolist()]


def _opt_int(value: Any) -> int | None:
    return None if _is_null(value) else int(value)


def _opt_str(value: Any) -> str | None:
    return None if _is_null(value) else str(value)


def _segment_starts(groups: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts in a grouped (sorted) array."""
    if len(groups) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`range(starts[k], starts[k] + lengths[k])` for every k, concatenated."""
    before = np.cumsum(lengths) - lengths  # where each range begins in the result
    return np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()))


def _segment_sums(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The sum of each segment `values[starts[k]:starts[k] + counts[k]]`, added left to right (as Python's
    `sum` would: the same float for the same values in the same order), vectorised across segments."""
    sums = np.zeros(len(starts))
    for j in range(int(counts.max()) if len(counts) else 0):
        more = counts > j
        sums[more] += values[starts[more] + j]
    return sums


def _top_culprits(victim_codes: np.ndarray, victim_stall: np.ndarray, culprit_stall: np.ndarray,
                  culprit_codes: np.ndarray, culprit_excess: np.ndarray, stalls: int) -> np.ndarray:
    """Per victim code, the culprit that added the most to it over all its stalls (ties: the first met, in stall
    order then culprit order); -1 where none. Culprit rows are in stall order; returns their `culprit_codes`."""
    top = np.full(int(victim_codes.max()) + 1 if len(victim_codes) else 0, -1, dtype=np.int64)
    if not len(culprit_stall):
        return top
    per_stall = np.bincount(culprit_stall, minlength=stalls)
    c_start = np.cumsum(per_stall) - per_stall  # first culprit of each stall
    n = per_stall[victim_stall]  # culprits per victim row
    keep = n > 0
    rows = np.repeat(np.flatnonzero(keep), n[keep])
    flat_idx = _ranges(c_start[victim_stall[keep]], n[keep])  # culprit row: stall order, then culprit order
    if not len(rows):
        return top
    # One row per (victim, culprit): the excess summed, and where the culprit first met the victim. Rows of a
    # pair are in stall order after a stable sort, so the first of each run is the earliest meeting.
    width = int(culprit_codes.max()) + 1
    order = np.argsort(victim_codes[rows] * width + culprit_codes[flat_idx], kind="stable")
    victim, culprit, flat_idx = victim_codes[rows][order], culprit_codes[flat_idx][order], flat_idx[order]
    starts = _segment_starts(victim * width + culprit)
    excess, first = np.add.reduceat(culprit_excess[flat_idx], starts), flat_idx[starts]
    victim, culprit = victim[starts], culprit[starts]
    # Per victim (its pairs are contiguous) the largest excess, ties to the earliest meeting.
    runs = _segment_starts(victim)
    lengths = np.diff(np.r_[runs, len(victim)])
    largest = np.repeat(np.maximum.reduceat(excess, runs), lengths)
    earliest = np.minimum.reduceat(np.where(excess == largest, first, np.iinfo(np.int64).max), runs)
    winner = (excess == largest) & (first == np.repeat(earliest, lengths))
    top[victim[winner]] = culprit[winner]
    return top


# The culprits' prompt lengths and prefix-cache hits (after `_register`; ClickHouseStore: sql/itl_request_prompts.sql).
ITL_REQUEST_PROMPTS_SQL = ("SELECT r.request_id, r.input_tokens, r.cached_tokens FROM itl_request_tokens r "
                           "JOIN (SELECT unnest($ids::VARCHAR[]) AS request_id) w ON w.request_id = r.request_id "
                           "ORDER BY ALL")

# The per-engine ITL distribution (after `_register`); ClickHouseStore computes it in ClickHouse
# (infertrace/store/clickhouse/sql/itl_distribution.sql).
ITL_DISTRIBUTION_SQL = ("SELECT instance, itl_ns, sum(tokens)::BIGINT AS tokens FROM (" + query_text("itl_token_itls")
                        + ") WHERE instance IS NOT NULL GROUP BY instance, itl_ns ORDER BY instance, itl_ns")


def itl_distributions(store: Store) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per engine, its distinct ITLs in ascending order and how many tokens had each: what `analyze_itl`
    summarises per engine, alone. Computed where the spans are when the store can (`Store.pushes_down`)."""
    if not store.pushes_down("itl_distribution"):
        _register(store)
    return _itl_distributions(store)


def _itl_distributions(store: Store) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per engine (by name), its distinct ITLs in ascending order and how many tokens had each
    (`itl_token_itls`, summed per value in SQL: a few hundred thousand rows rather than every run)."""
    table = store.aggregate("itl_distribution", ITL_DISTRIBUTION_SQL).to_arrow_table()
    if table.num_rows == 0:
        return {}
    names = table["instance"].to_numpy(zero_copy_only=False)
    values = table["itl_ns"].to_numpy().astype(np.int64)
    weights = table["tokens"].to_numpy().astype(np.float64)
    starts = _segment_starts(names)
    ends = np.r_[starts[1:], len(names)]
    return {str(names[a]): (values[a:b], weights[a:b]) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)}


def _summaries(store: Store, p: ItlParams, found: _Found, itls: dict[str, tuple[np.ndarray, np.ndarray]],
               cand: pd.DataFrame, models: dict[str, DecodeStepModel],
               unexplained: list[tuple[str, int]]) -> ItlAnalysis:
    stalls = found.stalls
    n_stalls = len(stalls)
    stall_instance = np.array([s.instance for s in stalls], dtype=object)
    inst_codes, inst_list = (pd.factorize(stall_instance) if n_stalls else (np.zeros(0, dtype=np.int64), []))
    inst_codes = np.asarray(inst_codes, dtype=np.int64)
    inst_list = list(inst_list)
    id_codes, id_list = found.victim_codes, found.victim_names
    n_ids = max(len(id_list), 1)
    victim_stall = found.victim_stall
    n_victims = np.bincount(victim_stall, minlength=n_stalls)

    # Per culprit (instance, request), in order of first appearance.
    culprits_frame = found.culprits
    c_stall = culprits_frame["stall"].to_numpy()
    c_excess = culprits_frame["excess_ns"].to_numpy(dtype=np.int64)
    c_request_codes, c_request_list = (pd.factorize(culprits_frame["request_id"]) if len(culprits_frame)
                                       else (np.zeros(0, dtype=np.int64), []))
    c_request_codes = np.asarray(c_request_codes, dtype=np.int64)
    c_request_list = list(c_request_list)
    group, group_keys = pd.factorize(inst_codes[c_stall] * max(len(c_request_list), 1) + c_request_codes)
    group = np.asarray(group, dtype=np.int64)
    n_groups = len(group_keys)
    first_row = np.full(n_groups, len(group), dtype=np.int64)
    np.minimum.at(first_row, group, np.arange(len(group)))
    stall_ns = np.bincount(group, weights=c_excess, minlength=n_groups)
    victim_stall_ns = np.bincount(group, weights=c_excess * n_victims[c_stall], minlength=n_groups)
    chunk_tokens = np.bincount(group, weights=culprits_frame["chunk_tokens"].to_numpy(), minlength=n_groups)
    stall_counts = np.bincount(group, minlength=n_groups)
    # Distinct victims per culprit: every (culprit, victim) pair of its stalls, counted once.
    stall_start = np.cumsum(n_victims) - n_victims
    reps = n_victims[c_stall]
    pair_rows = np.repeat(np.arange(len(group)), reps)
    pair_victims = id_codes[_ranges(stall_start[c_stall], reps)]
    pairs = np.sort(group[pair_rows] * n_ids + pair_victims)
    distinct = pairs[_segment_starts(pairs)]
    distinct_victims = np.bincount(distinct // n_ids, minlength=n_groups)

    prompts: dict[str, tuple[int | None, int | None]] = {}
    if n_groups:
        ids = sorted(set(c_request_list))
        rows = store.aggregate("itl_request_prompts", ITL_REQUEST_PROMPTS_SQL, {"ids": ids}).fetchall()
        for rid, inp, cached in rows:
            prompts[rid] = (_opt_int(inp), _opt_int(cached))
    tenants = _none_for_null(culprits_frame["tenant"])
    recompute = culprits_frame["recompute"].to_numpy(dtype=bool)
    culprits = [CulpritSummary(rid, tenants[row], inst_list[inst], *prompts.get(rid, (None, None)), chunks, stalls_in,
                               victims_in, added, handed_out, again)
                for rid, row, inst, chunks, stalls_in, victims_in, added, handed_out, again in zip(
                    [c_request_list[c] for c in c_request_codes[first_row].tolist()], first_row.tolist(),
                    inst_codes[c_stall[first_row]].tolist(), chunk_tokens.astype(np.int64).tolist(),
                    stall_counts.tolist(), distinct_victims.tolist(), stall_ns.astype(np.int64).tolist(),
                    victim_stall_ns.astype(np.int64).tolist(), recompute[first_row].tolist(), strict=True)]
    culprits.sort(key=lambda c: (-c.victim_stall_ns, c.request_id))

    # Per victim (instance, request), in order of first appearance: one row per (stall, victim).
    victim_codes, pair_codes = pd.factorize(inst_codes[victim_stall] * n_ids + id_codes)
    victim_codes = np.asarray(victim_codes, dtype=np.int64)
    pair_codes = np.asarray(pair_codes, dtype=np.int64)
    added = np.array([s.added_ns for s in stalls], dtype=np.int64)
    victims_frame = pd.DataFrame({"code": victim_codes, "itl": found.victim_itls, "added": added[victim_stall]})
    per_victim = victims_frame.groupby("code", sort=True).agg(
        stalls=("itl", "size"), worst=("itl", "max"), added=("added", "sum"))
    culprit_ids = pd.Index(sorted(set(c_request_list)))
    top = _top_culprits(victim_codes, victim_stall, c_stall,
                        np.asarray(culprit_ids.get_indexer(c_request_list), dtype=np.int64)[c_request_codes]
                        if len(c_request_codes) else c_request_codes, c_excess, n_stalls).tolist()
    culprit_names = [str(c) for c in culprit_ids.tolist()]
    victims = [VictimSummary(id_list[pair % n_ids], inst_list[pair // n_ids], n, max(worst, 0), total,
                             culprit_names[top[code]] if top[code] >= 0 else None)
               for code, pair, n, worst, total in zip(
                   per_victim.index.tolist(), pair_codes[per_victim.index.to_numpy()].tolist(),
                   per_victim["stalls"].tolist(), per_victim["worst"].tolist(), per_victim["added"].tolist(),
                   strict=True)]
    victims.sort(key=lambda v: (-v.added_ns, v.request_id))

    # Per stall: the prefill excess its victims would lose without the collision, and with a chunk budget of
    # `chunk_budget_tokens` (a chunk of that size at the culprits' mean context costs what the fit says).
    prefill_excess = np.bincount(c_stall[~recompute], weights=c_excess[~recompute], minlength=n_stalls)
    prefill_excess = prefill_excess.astype(np.int64)
    mid_context = (culprits_frame["computed_tokens"].to_numpy(dtype=np.float64)
                   + culprits_frame["chunk_tokens"].to_numpy(dtype=np.float64) / 2)
    starts = _segment_starts(c_stall)
    ctx = np.zeros(n_stalls)
    if len(starts):
        counts = np.diff(np.r_[starts, len(c_stall)]).astype(np.int64)
        ctx[c_stall[starts]] = _segment_sums(mid_context, starts, counts) / counts
    fits = np.array(found.cost_fits, dtype=np.float64).reshape(-1, 3)
    budget = p.chunk_budget_tokens
    chunk_cost = fits[:, 1] * budget + fits[:, 2] * (budget * ctx + budget * (budget + 1) / 2)
    bounded_excess = np.where(prefill_excess > 0, np.maximum(prefill_excess - np.rint(chunk_cost), 0), 0)
    bounded_excess = bounded_excess.astype(np.int64)
    # Each victim token once (a gap may span several stalls): its ITL and the prefill excess in it.
    cut_rows = prefill_excess[victim_stall] > 0
    cuts = pd.DataFrame({"victim": victim_codes[cut_rows], "itl": found.victim_itls[cut_rows],
                         "removed": prefill_excess[victim_stall][cut_rows],
                         "bounded": bounded_excess[victim_stall][cut_rows]})
    cuts = cuts.groupby(["victim", "itl"], sort=False)[["removed", "bounded"]].sum().reset_index()
    cuts["instance"] = pair_codes[cuts["victim"].to_numpy()] // n_ids
    cuts_by_instance = {inst_list[int(k)]: rows for k, rows in cuts.groupby("instance", sort=False)}

    engines = []
    meta = cand.groupby("instance")[["model", "policy"]].first().to_dict("index") if not cand.empty else {}
    cause_counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CAUSES, 0))
    for s in stalls:
        for cause in s.causes:
            cause_counts[s.instance][cause] += 1
    unexplained_by_instance: dict[str, int] = defaultdict(int)
    for i, _ in unexplained:
        unexplained_by_instance[i] += 1
    for inst, (values, weights) in itls.items():
        p99 = _weighted_quantile(values, weights, 0.99)
        mine_cuts = cuts_by_instance.get(inst, cuts.iloc[:0])
        olds = mine_cuts["itl"].to_numpy(dtype=np.int64)
        p99_tokens = float(weights[values >= p99].sum())
        stalled_p99 = int((olds >= p99).sum())
        share = stalled_p99 / p99_tokens if p99_tokens else 0.0

        m = models.get(inst)
        decode_p50 = _weighted_quantile(values, weights, 0.5)
        info = meta.get(inst, {})
        engines.append(EngineItl(
            inst, _opt_str(info.get("model")), _opt_str(info.get("policy")), int(weights.sum()), decode_p50, p99,
            int(np.median(m.levels_ns)) if m else decode_p50, dict(cause_counts[inst]),
            unexplained_by_instance.get(inst, 0), share,
            _counterfactual_p99(values, weights, olds, mine_cuts["removed"].to_numpy()),
            p.chunk_budget_tokens,
            _counterfactual_p99(values, weights, olds, mine_cuts["bounded"].to_numpy()), m))
    return ItlAnalysis(p, tuple(engines), stalls, tuple(culprits), tuple(victims), tuple(unexplained))

