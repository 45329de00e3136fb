"""RCAEval metrics: AC@k counts ties in expectation, so a ranking that cannot tell candidates apart scores
what chance scores; the rca section of `infertrace evaluate` scores a real (tiny) scenario bank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infertrace.analyzers.anomalies import Incident
from infertrace.analyzers.rca import IncidentDiagnosis
from infertrace.analyzers.topology import Node, Topology
from infertrace.evaluation.rca import (
    accuracy,
    apart_from_confounders,
    as_served,
    evaluate_rca,
    hit_probabilities,
    match,
    match_all,
    render_rca,
)


def test_a_true_cause_ranked_second_counts_from_ac_at_2() -> None:
    assert hit_probabilities([(3.0,), (2.0,), (1.0,)], [False, True, False], 3) == (0.0, 1.0, 1.0)


def test_ties_count_in_expectation() -> None:
    # four candidates tied: the true one is first with probability 1/4, in the top 2 with 1/2, ...
    assert hit_probabilities([(0.0,)] * 4, [True, False, False, False], 5) == (0.25, 0.5, 0.75, 1.0, 1.0)
    # one clear leader, then three tied with the true one among them
    assert hit_probabilities([(1.0,), (0.0,), (0.0,), (0.0,)], [False, False, True, False], 4) == pytest.approx(
        (0.0, 1 / 3, 2 / 3, 1.0))


def test_avg_at_5_is_the_mean_of_ac_at_1_to_5() -> None:
    result = accuracy([(0.0, 1.0, 1.0, 1.0, 1.0), (1.0, 1.0, 1.0, 1.0, 1.0)])
    assert result.ac1 == 0.5 and result.ac3 == 1.0 and result.avg5 == pytest.approx(0.9)


def _diagnosis(k: int, onset_s: float, end_s: float, models: tuple[str, ...], anomalous: int) -> IncidentDiagnosis:
    incident = Incident(k, int(onset_s * 1e9), int(end_s * 1e9), models, (), (), (), 1.0)
    return IncidentDiagnosis(incident, (incident.onset_ns, incident.end_ns), anomalous, anomalous, (), None)


def test_a_culprit_is_matched_to_the_part_covering_its_fault_when_two_parts_share_as_many_of_its_models() -> None:
    # 039-overlapping: an auth (76 s to 216 s) and a router (from 210 s) split into two parts of one incident,
    # each with 4 of the auth's 5 models; the router's part is larger but overlaps the auth's fault for 7 s only
    auth = {"models": ["a", "b", "c", "d", "e"], "window": {"start_ns": int(76e9), "end_ns": int(216e9)}}
    routers = _diagnosis(1, 209.0, 380.0, ("a", "b", "c", "d"), 453)
    auths = _diagnosis(2, 72.0, 380.0, ("b", "c", "d", "e"), 290)
    assert match([routers, auths], auth) is auths
    assert match([auths, routers], auth) is auths


def test_a_culprit_is_matched_by_the_models_it_served_not_all_it_was_configured_for() -> None:
    # 065-partial_failure: limit-tenant-d is configured for six models but tenant-d calls two; an auth confounder's
    # part has five of the six, the limiter's own part the two it served
    limiter = {"kind": "rate_limiter", "instances": ["limit-tenant-d"], "models": ["a", "b", "c", "d", "e", "f"],
               "window": {"start_ns": int(239e9), "end_ns": int(405e9)}}
    topology = Topology((Node("rate_limiter", "limit-tenant-d", ("a", "b"), ("tenant-d",), 300),
                         Node("auth", "auth-1", ("b", "c", "d", "e"), ("tenant-a", "tenant-d"), 900)), ())
    confounder = _diagnosis(1, 274.0, 405.0, ("b", "c", "d", "e", "f"), 18)
    own = _diagnosis(2, 239.0, 405.0, ("a", "b"), 29)
    assert match([confounder, own], as_served(limiter, topology)) is own


def test_a_model_a_confounders_engines_slowed_does_not_decide_which_incident_is_the_culprits() -> None:
    # 024-slow_ramp: router-2 slows tenant-b's calls to llama-3-8b and llama-3-70b; llama-3-8b's engines (a recorded
    # confounder) slow during it. The engines' incident (llama-3-8b) and the router's (llama-3-70b) share one model
    # each with the router; the engines' lasts longer. The router's incident is its own.
    window = {"start_ns": int(391e9), "end_ns": int(711e9)}
    router = {"kind": "router", "instances": ["router-2"], "models": ["llama-3-8b", "llama-3-70b"], "window": window}
    confounders = [{"kind": "engine", "models": ["llama-3-8b"], "instances": ["llama-3-8b-0"],
                    "window": {"start_ns": int(500e9), "end_ns": int(727e9)}},
                   {"kind": "auth", "models": ["llama-3-70b"], "instances": ["auth-0"],
                    "window": {"start_ns": int(420e9), "end_ns": int(460e9)}}]
    engines = _diagnosis(1, 497.0, 726.0, ("llama-3-8b",), 474)
    own = _diagnosis(2, 569.0, 726.0, ("llama-3-70b",), 4)
    assert match([engines, own], router) is engines  # on all its models: a tie, broken by the longer overlap
    assert match([engines, own], apart_from_confounders(router, confounders)) is own
    # a confounder outside the culprit's window, or one whose models are all the culprit's, leaves them all
    later = [{**confounders[0], "window": {"start_ns": int(800e9), "end_ns": int(900e9)}}]
    assert apart_from_confounders(router, later)["models"] == router["models"]
    everything = [{**confounders[0], "models": ["llama-3-8b", "llama-3-70b"]}]
    assert apart_from_confounders(router, everything)["models"] == router["models"]


@pytest.mark.slow
def test_a_small_generated_bank_is_scored(tmp_path: Path) -> None:
    from reference_engine.scenarios.bank import run_scenario
    from reference_engine.scenarios.families import make_scenario

    for k, family in enumerate(("router_degradation", "engine_regression")):
        run_scenario(make_scenario(family, 11 + k, f"{k:03d}-{family}", duration_s=300.0), tmp_path / f"{k:03d}")
    result = evaluate_rca(tmp_path)
    section = result.to_json()
    assert section["cases"] == 2
    assert set(section["baselines"]) == {"random", "highest_own_anomaly", "most_models"}
    assert set(section["onset_shift"]) == {"-60s", "+60s"}
    assert section["negative_controls"]["total"] == 1
    assert "AC@1" in render_rca(json.loads(json.dumps(section)))
    assert section["ac@1"] == 1.0, result.scenarios


@pytest.mark.slow
def test_a_gateway_named_like_litellms_gets_the_same_rca_scores_from_evaluate_as_this_projects_gateway(
        tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from infertrace.cli import app
    from tests.otlp_proto import spans

    runner = CliRunner()
    scored = {}
    for gateway in ("infertrace", "litellm"):
        bank = tmp_path / gateway
        generated = runner.invoke(app, [
            "scenarios", "generate", "--out", str(bank), "--seed", "3", "--count", "3", "--duration", "300",
            "--family", "router_degradation", "--family", "rate_limiter_flapping", "--family", "auth_slowdown",
            "--gateway-telemetry", gateway, "--no-progress"])
        assert generated.exit_code == 0, generated.output
        names = {p.span.name for p in spans(next(bank.glob("*/traces.jsonl.gz")))}
        assert ({"gateway", "route", "rate_limit"} <= names) == (gateway == "infertrace"), sorted(names)
        evaluated = runner.invoke(app, ["evaluate", str(bank), "--section", "rca", "--format", "json"])
        assert evaluated.exit_code == 0, evaluated.output
        scored[gateway] = json.loads(evaluated.stdout)["rca"]
    native, litellm = scored["infertrace"], scored["litellm"]
    assert native["cases"] == litellm["cases"] == 3
    assert (litellm["ac@1"], litellm["ac@3"]) == (native["ac@1"], native["ac@3"])
    assert [(s["scenario"], s["top"], s["hit@1"]) for s in litellm["scenarios"]] == \
        [(s["scenario"], s["top"], s["hit@1"]) for s in native["scenarios"]]


def test_two_overlapping_culprits_are_matched_to_an_incident_each_when_one_would_take_both() -> None:
    # seed 1's 093-overlapping: auth-1 (248-415 s, four models) and router-0 (349-519 s, four models, three shared)
    # were reported as two incidents, each with its own culprit first; matched alone, auth-1 went to router-0's
    # incident (3 of its models there, Jaccard 0.6, against 2 in its own, 0.5) and was scored second there
    auth = {"models": ["qwen", "mixtral", "small", "tiny"], "window": {"start_ns": int(248e9), "end_ns": int(415e9)}}
    router = {"models": ["llama", "qwen", "small", "tiny"], "window": {"start_ns": int(349e9), "end_ns": int(519e9)}}
    routers = _diagnosis(1, 349.0, 519.0, ("llama", "qwen", "small", "tiny"), 675)
    auths = _diagnosis(2, 242.0, 424.0, ("mixtral", "tiny"), 285)
    assert match([routers, auths], auth) is routers  # alone, the best key is the router's incident
    assert match_all([routers, auths], [auth, router]) == [auths, routers]
    assert match_all([routers, auths], [router, auth]) == [routers, auths]
    # with one incident for both, both get it (a merged incident: only one of them can be first there)
    assert match_all([routers], [auth, router]) == [routers, routers]
