"""Fleet features of production-like topologies, read back from the exported spans: several instances of a
kind sharing a model's requests, per-tenant limiters, workers shared with untraced background load (waits
inside the span, as `infertrace.component.queue_ns`), timeouts, client retries, ramped faults, traffic surges,
diurnal traffic, and a router's backlog waiting in the global queue in front of it."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from infertrace import semconv as sc
from reference_engine.fleet.config import FleetFileError, fleet_to_toml, parse_fleet
from tests.fleet_traces import EPOCH, Traces, fleet_from_toml, simulate_fleet

BASE = """
name = "production"
region = "us-east-1"

[[auth]]
id = "auth-0"
models = ["qwen-2.5-1.5b", "tiny"]
latency_ms = 10.0
workers = 2
background_rps = 120.0
timeout_ms = 400.0

[[auth]]
id = "auth-1"
models = ["tiny"]
latency_ms = 3.0

[[rate_limiter]]
id = "limit-a"
tenants = ["a"]
requests_per_s = 4.0
burst = 6.0

[[router]]
id = "router-0"
models = ["qwen-2.5-1.5b", "tiny"]

[[model]]
name = "qwen-2.5-1.5b"

[[model]]
name = "tiny"

[[tenant]]
name = "a"
rate = 3.0
prompt_mean = 300.0
output_mean = 40.0
retries = 2
retry_backoff_s = 0.5

[[tenant]]
name = "b"
models = ["tiny"]
rate = 2.0
prompt_mean = 300.0
output_mean = 40.0
"""


def _run(tmp_path: Path, text: str, duration_s: float = 120.0, seed: int = 1) -> Traces:
    path = tmp_path / "t.jsonl"
    simulate_fleet(fleet_from_toml(text), path, duration_s, seed)
    return Traces.read(path)


def _t(span: object) -> float:
    return (span.span.start_time_unix_nano - EPOCH) / 1e9  # type: ignore[attr-defined]


def _ms(span: object) -> float:
    s = span.span  # type: ignore[attr-defined]
    return (s.end_time_unix_nano - s.start_time_unix_nano) / 1e6


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Traces:
    return _run(tmp_path_factory.mktemp("production"), BASE)


def test_two_auth_instances_share_the_requests_of_the_model_both_serve(production: Traces) -> None:
    auth = production.named(sc.SPAN_AUTH)
    by_model: dict[str, Counter[str]] = {}
    gateway = {p.span.trace_id: p.attrs[sc.REQUEST_MODEL] for p in production.named(sc.SPAN_GATEWAY)}
    for p in auth:
        by_model.setdefault(gateway[p.span.trace_id], Counter())[p.resource[sc.SERVICE_INSTANCE_ID]] += 1
    assert set(by_model["qwen-2.5-1.5b"]) == {"auth-0"}
    tiny = by_model["tiny"]
    assert set(tiny) == {"auth-0", "auth-1"}
    assert 0.35 < tiny["auth-0"] / sum(tiny.values()) < 0.65


def test_a_per_tenant_limiter_sees_only_its_tenants_calls(production: Traces) -> None:
    limited = production.named(sc.SPAN_RATE_LIMIT)
    assert limited and {p.attrs[sc.TENANT_ID] for p in limited} == {"a"}
    assert {p.resource[sc.SERVICE_INSTANCE_ID] for p in limited} == {"limit-a"}


def test_a_component_with_workers_records_its_wait_inside_its_span(production: Traces) -> None:
    waited = [p for p in production.named(sc.SPAN_AUTH) if p.resource[sc.SERVICE_INSTANCE_ID] == "auth-0"]
    queue = np.array([p.attrs[sc.COMPONENT_QUEUE_NS] for p in waited], dtype=float) / 1e6
    latency = np.array([_ms(p) for p in waited])
    assert (queue > 0).mean() > 0.2  # two workers at 60% with background load: calls often wait
    assert np.all(queue <= latency + 1e-6)  # the wait is inside the span
    others = [p for p in production.named(sc.SPAN_AUTH) if p.resource[sc.SERVICE_INSTANCE_ID] == "auth-1"]
    assert others and all(sc.COMPONENT_QUEUE_NS not in p.attrs for p in others)  # no workers: no wait
    gateway = {p.span.trace_id: p.span.start_time_unix_nano for p in production.named(sc.SPAN_GATEWAY)}
    assert all(p.span.start_time_unix_nano == gateway[p.span.trace_id] for p in waited)  # starts at arrival


def test_the_gateway_gives_up_on_a_call_past_its_timeout_and_answers_504(tmp_path: Path) -> None:
    text = BASE + """
[[fault]]
kind = "auth_latency"
target = "auth-0"
start_s = 40.0
duration_s = 40.0
extra_ms = 0.0
factor = 4.0
"""
    traces = _run(tmp_path, text)
    timeouts = [p for p in traces.named(sc.SPAN_AUTH) if p.attrs[sc.COMPONENT_OUTCOME] == "timeout"]
    # none before the fault; the backlog it leaves (background calls too) drains only afterwards
    assert timeouts and min(_t(p) for p in timeouts) >= 40
    assert all(p.attrs[sc.HTTP_STATUS_CODE] == 504 and abs(_ms(p) - 400.0) < 1e-6 for p in timeouts)
    answered = Counter(p.attrs[sc.HTTP_STATUS_CODE] for p in traces.named(sc.SPAN_GATEWAY))
    assert answered[504] >= len(timeouts)


def test_clients_retry_a_429_after_their_backoff_as_new_requests_with_a_resend_count(tmp_path: Path) -> None:
    text = BASE.replace("requests_per_s = 4.0\nburst = 6.0", "requests_per_s = 1.5\nburst = 2.0")
    traces = _run(tmp_path, text)
    gateway = {p.attrs[sc.REQUEST_ID]: p for p in traces.named(sc.SPAN_GATEWAY)}
    retries = [p for p in gateway.values() if sc.HTTP_RESEND_COUNT in p.attrs]
    assert retries and {p.attrs[sc.HTTP_RESEND_COUNT] for p in retries} == {1, 2}  # at most 2
    assert all(p.attrs[sc.TENANT_ID] == "a" for p in retries)  # tenant b does not retry
    for p in retries:
        rid = p.attrs[sc.REQUEST_ID]
        origin, k = rid.rsplit("-retry", 1)
        before = gateway[origin if k == "1" else f"{origin}-retry{int(k) - 1}"]
        assert before.attrs[sc.HTTP_STATUS_CODE] == 429
        gap = (p.span.start_time_unix_nano - before.span.end_time_unix_nano) / 1e9
        assert 0.5 * 0.5 * 2 ** (int(k) - 1) <= gap <= 1.5 * 0.5 * 2 ** (int(k) - 1) + 1e-9


def test_a_ramped_slowdown_rises_over_its_ramp(tmp_path: Path) -> None:
    text = BASE + """
[[fault]]
kind = "router_latency"
target = "router-0"
start_s = 30.0
duration_s = 80.0
extra_ms = 200.0
ramp_s = 60.0
"""
    route = _run(tmp_path, text).named(sc.SPAN_ROUTE)

    def median(lo: float, hi: float) -> float:
        return float(np.median([_ms(p) for p in route if lo <= _t(p) < hi]))

    assert median(0, 30) < 3
    assert 30 < median(40, 50) < 80  # about a quarter of the way up
    assert 120 < median(70, 80) < 170  # about three quarters
    assert 190 < median(92, 110) < 210  # all of it


def test_a_traffic_surge_multiplies_the_tenants_requests_in_its_window(tmp_path: Path) -> None:
    text = BASE + """
[[fault]]
kind = "traffic_surge"
target = "b"
start_s = 60.0
duration_s = 60.0
factor = 5.0
"""
    gateway = _run(tmp_path, text, 120.0).named(sc.SPAN_GATEWAY)
    first = [p for p in gateway if p.attrs[sc.TENANT_ID] == "b"]
    before = sum(_t(p) < 60 for p in first)
    during = sum(_t(p) >= 60 for p in first)
    assert 3.5 < during / before < 6.5


def test_diurnal_traffic_follows_its_curve(tmp_path: Path) -> None:
    text = BASE.replace('region = "us-east-1"', 'region = "us-east-1"\n[diurnal]\namplitude = 0.6\nperiod_s = 240.0')
    gateway = _run(tmp_path, text, 240.0).named(sc.SPAN_GATEWAY)
    first = [p for p in gateway if sc.HTTP_RESEND_COUNT not in p.attrs]
    peak = sum(30 <= _t(p) < 90 for p in first)  # sin > 0.5
    trough = sum(150 <= _t(p) < 210 for p in first)  # sin < -0.5
    assert peak > 2.2 * trough


def test_a_routers_backlog_waits_in_the_global_queue_in_front_of_it(tmp_path: Path) -> None:
    text = BASE.replace('[[router]]\nid = "router-0"\nmodels = ["qwen-2.5-1.5b", "tiny"]',
                        '[[global_queue]]\nid = "gq-0"\nmodels = ["qwen-2.5-1.5b", "tiny"]\n\n'
                        '[[router]]\nid = "router-0"\nmodels = ["qwen-2.5-1.5b", "tiny"]\nlatency_ms = 40.0\n'
                        'workers = 1\nbackground_rps = 10.0\njitter = 0.5')
    traces = _run(tmp_path, text)
    route = traces.named(sc.SPAN_ROUTE)
    held = np.array([_ms(p) for p in traces.named(sc.SPAN_GLOBAL_QUEUE)])
    waits = np.array([p.attrs[sc.COMPONENT_QUEUE_NS] for p in route], dtype=float) / 1e6
    assert np.median(held) > 10  # a worker at ~60% busy: requests wait for it in the queue
    assert np.median(waits) < 1  # and reach the router when it has one free


def test_new_fleet_keys_write_back_and_bad_values_name_the_place() -> None:
    text = BASE.replace('region = "us-east-1"', 'region = "us-east-1"\n[diurnal]\namplitude = 0.2\nperiod_s = 600.0')
    spec = fleet_from_toml(text)
    assert parse_fleet(tomllib.loads(fleet_to_toml(spec))) == spec
    for change, message in ((("workers = 2", "workers = -1"), "auth[0].workers: must be an integer ≥ 0"),
                            (("workers = 2\n", ""), "auth[0].background_rps: background load shares"),
                            (('tenants = ["a"]', 'tenants = ["zed"]'), "are not tenants of this fleet"),
                            (("amplitude = 0.2", "amplitude = 1.5"), "diurnal.amplitude: must be < 1"),
                            (("retries = 2", "retries = -2"), "tenant[0].retries")):
        with pytest.raises(FleetFileError) as e:
            fleet_from_toml(text.replace(*change))
        assert message in str(e.value)
