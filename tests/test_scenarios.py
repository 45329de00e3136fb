"""Incident scenarios, checked from the exported spans against the ground truth written beside them."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from infertrace import semconv as sc
from infertrace.cli import app
from reference_engine.scenarios.bank import TRACES_FILE, TRUTH_FILE, bank, run_scenario
from reference_engine.scenarios.families import FAMILIES, make_scenario
from tests.fleet_traces import Traces, decode_step_ms, fleet_from_toml
from tests.otlp_proto import token_times

THREE_MODELS = """
name = "three-models"

[[auth]]
id = "auth-0"

[[rate_limiter]]
id = "ratelimit-0"
requests_per_s = 8.0
burst = 16.0

[[router]]
id = "router-0"
models = ["llama-3-8b", "qwen-2.5-1.5b"]

[[router]]
id = "router-1"
models = ["mixtral-8x7b"]

[[global_queue]]
id = "global-queue-0"
models = ["llama-3-8b", "qwen-2.5-1.5b"]

[[model]]
name = "llama-3-8b"

[[model]]
name = "qwen-2.5-1.5b"

[[model]]
name = "mixtral-8x7b"
engine = { tensor_parallel = 2 }

[[tenant]]
name = "tenant-a"
rate = 1.8
prompt_mean = 800.0
output_mean = 150.0
system_prompt_fraction = 0.8

[[tenant]]
name = "tenant-b"
rate = 1.8
prompt_mean = 800.0
output_mean = 150.0
system_prompt_fraction = 0.8
"""

DURATION_S = 240.0


def _run(tmp: Path, family: str, seed: int = 1, text: str = THREE_MODELS) -> tuple[dict[str, Any], Traces]:
    scenario = make_scenario(family, seed, duration_s=DURATION_S, fleet=fleet_from_toml(text))
    truth = run_scenario(scenario, tmp)
    on_disk = json.loads((tmp / TRUTH_FILE).read_text())
    assert on_disk == json.loads(json.dumps(truth))
    return on_disk, Traces.read(tmp / TRACES_FILE)


def _window(truth: dict[str, Any]) -> tuple[int, int]:
    return truth["window"]["start_ns"], truth["window"]["end_ns"]


@pytest.fixture(scope="module")
def flapping(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Traces]:
    return _run(tmp_path_factory.mktemp("flapping"), "rate_limiter_flapping")


@pytest.fixture(scope="module")
def regression(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Traces]:
    return _run(tmp_path_factory.mktemp("regression"), "engine_regression", seed=2)


@pytest.fixture(scope="module")
def storm(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Traces]:
    return _run(tmp_path_factory.mktemp("storm"), "prefill_storm", seed=3)


def _step_ratio(traces: Traces, engine: str, window: tuple[int, int]) -> float:
    """Decode-only step time in the fault window over the same before it, compared between steps with the same
    number of decodes (a step's cost depends on its batch, and a fault changes the load)."""
    start, end = window
    by_size: dict[tuple[int, bool], list[int]] = defaultdict(list)
    for p in traces.steps_by_engine()[engine]:
        t = p.span.start_time_unix_nano
        if not p.attrs.get(sc.STEP_PREFILL_TOKENS) and start - (end - start) <= t < end:
            by_size[(p.attrs[sc.STEP_DECODE_TOKENS], t >= start)].extend(p.attrs[sc.STEP_DURATIONS_NS])
    ratios = [statistics.median(by_size[(n, True)]) / statistics.median(by_size[(n, False)])
              for n, inside in by_size if inside and (n, False) in by_size]
    assert len(ratios) >= 3, f"{engine}: too few batch sizes seen both before and during the window"
    return statistics.median(ratios)


def test_a_flapping_limiter_answers_429_to_several_models_at_once_while_engines_stay_normal(
        flapping: tuple[dict[str, Any], Traces]) -> None:
    truth, traces = flapping
    assert truth["root_cause"] == {"kind": "rate_limiter", "instances": ["ratelimit-0"],
                                   "models": ["llama-3-8b", "qwen-2.5-1.5b", "mixtral-8x7b"], "shared": True}
    start, end = _window(truth)
    model = traces.model_of_trace()
    rejected = [p for p in traces.named(sc.SPAN_RATE_LIMIT) if p.attrs[sc.HTTP_STATUS_CODE] == 429]
    inside = Counter(model[p.span.trace_id] for p in rejected if start <= p.span.start_time_unix_nano < end)
    outside = [p for p in rejected if not start <= p.span.start_time_unix_nano < end]
    assert len(inside) == 3 and min(inside.values()) >= 5, inside
    assert not outside
    assert {p.resource[sc.SERVICE_INSTANCE_ID] for p in rejected} == {"ratelimit-0"}
    assert sorted(truth["affected"]["models"]) == sorted(inside)
    for engine in traces.steps_by_engine():
        assert 0.8 < _step_ratio(traces, engine, (start, end)) < 1.25, engine


def test_an_engine_regression_moves_only_that_models_step_times(regression: tuple[dict[str, Any], Traces]) -> None:
    truth, traces = regression
    assert truth["root_cause"]["kind"] == "engine" and truth["negative_control"] == ["rca"]
    factor = truth["fault"]["params"]["factor"]
    slow = set(truth["root_cause"]["instances"])
    assert len(truth["root_cause"]["models"]) == 1
    window = _window(truth)
    for engine in traces.steps_by_engine():
        ratio = _step_ratio(traces, engine, window)
        if engine in slow:
            assert ratio > 0.8 * factor, (engine, ratio, factor)
        else:
            assert 0.8 < ratio < 1.25, (engine, ratio)


def test_in_a_prefill_storm_the_culprits_are_exactly_the_prefills_of_the_stalled_steps(
        storm: tuple[dict[str, Any], Traces]) -> None:
    truth, traces = storm
    steps = traces.steps_by_engine()
    stalled = truth["itl"]["stalled_steps"]
    by_step = {(s["engine"], s["step_index"]): s for s in stalled}
    start, end = _window(truth)
    checked = long_in_window = 0
    for engine, spans in steps.items():
        decode_ms = decode_step_ms(spans, 0, 1 << 63)
        tokens = token_times(spans)  # type: ignore[arg-type]
        for p in spans:
            prefills = p.attrs.get(sc.STEP_PREFILL_REQUEST_IDS, [])
            if not prefills:
                continue
            t0, t1 = p.span.start_time_unix_nano, p.span.end_time_unix_nano
            # victims from the spans: decodes in the step, or requests whose next token waited for it
            victims = set(p.attrs.get(sc.STEP_DECODE_REQUEST_IDS, []))
            if not victims:
                victims = {rid for rid, ts in tokens.items() if rid not in prefills
                           and any(t <= t0 for t in ts) and any(t >= t1 for t in ts)
                           and not any(t0 < t < t1 for t in ts)}
            truth_step = by_step.get((engine, p.attrs[sc.STEP_INDEX]))
            if truth_step is not None:
                assert [c["request"] for c in truth_step["culprits"]] == list(prefills)
                assert set(truth_step["victims"]) == victims
                assert truth_step["end_ns"] == t1 and "prefill" in truth_step["causes"]
                checked += 1
            elif victims and (t1 - t0) / 1e6 > 3 * decode_ms:
                pytest.fail(f"{engine} step {p.attrs[sc.STEP_INDEX]} stalled {len(victims)} requests for "
                            f"{(t1 - t0) / 1e6:.1f} ms but is not in the ground truth")
            long_in_window += truth_step is not None and start <= t0 < end
    assert checked == len(stalled) > 50
    assert long_in_window > 10
    surge = [s for s in stalled if any("surge" in c["request"] for c in s["culprits"])]
    assert surge and all(s["engine"] in truth["root_cause"]["instances"] for s in surge)


def test_the_cache_busting_tenants_prefix_hit_rate_falls_to_zero_while_the_others_stay(tmp_path: Path) -> None:
    truth, traces = _run(tmp_path, "cache_busting", seed=4)
    busted = truth["root_cause"]["tenant"]
    start, end = _window(truth)
    arrivals = {p.span.trace_id: p.span.start_time_unix_nano for p in traces.named(sc.SPAN_GATEWAY)}
    hits: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for p in traces.named(sc.SPAN_REQUEST):
        if sc.SYSTEM_PROMPT_ID in p.attrs:
            inside = start <= arrivals[p.span.trace_id] < end
            hits[(p.attrs[sc.TENANT_ID], inside)].append(
                p.attrs[sc.USAGE_CACHE_READ_INPUT_TOKENS] / p.attrs[sc.USAGE_INPUT_TOKENS])
    for tenant in ("tenant-a", "tenant-b"):
        before, during = statistics.mean(hits[(tenant, False)]), statistics.mean(hits[(tenant, True)])
        if tenant == busted:
            assert before > 0.3 and during < 0.01, (before, during)
        else:
            assert during > 0.7 * before > 0.2, (before, during)


def test_a_global_queue_stall_holds_its_requests_until_the_stall_ends(tmp_path: Path) -> None:
    truth, traces = _run(tmp_path, "global_queue_stall", seed=5)
    assert truth["root_cause"]["instances"] == ["global-queue-0"] and truth["root_cause"]["kind"] == "scheduler"
    start, end = _window(truth)
    held = traces.named(sc.SPAN_GLOBAL_QUEUE)
    assert not [p for p in held if start < p.span.end_time_unix_nano < end]
    entered = [p for p in held if start <= p.span.start_time_unix_nano < end]
    assert len(entered) > 50 and all(p.span.end_time_unix_nano >= end for p in entered)
    model = traces.model_of_trace()
    assert {model[p.span.trace_id] for p in entered} == {"llama-3-8b", "qwen-2.5-1.5b"}


def test_a_degraded_router_slows_only_its_own_route_spans(tmp_path: Path) -> None:
    truth, traces = _run(tmp_path, "router_degradation", seed=6)
    faulty = truth["root_cause"]["instances"][0]
    extra_ms = truth["fault"]["params"]["extra_ms"]
    start, end = _window(truth)
    durations: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for p in traces.named(sc.SPAN_ROUTE):
        inside = start <= p.span.start_time_unix_nano < end
        durations[(p.resource[sc.SERVICE_INSTANCE_ID], inside)].append(
            (p.span.end_time_unix_nano - p.span.start_time_unix_nano) / 1e6)
    for router in ("router-0", "router-1"):
        during, before = statistics.median(durations[(router, True)]), statistics.median(durations[(router, False)])
        if router == faulty:
            assert during > before + 0.7 * extra_ms
        else:
            assert during < 2 * before + 1


def test_host_pause_spikes_are_in_the_truth_as_pauses_not_prefills(tmp_path: Path) -> None:
    truth, traces = _run(tmp_path, "host_pauses", seed=7)
    engine = truth["root_cause"]["instances"][0]
    assert truth["negative_control"] == ["itl"]
    pauses = {(p["engine"], p["step_index"]): p["duration_ns"] for p in truth["itl"]["host_pauses"]}
    from_spans = {}
    for p in traces.steps_by_engine()[engine]:
        if p.attrs.get(sc.STEP_PAUSE_NS):
            last = p.attrs[sc.STEP_INDEX] + p.attrs[sc.STEP_COUNT] - 1
            from_spans[(engine, last)] = p.attrs[sc.STEP_PAUSE_NS]
            assert p.attrs[sc.STEP_DURATIONS_NS][-1] >= p.attrs[sc.STEP_PAUSE_NS]
    assert pauses == from_spans and len(pauses) >= 3
    on_engine = [s for s in truth["itl"]["stalled_steps"] if s["engine"] == engine]
    assert sum("host_pause" in s["causes"] for s in on_engine) >= 3
    assert not [s for s in on_engine if "prefill" in s["causes"]]


def test_a_preemption_storm_records_the_same_preemptions_as_the_spans(tmp_path: Path) -> None:
    truth, traces = _run(tmp_path, "preemption_storm", seed=8)
    engines = truth["root_cause"]["instances"]
    preempted = Counter((p["engine"], p["request"]) for p in truth["itl"]["preemptions"])
    from_spans: Counter[tuple[str, str]] = Counter()
    for engine, steps in traces.steps_by_engine().items():
        for p in steps:
            for rid in p.attrs.get(sc.STEP_PREEMPTED_REQUEST_IDS, []):
                from_spans[(engine, rid)] += 1
    assert preempted == from_spans and sum(preempted.values()) >= 10
    assert {e for e, _ in preempted} <= set(engines)
    assert not [s for s in truth["itl"]["stalled_steps"] if s["engine"] in engines and "prefill" in s["causes"]]


def _prefill_outcomes(truth: dict[str, Any], traces: Traces, outcome: Any) -> dict[bool, list[bool]]:
    """For the model's requests that arrived in the window: outcome(...) per request, by assistant prefill."""
    model = truth["root_cause"]["models"][0]
    start, end = _window(truth)
    gateway = {p.span.trace_id: p for p in traces.named(sc.SPAN_GATEWAY)}
    groups: dict[bool, list[bool]] = defaultdict(list)
    for p in traces.named(sc.SPAN_REQUEST):
        if p.attrs[sc.REQUEST_MODEL] == model and start <= gateway[p.span.trace_id].span.start_time_unix_nano < end:
            groups[p.attrs[sc.ASSISTANT_PREFILL_TOKENS] > 0].append(outcome(p, gateway[p.span.trace_id]))
    return groups


def test_runaway_generations_follow_the_assistant_prefill(tmp_path: Path) -> None:
    truth, traces = _run(tmp_path, "assistant_prefill_runaway", seed=8)
    assert truth["details"]["mode"] == "runaway"
    groups = _prefill_outcomes(truth, traces, lambda p, _: p.attrs[sc.RESPONSE_FINISH_REASONS] == ["length"])
    assert statistics.mean(groups[True]) > 0.5 > 0.05 > statistics.mean(groups[False])
    assert len(truth["details"]["runaway_requests"]) == sum(groups[True]) >= 20


def test_requests_with_an_assistant_prefill_fail_far_more_often_in_the_fail_variant(tmp_path: Path) -> None:
    truth, traces = _run(tmp_path, "assistant_prefill_runaway", seed=9)
    assert truth["details"]["mode"] == "fail" and "runaway_requests" not in truth["details"]
    groups = _prefill_outcomes(truth, traces, lambda _, g: g.attrs[sc.HTTP_STATUS_CODE] == 500)
    assert statistics.mean(groups[True]) > 0.5 > 0.05 > statistics.mean(groups[False])
    failed = {g.attrs[sc.REQUEST_ID] for g in traces.named(sc.SPAN_GATEWAY) if g.attrs.get(sc.ERROR_TYPE)
              == "invalid_response"}
    assert failed == set(truth["details"]["failed_requests"]) and len(failed) >= 20


def test_every_assistant_prefill_scenario_of_a_bank_hits_enough_requests_to_be_seen() -> None:
    from reference_engine.scenarios.families import RUNAWAY_MIN_AFFECTED, _model_rate

    scenarios = [s for s in bank(7, 60, 600.0, ("assistant_prefill_runaway",))]
    modes = Counter(s.fault.params["mode"] for s in scenarios if s.fault is not None)
    assert modes["fail"] >= 10 and modes["runaway"] >= 10
    for s in scenarios:
        assert s.fault is not None
        fraction = s.details["assistant_prefill_fraction"]
        expected = _model_rate(s.fleet, s.fault.target) * s.fault.param("probability") * fraction * s.fault.duration_s
        assert expected >= RUNAWAY_MIN_AFFECTED - 0.5 or fraction == 0.4, (s.name, expected)


def test_confounders_are_unrelated_smaller_faults_in_the_truth_not_the_root_cause(tmp_path: Path) -> None:
    scenario = make_scenario("router_degradation", 6, duration_s=DURATION_S, fleet=fleet_from_toml(THREE_MODELS),
                             confounders=True)
    assert scenario.confounders and scenario.fault is not None and scenario.fault.kind == "router_latency"
    assert scenario.fleet.faults[0] == scenario.fault  # the root cause's fault stays first
    clean = make_scenario("router_degradation", 6, duration_s=DURATION_S, fleet=fleet_from_toml(THREE_MODELS))
    assert clean.fault == scenario.fault and clean.root_cause == scenario.root_cause and not clean.confounders
    truth = run_scenario(scenario, tmp_path)
    assert truth["fault"]["target"] == truth["root_cause"]["instances"][0]
    start, end = _window(truth)
    for c in truth["confounders"]:
        assert not set(c["instances"]) & set(truth["root_cause"]["instances"])
        w = c["window"]
        assert w["start_ns"] < end and start < w["end_ns"]  # overlaps the incident
        assert w["end_ns"] - w["start_ns"] <= 40e9 < end - start
    # every draw over a bank: never the root cause, never another engine for a negative control
    for s in bank(5, 40, 600.0, ("router_degradation", "auth_slowdown", "engine_regression", "global_queue_stall")):
        root = set(s.root_cause["instances"])
        for c in s.confounders:
            assert not set(c["instances"]) & root
            assert not (s.negative_control and c["kind"] == "engine")
            assert c["kind"] != "engine" or not set(c["models"]) & set(s.root_cause["models"])


def test_a_tenant_scoped_latency_blip_slows_only_that_tenants_calls(tmp_path: Path) -> None:
    from dataclasses import replace

    from reference_engine.fleet.config import FaultSpec

    scenario = make_scenario("engine_regression", 2, duration_s=DURATION_S, fleet=fleet_from_toml(THREE_MODELS))
    blip = FaultSpec("auth_latency", "auth-0", 60.0, 60.0, {"extra_ms": 300.0, "tenant": "tenant-b"})
    scenario = replace(scenario, fleet=scenario.fleet.with_faults((*scenario.fleet.faults, blip)))
    truth = run_scenario(scenario, tmp_path)
    traces = Traces.read(tmp_path / TRACES_FILE)
    lo, hi = truth["start_ns"] + 60e9, truth["start_ns"] + 120e9
    slow: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for p in traces.named(sc.SPAN_AUTH):
        slow[(p.attrs[sc.TENANT_ID], lo <= p.span.start_time_unix_nano < hi)].append(
            (p.span.end_time_unix_nano - p.span.start_time_unix_nano) / 1e6)
    assert statistics.median(slow[("tenant-b", True)]) > 200 > 20 > statistics.median(slow[("tenant-a", True)])
    assert statistics.median(slow[("tenant-b", False)]) < 20


def test_the_bank_draws_every_family_and_is_reproducible() -> None:
    count = 2 * len(FAMILIES)
    first, again = bank(11, count, 300.0), bank(11, count, 300.0)
    assert first == again
    assert Counter(s.family for s in first) == dict.fromkeys(FAMILIES, 2)
    assert len({(s.fleet.model_names, repr(s.fault), repr(s.fleet.tenants)) for s in first}) == count
    windows = [s.window_s for s in first if s.window_s is not None]
    assert all(30 < a < b <= 300 * 0.92 + 1e-9 for a, b in windows)


def test_scenarios_generate_writes_traces_truth_and_an_index(tmp_path: Path) -> None:
    out = tmp_path / "bank"
    result = CliRunner().invoke(app, ["scenarios", "generate", "--out", str(out), "--seed", "3", "--count", "2",
                                      "--duration", "60", "--family", "auth_slowdown",
                                      "--family", "kv_transfer_congestion", "--no-progress"])
    assert result.exit_code == 0, result.output
    index = json.loads((out / "index.json").read_text())
    assert sorted(i["family"] for i in index) == ["auth_slowdown", "kv_transfer_congestion"]
    for item in index:
        truth = json.loads((out / item["path"] / TRUTH_FILE).read_text())
        assert truth["schema"] == "infertrace.ground_truth/1" and truth["scenario"] == item["scenario"]
        traces = Traces.read(out / item["path"] / TRACES_FILE)
        instances = {p.resource[sc.SERVICE_INSTANCE_ID] for p in traces.spans}
        assert set(truth["root_cause"]["instances"]) <= instances | {
            p.attrs.get(sc.KV_TRANSFER_LINK) for p in traces.named(sc.SPAN_KV_TRANSFER)}
    bad = CliRunner().invoke(app, ["scenarios", "generate", "--out", str(out), "--count", "0"])
    assert bad.exit_code == 2 and "--count" in bad.output
