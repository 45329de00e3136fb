"""Attribute lift: an attribute the selected requests share is named with its lift and a significance
test; a selection drawn at random shares nothing significant."""

from __future__ import annotations

import numpy as np
import pandas as pd

from infertrace.analyzers.commonality import attribute_lift


def _requests(n: int, rng: np.random.Generator) -> pd.DataFrame:
    return pd.DataFrame({
        "tenant": rng.choice(["acme", "globex", "initech"], n),
        "model": rng.choice(["llama-3-8b", "qwen-2.5-1.5b"], n),
        "input_tokens": rng.integers(100, 6000, n),
        "cached_tokens": np.where(rng.random(n) < 0.5, 512, 0),
        "assistant_prefill_tokens": np.where(rng.random(n) < 0.05, 40, 0),
        "route_target": rng.choice(["e-0", "e-1"], n),
        "system_prompt_id": rng.choice(["sys-1", None], n),
    })


def test_runaway_generations_are_traced_to_the_assistant_prefill() -> None:
    rng = np.random.default_rng(1)
    requests = _requests(4000, rng)
    has_prefill = requests["assistant_prefill_tokens"].to_numpy() > 0
    # 90% of the requests with a prefill run away, and a few without one
    selected = (has_prefill & (rng.random(len(requests)) < 0.9)) | (rng.random(len(requests)) < 0.005)
    result = attribute_lift(requests, selected)
    top = result.top()
    assert top is not None
    assert (top.attribute, top.value) == ("assistant_prefill", "yes")
    assert top.share_selected > 0.8 and top.share_population < 0.08
    assert top.lift > 10 and top.p_value < 1e-10
    assert "had an assistant prefill, against" in top.sentence()
    assert all(x.attribute == "assistant_prefill" for x in result.over_represented)


def test_a_random_selection_has_nothing_in_common() -> None:
    rng = np.random.default_rng(2)
    requests = _requests(4000, rng)
    selected = rng.random(len(requests)) < 0.1
    assert attribute_lift(requests, selected).over_represented == ()


def test_a_tenant_that_is_over_represented_is_named() -> None:
    rng = np.random.default_rng(3)
    requests = _requests(3000, rng)
    selected = (requests["tenant"].to_numpy() == "globex") & (rng.random(len(requests)) < 0.3)
    top = attribute_lift(requests, selected).top()
    assert top is not None and (top.attribute, top.value) == ("tenant", "globex")
    assert 2.5 < top.lift < 3.5  # one tenant in three: lift ≈ 3


def test_requests_rejected_before_any_engine_have_no_system_prompt_value_not_none() -> None:
    rng = np.random.default_rng(4)
    requests = _requests(3000, rng)
    rejected = rng.random(len(requests)) < 0.1  # answered 429 by the limiter: no engine ever saw them
    requests["pre_engine_ns"] = pd.array(np.where(rejected, None, 5_000_000), dtype="Int64")
    requests.loc[rejected, ["system_prompt_id", "cached_tokens", "assistant_prefill_tokens"]] = None
    requests.loc[rejected, "route_target"] = None
    result = attribute_lift(requests, rejected)
    assert not any(x.attribute in ("system_prompt", "prefix_cache_hit", "assistant_prefill", "route_target")
                   for x in result.over_represented), [x.sentence() for x in result.over_represented]


def test_engine_requests_without_a_system_prompt_are_said_to_have_none_not_system_prompt_none() -> None:
    rng = np.random.default_rng(5)
    requests = _requests(3000, rng)
    selected = requests["system_prompt_id"].isna().to_numpy() & (rng.random(len(requests)) < 0.5)
    found = {x.attribute: x for x in attribute_lift(requests, selected).over_represented}
    assert found["system_prompt"].value == "none"
    assert "had no system prompt" in found["system_prompt"].sentence()
    assert "system prompt none" not in found["system_prompt"].sentence()


def test_a_request_with_no_tenant_or_prompt_length_recorded_has_no_value_of_either() -> None:
    rng = np.random.default_rng(6)
    requests = _requests(3000, rng)
    unknown = rng.random(len(requests)) < 0.1  # e.g. rejected before the gateway read the caller or the prompt
    requests["tenant"] = requests["tenant"].astype(object).where(~unknown, None)
    requests["input_tokens"] = requests["input_tokens"].astype(float).where(~unknown, np.nan)
    result = attribute_lift(requests, unknown)
    assert not [x.sentence() for x in result.over_represented if "unknown" in x.sentence()]


def test_requests_whose_engine_reports_no_cached_tokens_have_no_cache_hit_value_not_no() -> None:
    # Two models: one on engines that report cached tokens, one on vLLM's (no cached-token count). The slow
    # requests are the vLLM model's: "no prefix-cache hit" must not be named beside the model.
    rng = np.random.default_rng(7)
    requests = _requests(3000, rng)
    vllm = (requests["model"] == "qwen-2.5-1.5b").to_numpy()
    requests["cached_tokens"] = requests["cached_tokens"].astype(float).where(~vllm, np.nan)
    selected = vllm & (rng.random(len(requests)) < 0.6)
    found = {x.attribute for x in attribute_lift(requests, selected).over_represented}
    assert "model" in found and "prefix_cache_hit" not in found, found
