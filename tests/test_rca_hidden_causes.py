"""Causes whose own change hides over the incident as a whole: a router whose slowness shows only on the few traced
calls it served while slow, a second culprit whose onset lies after the middle of the incident it was merged
into, and a tenant's surge that moves its model's latency less than the model's own noise. Hand-built requests
and spans, read back from a real store where the ranking needs one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from infertrace.analyzers.anomalies import DetectionConfig, detect_in_requests
from infertrace.analyzers.blame import BlameContext, Blamed, blame_requests
from infertrace.analyzers.candidates import Candidate, OwnAnomaly, RcaInputs, Window, own_onset, own_signals
from infertrace.analyzers.rca import _blamed_span, _local_own, _Ranked, _split, analyze_incidents, describe
from infertrace.analyzers.signals import Signal
from tests.test_analyzer_rca import EPOCH, Fault, HandFleet, hand_store


def _held_request() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One slow request held 90 s in queue-0 and then routed by router-1 at its usual speed."""
    troubled = pd.DataFrame({"req": [0], "model": ["m"], "tenant": ["t"], "reason": ["ttft"], "http_status": [200],
                             "weight": [1.0]})
    hops = pd.DataFrame({"req": [0, 0], "kind": ["scheduler", "router"], "instance": ["queue-0", "router-1"],
                         "outcome": ["ok", "ok"], "queue_ns": [np.nan, 0.0], "latency_ns": [90e9, 11e6]})
    engines = pd.DataFrame({"req": pd.Series([], dtype=int), "instance": pd.Series([], dtype=object),
                            "engine_ttft_ns": pd.Series([], dtype=float), "failed": pd.Series([], dtype=bool)})
    return troubled, hops, engines


def test_a_queues_hold_could_come_from_the_router_it_released_to_when_looking_for_candidates() -> None:
    troubled, hops, engines = _held_request()
    ctx = BlameContext({"m": "m engines"}, significant={}, changed={"queue-0"}, router_of={0: "router-1"},
                       released_to={"queue-0": {"router-1"}}, strict=False)
    blamed = blame_requests(troubled, hops, engines, {"router-1": 11e6}, {"queue-0": 0.0}, {},
                            lambda limiter, tenant: [(limiter, 1.0)], ctx)
    assert "router-1" in blamed.mass()  # so the router is tested over the part of the incident it held
    strict = BlameContext({"m": "m engines"}, significant={}, changed={"queue-0"}, router_of={0: "router-1"},
                          released_to={"queue-0": {"router-1"}})
    blamed = blame_requests(troubled, hops, engines, {"router-1": 11e6}, {"queue-0": 0.0}, {},
                            lambda limiter, tenant: [(limiter, 1.0)], strict)
    assert blamed.mass() == {"queue-0": 1.0}  # ranking: only what changed; the router did not (yet)


def test_a_change_confined_to_the_first_quarter_of_a_long_span_is_found_by_the_scan(tmp_path: Path) -> None:
    # router-0 is slow for 30 s of a 220 s span; over the whole span its calls are mostly normal
    fleet = HandFleet(engines={"model-a": ["a-0"], "model-b": ["b-0"]},
                      components={"router-0": ("router", ["model-a", "model-b"])},
                      faults=[Fault("router-0", 140.0, 170.0, extra_ms=3.0)])
    with hand_store(tmp_path, fleet) as store:
        inputs = RcaInputs.load(store)
    arrival = inputs.requests["arrival_ns"].to_numpy()
    lo, hi = EPOCH + int(140e9), EPOCH + int(360e9)
    reqs = np.flatnonzero((arrival >= lo) & (arrival < hi))
    router = Candidate("router-0", "router", ("router-0",), ("model-a", "model-b"))
    window = Window(lo, hi, lo, (), EPOCH)
    assert not OwnAnomaly(tuple(own_signals(inputs, router, window))).significant
    local = _local_own(inputs, window, router, reqs, np.ones(len(reqs)), DetectionConfig())
    assert local is not None and local.main is not None and local.main.name == "service"
    assert local.window_ns is not None and local.window_ns[1] <= EPOCH + 250e9  # its own part, not the drain


def test_a_second_culprit_starting_after_the_middle_of_the_merged_incident_is_dated_to_its_own_start(
        tmp_path: Path) -> None:
    # router-0 slows model-a and model-b from 140 s; model-c's engines slow from 245 s, while router-0 is still
    # slow: detection merges both into one incident, whose middle lies before 245 s
    fleet = HandFleet(engines={"model-a": ["a-0"], "model-b": ["b-0"], "model-c": ["c-0"]},
                      components={"router-0": ("router", ["model-a", "model-b"]),
                                  "router-1": ("router", ["model-c"])},
                      faults=[Fault("router-0", 140.0, 330.0, extra_ms=400.0),
                              Fault("model-c", 245.0, 330.0, slowdown=3.0)], duration_s=420.0)
    with hand_store(tmp_path, fleet) as store:
        report = analyze_incidents(store)
    tops = {d.causes[0].candidate.id: d for d in report.diagnoses if d.causes}
    assert {"router-0", "model-c engines"} <= set(tops), describe(report)
    for cause, start_s in (("router-0", 140.0), ("model-c engines", 245.0)):
        onset_s = (tops[cause].incident.onset_ns - EPOCH) / 1e9
        assert abs(onset_s - start_s) <= 30.0, (cause, onset_s, describe(report))


def _requests(surge: float, everybody: float = 1.0, seed: int = 3) -> pd.DataFrame:
    """Ten minutes of first attempts: three tenants to two models, latencies noisy minute to minute and never
    worse; from 200 s to 380 s tenant-b sends `surge` times its usual traffic to model-x, and everybody
    `everybody` times theirs."""
    rng = np.random.default_rng(seed)
    rows = []
    for tenant in ("tenant-a", "tenant-b", "tenant-c"):
        for model in ("model-x", "model-y"):
            t = 0.0
            while t < 600.0:
                inside = 200.0 <= t < 380.0
                rate = 1.0 * (everybody if inside else 1.0) * (surge if inside and tenant == "tenant-b"
                                                               and model == "model-x" else 1.0)
                t += rng.exponential(1.0 / rate)
                rows.append((t, tenant, model))
    frame = pd.DataFrame(rows, columns=["t", "tenant", "model"]).sort_values("t", ignore_index=True)
    minute_noise = rng.normal(0.0, 0.2, 11)[(frame["t"].to_numpy() // 60).astype(int)]
    e2e = np.exp(np.log(1.0e9) + minute_noise + rng.normal(0.0, 0.3, len(frame)))
    arrival = EPOCH + (frame["t"].to_numpy() * 1e9).astype(np.int64)
    return pd.DataFrame({"arrival_ns": arrival, "end_ns": arrival + e2e.astype(np.int64), "model": frame["model"],
                         "tenant": frame["tenant"], "resend_count": None, "ttft_ns": e2e * 0.1, "tpot_ns": e2e / 200,
                         "e2e_ns": e2e, "failed": False, "rejected": False, "truncated": False})


def test_one_tenants_surge_to_one_model_is_an_incident_of_that_model() -> None:
    report = detect_in_requests(_requests(surge=4.0))
    assert [i.models for i in report.incidents] == [("model-x",)]
    surge = next(a for a in report.anomalies if a.scope == "traffic")
    assert surge.key == "tenant-b → model-x"
    assert abs((surge.onset_ns - EPOCH) / 1e9 - 200.0) <= 40.0
    assert abs(surge.shifts[0].observed - 4.0 / 9.0) < 0.05  # its share of everybody's first attempts: 1/6 → 4/9
    assert report.incidents[0].sentence().startswith("Incident 1: traffic to model-x surged from 00:03:")


def test_everybodys_traffic_rising_together_is_not_a_surge() -> None:
    report = detect_in_requests(_requests(surge=1.0, everybody=3.0))
    assert not [a for a in report.anomalies if a.scope == "traffic"]


def test_a_models_only_caller_always_sending_all_of_its_traffic_is_not_a_surge() -> None:
    # one tenant, one model: its share of first attempts is 100% in every bucket, which is its usual share
    requests = _requests(surge=1.0)
    requests = requests[(requests["tenant"] == "tenant-a") & (requests["model"] == "model-x")].reset_index(drop=True)
    report = detect_in_requests(requests)
    assert not [a for a in report.anomalies if a.scope == "traffic"]
    assert not report.incidents


def test_a_cause_left_with_a_handful_of_requests_after_the_split_is_no_incident_of_its_own() -> None:
    # 062-load: tenant-d's surge and its limiter each explain most of 100 troubled requests; the surge takes
    # 98 of them (its blame weighs more on each), leaving the limiter 2: those two go back to the surge's part
    significant = OwnAnomaly((Signal("rejections", "429s", 0.8, 1e-30, 0.0, 0.8, 0.0, 0.8, float("nan"), 300, 2000),))
    load = Candidate("load: tenant-d", "load", (), ("m",), "tenant-d")
    limiter = Candidate("limit-tenant-d", "rate_limiter", ("limit-tenant-d",), ("m",))
    troubled = pd.DataFrame({"req": range(100), "model": "m", "tenant": "tenant-d", "reason": "429",
                             "http_status": 429, "weight": 1.0, "flagged": True, "arrival_ns": EPOCH})
    rows = pd.DataFrame({"req": [*range(100), *range(100)],
                         "target": ["load: tenant-d"] * 100 + ["limit-tenant-d"] * 100,
                         "weight": [0.9] * 98 + [0.1] * 2 + [0.1] * 98 + [0.9] * 2, "source": "", "how": ""})
    window = Window(EPOCH, EPOCH + 10**11, EPOCH, (), EPOCH)
    ranked = _Ranked(window, {load.id: significant, limiter.id: significant}, [load, limiter],
                     Blamed(rows, 100.0), troubled, np.ones(100, dtype=bool), ("m",))
    parts = _split(ranked)
    assert [len(p) for p in parts] == [100]


def test_trouble_no_cause_explains_stays_with_a_cause_that_reaches_its_model() -> None:
    # 007-engine_noise: tiny's engines explain 80 troubled requests of tiny, auth-0 40 of big; 10 more of big are
    # explained by nobody. They go to auth-0's part, not to the larger engines' part (which would then name big)
    significant = OwnAnomaly((Signal("service", "t", 0.8, 1e-30, 1.0, 9.0, 0.0, 0.8, 2.0, 300, 2000),))
    engines = Candidate("tiny engines", "engines", ("tiny-0",), ("tiny",))
    auth = Candidate("auth-0", "auth", ("auth-0",), ("tiny", "big"))
    models = ["tiny"] * 80 + ["big"] * 50
    troubled = pd.DataFrame({"req": range(130), "model": models, "tenant": "t", "reason": "ttft",
                             "http_status": 200, "weight": 1.0, "flagged": True, "arrival_ns": EPOCH})
    rows = pd.DataFrame({"req": [*range(80), *range(80, 120)], "target": ["tiny engines"] * 80 + ["auth-0"] * 40,
                         "weight": 1.0, "source": "", "how": ""})
    window = Window(EPOCH, EPOCH + 10**11, EPOCH, (), EPOCH)
    ranked = _Ranked(window, {engines.id: significant, auth.id: significant}, [engines, auth],
                     Blamed(rows, 120.0), troubled, np.ones(130, dtype=bool), ("tiny", "big"))
    parts = _split(ranked)
    assert [len(p) for p in parts] == [80, 50]
    assert set(parts[1]) == set(range(80, 130))


def _flap_beside_a_slow_auth() -> _Ranked:
    """080-slow_ramp, reduced: auth-1 slows tenant-e's calls from 350 s to 660 s and is blamed for 40 slow requests
    of big spread over those minutes; limit-tenant-c rejects 60 calls of big and small between 570 s and 590 s, and
    is blamed for a thousandth of 30 slow requests of big around it (its latency rose a microsecond); 40 more slow
    requests of big, from 615 s to 635 s, are explained by nobody. The limiter's blame is the larger."""
    significant = OwnAnomaly((Signal("service", "t", 0.8, 1e-30, 1.0, 9.0, 0.0, 0.8, 2.0, 300, 2000),))
    auth = Candidate("auth-1", "auth", ("auth-1",), ("big", "small"))
    limiter = Candidate("limit-tenant-c", "rate_limiter", ("limit-tenant-c",), ("big", "small"))
    second = 10**9
    slow = [EPOCH + (350 + 8 * k) * second for k in range(40)]
    rejected = [EPOCH + (570 + k // 3) * second for k in range(60)]
    grazed = [EPOCH + (400 + 10 * k) * second for k in range(30)]
    unexplained = [EPOCH + 615 * second + k * second // 2 for k in range(40)]
    arrival = [*slow, *rejected, *grazed, *unexplained]
    models = ["big"] * 40 + ["big", "small"] * 30 + ["big"] * 70
    troubled = pd.DataFrame({"req": range(170), "model": models, "tenant": "t", "reason": "ttft",
                             "http_status": 200, "weight": 1.0, "flagged": True, "arrival_ns": arrival})
    rows = pd.DataFrame({"req": [*range(40), *range(40, 100), *range(100, 130)],
                         "target": ["auth-1"] * 40 + ["limit-tenant-c"] * 90,
                         "weight": [1.0] * 100 + [1e-3] * 30, "source": "", "how": ""})
    window = Window(EPOCH + 300 * second, EPOCH + 700 * second, EPOCH + 300 * second, (), EPOCH)
    return _Ranked(window, {auth.id: significant, limiter.id: significant}, [auth, limiter],
                   Blamed(rows, 170.0), troubled, np.ones(170, dtype=bool), ("big", "small"))


def test_trouble_no_cause_explains_goes_with_a_cause_at_work_when_it_arrived() -> None:
    # the unexplained slow requests of big arrived after the flap, while auth-1 was slow: they go to auth-1's part,
    # not to the limiter's (the larger, which reaches big too), which would then name big over minutes
    parts = _split(_flap_beside_a_slow_auth())
    auth_part = next(p for p in parts if 0 in p)
    assert set(range(130, 170)) <= set(auth_part)
    limiter_part = next(p for p in parts if 40 in p)
    assert not set(range(130, 170)) & set(limiter_part)


def test_a_parts_window_is_where_the_trouble_blamed_on_its_cause_arrived_by_weight() -> None:
    # the limiter is blamed for a thousandth of slow requests from 400 s to 690 s, and in full for its 429s at
    # 570-590 s: its part is dated by the 429s, not stretched over five minutes by the thousandths
    ranked = _flap_beside_a_slow_auth()
    arrival = ranked.troubled["arrival_ns"].to_numpy()
    began, ended = _blamed_span(ranked, "limit-tenant-c", np.arange(40, 130), arrival)
    assert (began - EPOCH) // 10**9 >= 570 and (ended - EPOCH) // 10**9 <= 590


def test_a_component_slowing_one_callers_calls_is_a_significant_change_of_its_own(tmp_path: Path) -> None:
    # router-0 adds 300 ms to model-f's calls only (one sixth of its calls): over all its calls a small shift
    models = [f"model-{c}" for c in "abcdef"]
    fleet = HandFleet(engines={m: [f"{m[-1]}-0"] for m in models}, components={"router-0": ("router", models)},
                      faults=[Fault("router-0", 200.0, 320.0, extra_ms=300.0, models=("model-f",))])
    with hand_store(tmp_path, fleet) as store:
        inputs = RcaInputs.load(store)
    router = Candidate("router-0", "router", ("router-0",), tuple(models))
    window = Window(EPOCH + int(200e9), EPOCH + int(320e9), EPOCH + int(200e9), (), EPOCH)
    signals = own_signals(inputs, router, window)
    whole = next(s for s in signals if s.name == "service" and not s.about)
    assert not whole.significant and whole.effect < 0.2
    sliced = next(s for s in signals if s.about)
    assert sliced.significant and sliced.about == "model=model-f" and sliced.effect > 0.8
    assert "of model-f's calls" in sliced.what
    # its onset is fitted on those calls alone
    own = OwnAnomaly(tuple(signals))
    onset = own_onset(inputs, router, own, window.lo, window.hi, EPOCH)
    assert onset is not None and abs(onset - window.lo) < 10e9


def test_no_callers_slice_is_significant_when_nothing_changed(tmp_path: Path) -> None:
    models = [f"model-{c}" for c in "abcdef"]
    fleet = HandFleet(engines={m: [f"{m[-1]}-0"] for m in models}, components={"router-0": ("router", models)})
    with hand_store(tmp_path, fleet) as store:
        inputs = RcaInputs.load(store)
    router = Candidate("router-0", "router", ("router-0",), tuple(models))
    window = Window(EPOCH + int(200e9), EPOCH + int(320e9), EPOCH + int(200e9), (), EPOCH)
    assert not any(s.significant for s in own_signals(inputs, router, window))
