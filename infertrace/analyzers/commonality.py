"""What the anomalous requests have in common: the attribute values over-represented among a selection of
requests against all requests, with lift and a significance test.

For every value of every attribute (tenant, model, prompt-length bucket, prefix-cache hit, assistant
prefill, route target, system prompt), the share among the selected requests is compared with the share
among all requests: lift = share(selected) / share(all). What only an engine records (system prompt, prefix
hit, assistant prefill, route target) is unknown for a request rejected before reaching one, and such a
request has no value of it (an unknown is not "none"). Fisher's exact test (one-sided, scipy) on the 2×2
table selected-vs-rest × has-value-vs-not gives a p-value, Bonferroni-corrected for the number of values
tested. A value is reported when it is significant and present in at least `min_support` of the selection.

    result = attribute_lift(requests, selected)
    result.top().sentence()
    # '92% of the anomalous requests had an assistant prefill, against 9% of all requests (lift 10.2×, ...)'
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import fisher_exact

PROMPT_BUCKETS = (512, 1024, 2048, 4096, 8192)


def _prompt_bucket(tokens: pd.Series) -> pd.Series:
    values = tokens.to_numpy(dtype=float)
    labels = np.full(len(values), None, dtype=object)  # no prompt length recorded: unknown, not a bucket
    edges = (0, *PROMPT_BUCKETS, np.inf)
    for lo, hi in itertools.pairwise(edges):
        label = f"≥ {lo}" if hi == np.inf else f"< {hi}" if lo == 0 else f"{lo}–{hi - 1}"
        labels[(values >= lo) & (values < hi)] = label
    return pd.Series(labels, index=tokens.index)


def _known(values: pd.Series) -> pd.Series:
    """The values as objects, None where the store has none (NULL is unknown, never a value of its own)."""
    return values.astype(object).where(values.notna(), None)


def _reached_engine(requests: pd.DataFrame) -> np.ndarray:
    """Whether each request reached an engine: what only an engine records (its system prompt, its prefix-cache
    hit, its assistant prefill) is unknown for the others (rejected before any engine), not "none"."""
    if "pre_engine_ns" not in requests:
        return np.ones(len(requests), dtype=bool)
    return requests["pre_engine_ns"].notna().to_numpy()


def _engine_value(requests: pd.DataFrame, values: np.ndarray) -> pd.Series:
    return pd.Series(np.where(_reached_engine(requests), values, None), index=requests.index, dtype=object)


def _yes_no(requests: pd.DataFrame, counts: pd.Series) -> pd.Series:
    """"yes" where the count is positive, "no" where it is 0, None where the request's spans give no count (vLLM's
    carry no cached-token count: unknown, not "no")."""
    values = np.where(counts.fillna(0).to_numpy() > 0, "yes", "no")
    return _engine_value(requests, np.where(counts.notna().to_numpy(), values, None))


# attribute -> (how to read it from request_outcomes rows, None where unknown; how a sentence names a value)
ATTRIBUTES: dict[str, tuple[Callable[[pd.DataFrame], pd.Series], Callable[[str], str]]] = {
    "assistant_prefill": (lambda r: _yes_no(r, r["assistant_prefill_tokens"]),
                          lambda v: "an assistant prefill" if v == "yes" else "no assistant prefill"),
    "prefix_cache_hit": (lambda r: _yes_no(r, r["cached_tokens"]),
                         lambda v: "a prefix-cache hit" if v == "yes" else "no prefix-cache hit"),
    "prompt_tokens": (lambda r: _prompt_bucket(r["input_tokens"]), lambda v: f"a prompt of {v} tokens"),
    "tenant": (lambda r: _known(r["tenant"]), lambda v: f"tenant {v}"),
    "model": (lambda r: _known(r["model"]), lambda v: f"model {v}"),
    "route_target": (lambda r: _known(r["route_target"]), lambda v: f"route target {v}"),
    "system_prompt": (lambda r: _engine_value(r, r["system_prompt_id"].fillna("none").astype(str).to_numpy()),
                      lambda v: "no system prompt" if v == "none" else f"system prompt {v}"),
}


@dataclass(frozen=True)
class AttributeLift:
    attribute: str
    value: str
    selected: int  # selected requests with the value
    selected_total: int
    population: int  # all requests with the value
    population_total: int
    lift: float
    p_value: float  # Bonferroni-corrected, one-sided Fisher exact test
    population_name: str = "all requests"  # what the selection is compared with

    @property
    def share_selected(self) -> float:
        return self.selected / self.selected_total if self.selected_total else 0.0

    @property
    def share_population(self) -> float:
        return self.population / self.population_total if self.population_total else 0.0

    def sentence(self, selection: str = "anomalous requests") -> str:
        name = ATTRIBUTES[self.attribute][1](self.value)
        return (f"{self.share_selected:.0%} of the {selection} ({self.selected} of {self.selected_total}) had "
                f"{name}, against {self.share_population:.0%} of {self.population_name} (lift {self.lift:.1f}×, "
                f"p = {self.p_value:.1e}).")


@dataclass(frozen=True)
class Commonality:
    selected: int
    population: int
    tested: int  # attribute values tested (the Bonferroni factor)
    alpha: float
    over_represented: tuple[AttributeLift, ...]  # significant, by lift (highest first)

    def top(self) -> AttributeLift | None:
        return self.over_represented[0] if self.over_represented else None


def attribute_lift(requests: pd.DataFrame, selected: np.ndarray | pd.Series, alpha: float = 0.01,
                   min_support: float = 0.25, attributes: tuple[str, ...] = tuple(ATTRIBUTES),
                   population_name: str = "all requests") -> Commonality:
    """Attribute values over-represented among the `selected` rows of `requests` (`request_outcomes` rows)
    against all of them (the population the selection was drawn from, named in sentences `population_name`)."""
    mask = np.asarray(selected, dtype=bool)
    n_selected, n_all = int(mask.sum()), len(requests)
    found: list[AttributeLift] = []
    tested = 0
    tables = []
    for attribute in attributes:
        values = ATTRIBUTES[attribute][0](requests).to_numpy()
        for value in pd.unique(values):
            if value is None or (isinstance(value, float) and np.isnan(value)):
                continue  # unknown (rejected before the router or any engine): a consequence, not a common trait
            has = values == value
            if has.all():
                continue  # a value every request has says nothing
            tested += 1
            a = int((has & mask).sum())
            tables.append((attribute, str(value), a, int(has.sum())))
    if not n_selected or not tested:
        return Commonality(n_selected, n_all, tested, alpha, ())
    for attribute, value, a, total in tables:
        if a < min_support * n_selected:
            continue
        b = n_selected - a  # selected without the value
        c = total - a  # rest with the value
        d = n_all - n_selected - c
        share_selected, share_all = a / n_selected, total / n_all
        lift = share_selected / share_all
        if lift <= 1.0:
            continue
        p = float(fisher_exact([[a, b], [c, d]], alternative="greater").pvalue)
        p = min(1.0, p * tested)
        if p < alpha:
            found.append(AttributeLift(attribute, value, a, n_selected, total, n_all, lift, p, population_name))
    found.sort(key=lambda x: (-x.lift, x.p_value, x.attribute, x.value))
    return Commonality(n_selected, n_all, tested, alpha, tuple(found))
