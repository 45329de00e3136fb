"""Anomaly detection: the change-point finds a mean shift where it is; a fault whose onset falls inside a
bucket is dated to the second; overlapping anomalies on several models form one incident, separate ones
do not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infertrace.analyzers.anomalies import (
    DetectionConfig,
    detect_anomalies,
    detect_in_requests,
    load_requests,
    request_scores,
)
from infertrace.analyzers.changepoint import mean_shift
from tests.test_analyzer_rca import EPOCH, THREE, Fault, HandFleet, hand_store


def test_change_point_is_the_least_squares_mean_shift() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(0, 1, 70), rng.normal(3, 1, 30)])
    assert mean_shift(values) == 70
    assert mean_shift(values[::-1], rising=False) == 30
    assert mean_shift(np.zeros(50)) is None  # no split raises the mean


def test_a_shift_that_lowers_the_mean_is_not_an_onset() -> None:
    values = np.concatenate([np.full(40, 5.0), np.full(40, 1.0)])
    assert mean_shift(values, rising=True) is None
    assert mean_shift(values, rising=False) == 40


@pytest.fixture(scope="module")
def two_incidents(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """router-0 (models a, b) slow from 97.3 s; model-c's engines slow from 250 s: two incidents."""
    fleet = HandFleet(**THREE, faults=[Fault("router-0", 97.3, 170.0, extra_ms=300.0),
                                       Fault("model-c", 250.0, 320.0, slowdown=3.0)])
    with hand_store(tmp_path_factory.mktemp("two"), fleet) as store:
        return detect_anomalies(store), load_requests(store)


def test_an_onset_inside_a_bucket_is_dated_to_the_request(two_incidents) -> None:  # type: ignore[no-untyped-def]
    report, _ = two_incidents
    router = next(i for i in report.incidents if i.models == ("model-a", "model-b"))
    assert report.config.bucket_s == 20.0  # 97.3 s is inside the bucket [80, 100)
    assert abs(router.onset_ns - (EPOCH + 97.3e9)) < 2e9
    assert abs(router.end_ns - (EPOCH + 170e9)) < 5e9
    assert all(a.metric == "ttft" for a in router.anomalies)


def test_overlapping_models_form_one_incident_and_a_later_fault_another(two_incidents) -> None:  # type: ignore[no-untyped-def]
    report, _ = two_incidents
    assert sorted(i.models for i in report.incidents) == [("model-a", "model-b"), ("model-c",)]
    later = next(i for i in report.incidents if i.models == ("model-c",))
    assert abs(later.onset_ns - (EPOCH + 250e9)) < 3e9
    assert {a.key for a in later.tenant_anomalies} >= {"tenant-model-c"}
    shift = later.anomalies[0].shifts[0]
    assert shift.observed > 2 * shift.baseline  # the engines were made 3× slower


def test_staggered_onsets_further_apart_than_the_stagger_are_two_incidents(two_incidents) -> None:  # type: ignore[no-untyped-def]
    _, requests = two_incidents
    from infertrace.analyzers.anomalies import detect_in_requests
    tight = detect_in_requests(requests, DetectionConfig(stagger_s=1.0))
    assert len(tight.incidents) >= 2


def test_requests_in_the_fault_are_anomalous_and_the_others_mostly_not(two_incidents) -> None:  # type: ignore[no-untyped-def]
    report, requests = two_incidents
    flags = request_scores(requests, [(i.onset_ns, i.end_ns) for i in report.incidents])
    t = (requests["arrival_ns"] - EPOCH) / 1e9
    hit = requests["model"].isin(["model-a", "model-b"]) & (t > 100) & (t < 165)
    assert flags.loc[hit, "anomalous"].mean() > 0.95
    quiet = t < 90
    assert flags.loc[quiet, "anomalous"].mean() < 0.05


def test_a_component_failing_a_few_percent_of_its_calls_is_found_on_its_own_calls(tmp_path: Path) -> None:
    # router-0 carries six models' requests and fails 3% of them: one error per model every minute or two
    engines = {f"model-{c}": [f"{c}-0"] for c in "abcdef"}
    fleet = HandFleet(engines=engines, components={"router-0": ("router", list(engines))}, rate=0.7,
                      duration_s=480.0, faults=[Fault("router-0", 200.0, 380.0, fail=0.03)])
    with hand_store(tmp_path, fleet) as store:
        report = detect_anomalies(store)
    components = report.component_anomalies()
    assert [a.key for a in components] == ["router-0"] and components[0].metric == "errors"
    assert len(report.model_anomalies()) <= 2  # most models see too few errors to tell from chance
    assert all(a.peak_score < components[0].peak_score for a in report.model_anomalies())
    incident = report.incidents[0]
    assert incident.component_anomalies == components
    assert abs(incident.onset_ns - (EPOCH + 200e9)) < 30e9


def _ramping_requests(seed: int = 3) -> pd.DataFrame:
    """One model at 2 requests/s for 15 minutes, its E2E ×2.5 over a ramp from 360 s to 720 s, held to 820 s."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.5, 2000))
    t = t[t < 900.0]
    ramp = np.clip((t - 360.0) / 360.0, 0.0, 1.0) * np.log(2.5) * (t < 820.0)
    minute_noise = rng.normal(0.0, 0.08, 16)[(t // 60).astype(int)]
    e2e = np.exp(np.log(1.0e9) + ramp + minute_noise + rng.normal(0.0, 0.3, len(t)))
    arrival = EPOCH + (t * 1e9).astype(np.int64)
    return pd.DataFrame({"arrival_ns": arrival, "end_ns": arrival + e2e.astype(np.int64), "model": "model-x",
                         "tenant": "tenant-a", "resend_count": None, "ttft_ns": e2e * 0.1, "tpot_ns": e2e / 200,
                         "e2e_ns": e2e, "failed": False, "rejected": False, "truncated": False})


def test_a_slow_ramp_is_detected_though_each_bucket_is_little_above_the_last() -> None:
    report = detect_in_requests(_ramping_requests())
    found = report.model_anomalies()
    assert [a.key for a in found] == ["model-x"]
    assert 360.0 <= (found[0].onset_ns - EPOCH) / 1e9 <= 540.0  # in the first half of the ramp
