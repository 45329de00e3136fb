"""Root-cause ranking on incidents that fool a ranker which only asks whose own spans changed most, each run by
the real engine's fleet on a small topology and read back from a real store: a partial failure, a slow ramp,
backpressure into a global queue, a retry storm, load from one tenant, and two culprits at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from infertrace.analyzers.rca import RcaReport, analyze_incidents, describe
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from tests.fleet_traces import EPOCH, fleet_from_toml, simulate_fleet

FLEET = """
name = "small-production"
region = "us-east-1"

[[auth]]
id = "auth-0"
latency_ms = 10.0
workers = 4
background_rps = 100.0
timeout_ms = 1000.0

[[rate_limiter]]
id = "limit-a"
tenants = ["tenant-a"]
requests_per_s = 6.0
burst = 12.0

[[rate_limiter]]
id = "limit-b"
tenants = ["tenant-b"]
requests_per_s = 6.0
burst = 12.0

[[router]]
id = "router-0"
models = ["qwen-2.5-1.5b", "tiny"]

[[router]]
id = "router-1"
models = ["small"]

[[model]]
name = "qwen-2.5-1.5b"

[[model]]
name = "tiny"

[[model]]
name = "small"

[[tenant]]
name = "tenant-a"
rate = 2.5
prompt_mean = 400.0
output_mean = 60.0
retries = 2
retry_backoff_s = 0.5

[[tenant]]
name = "tenant-b"
rate = 2.5
prompt_mean = 400.0
output_mean = 60.0
retries = 2
retry_backoff_s = 0.5
"""


def _report(tmp_path: Path, faults: str, fleet: str = FLEET, duration_s: float = 420.0, seed: int = 2) -> RcaReport:
    spec = fleet_from_toml(fleet + faults)
    simulate_fleet(spec, tmp_path / "t.jsonl", duration_s=duration_s, seed=seed)
    ingest_paths(tmp_path / "store", [tmp_path / "t.jsonl"])
    with Store.open(tmp_path / "store") as store:
        return analyze_incidents(store)


def _culprit_incident(report: RcaReport, model: str):  # type: ignore[no-untyped-def]
    matching = [d for d in report.diagnoses if model in d.incident.models]
    assert matching, describe(report)
    return max(matching, key=lambda d: d.anomalous_requests)


def test_a_router_failing_a_few_percent_of_calls_is_ranked_first_over_a_sharper_blip_elsewhere(
        tmp_path: Path) -> None:
    report = _report(tmp_path, """
[[fault]]
kind = "router_latency"
target = "router-0"
start_s = 180.0
duration_s = 150.0
extra_ms = 0.0
error_rate = 0.06

[[fault]]
kind = "router_latency"
target = "router-1"
start_s = 220.0
duration_s = 25.0
extra_ms = 400.0
tenant = "tenant-a"
""")
    d = _culprit_incident(report, "qwen-2.5-1.5b")
    top = d.causes[0]
    assert top.candidate.id == "router-0", describe(report)
    assert top.own.signal == "errors" and "failed (5xx)" in top.sentence()


@pytest.mark.slow
def test_a_slow_ramp_is_dated_to_its_start_and_its_component_ranked_first(tmp_path: Path) -> None:
    fleet = FLEET.replace('id = "auth-0"\nlatency_ms = 10.0\nworkers = 4\nbackground_rps = 100.0',
                          'id = "auth-0"\nlatency_ms = 40.0\nworkers = 6\nbackground_rps = 20.0')
    report = _report(tmp_path, """
[[fault]]
kind = "auth_latency"
target = "auth-0"
start_s = 300.0
duration_s = 330.0
extra_ms = 0.0
factor = 3.5
ramp_s = 240.0
""", fleet, duration_s=800.0)
    d = _culprit_incident(report, "tiny")
    assert d.causes[0].candidate.id == "auth-0", describe(report)
    assert abs((d.incident.onset_ns - EPOCH) / 1e9 - 300.0) <= 30.0
    assert d.baseline_end_ns <= EPOCH + 300e9 + 30e9  # the baseline ends before the ramp, not once it is steep


@pytest.mark.slow
def test_a_routers_backlog_in_the_global_queue_is_blamed_on_the_router(tmp_path: Path) -> None:
    fleet = FLEET.replace('[[router]]\nid = "router-0"\nmodels = ["qwen-2.5-1.5b", "tiny"]',
                          '[[global_queue]]\nid = "queue-0"\nmodels = ["qwen-2.5-1.5b", "tiny"]\n\n'
                          '[[router]]\nid = "router-0"\nmodels = ["qwen-2.5-1.5b", "tiny"]\nlatency_ms = 12.0\n'
                          'workers = 2\nbackground_rps = 60.0\njitter = 0.6')
    report = _report(tmp_path, """
[[fault]]
kind = "router_latency"
target = "router-0"
start_s = 180.0
duration_s = 150.0
extra_ms = 0.0
factor = 2.2
""", fleet)
    d = _culprit_incident(report, "tiny")
    top = d.causes[0]
    assert top.candidate.id == "router-0", describe(report)
    assert any(how.startswith("hold in queue-0") for how, _ in top.received)
    queue = next(c for c in d.causes if c.candidate.id == "queue-0")
    assert queue.own.score > top.own.score  # the queue's wait rose more than the router's own time ...
    assert queue.score < 0.2 * top.score  # ... but it was waiting for the router


@pytest.mark.slow
def test_limiters_rejecting_the_retries_after_an_auths_timeouts_are_a_symptom_of_the_auth(tmp_path: Path) -> None:
    fleet = FLEET.replace("requests_per_s = 6.0\nburst = 12.0", "requests_per_s = 4.0\nburst = 6.0")
    report = _report(tmp_path, """
[[fault]]
kind = "auth_latency"
target = "auth-0"
start_s = 180.0
duration_s = 100.0
extra_ms = 0.0
factor = 3.5
""", fleet)
    d = _culprit_incident(report, "tiny")
    assert d.causes[0].candidate.id == "auth-0", describe(report)
    limiters = [c for c in d.causes if c.candidate.kind == "rate_limiter" and c.own.significant]
    assert all(c.score < 0.1 for c in limiters)


@pytest.mark.slow
def test_one_tenants_surge_is_answered_as_load_from_that_tenant_not_as_its_limiter(tmp_path: Path) -> None:
    report = _report(tmp_path, """
[[fault]]
kind = "traffic_surge"
target = "tenant-b"
start_s = 180.0
duration_s = 150.0
factor = 6.0
""")
    d = _culprit_incident(report, "tiny")
    top = d.causes[0]
    assert top.candidate.kind == "load" and top.candidate.tenant == "tenant-b", describe(report)
    assert top.label().startswith("load: tenant tenant-b (×")
    limiter = next(c for c in d.causes if c.candidate.id == "limit-b")
    assert limiter.own.signal == "rejections" and limiter.score < 0.1  # its 429s are the load's
    assert any(target == top.candidate.id for target, _ in limiter.passed_on)


@pytest.mark.slow
def test_two_culprits_close_together_are_two_incidents_each_with_its_own_first(tmp_path: Path) -> None:
    report = _report(tmp_path, """
[[fault]]
kind = "router_latency"
target = "router-0"
start_s = 180.0
duration_s = 150.0
extra_ms = 300.0

[[fault]]
kind = "engine_slowdown"
target = "small"
start_s = 230.0
duration_s = 120.0
factor = 3.0
""")
    router = _culprit_incident(report, "tiny")
    engines = _culprit_incident(report, "small")
    assert router is not engines
    assert router.causes[0].candidate.id == "router-0", describe(report)
    assert engines.causes[0].candidate.id == "small engines", describe(report)
