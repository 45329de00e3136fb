"""The root-cause families on large fleets draw what their docstrings promise: a naive ranker ("whose own spans
changed most?") is fooled by construction, and the ground truth still names what caused the incident."""

from __future__ import annotations

import pytest

from reference_engine.fleet.config import AuthSpec, FleetSpec, RouterSpec
from reference_engine.scenarios.families import make_scenario
from reference_engine.scenarios.large_fleets import model_rates

SEEDS = range(12)


def _served(fleet: FleetSpec, component_id: str) -> AuthSpec | RouterSpec:
    return next(c for c in (*fleet.auth, *fleet.routers) if c.id == component_id)


def _tenant_share(fleet: FleetSpec, component: AuthSpec | RouterSpec, tenant: str) -> float:
    """The tenant's share of the component's traced calls (at the diurnal mean)."""
    group = fleet.auth if isinstance(component, AuthSpec) else fleet.routers
    sharing = {m: max(sum(m in c.models for c in group), 1) for m in fleet.model_names}
    rates = model_rates(fleet)
    traced = sum(rates[m] / sharing[m] for m in component.models)
    t = next(t for t in fleet.tenants if t.name == tenant)
    total = sum(t.models.values())
    mine = sum(t.synthetic.rate * w / total / sharing[m] for m, w in t.models.items() if m in component.models)
    return mine / traced


@pytest.mark.parametrize("family", ["engine_noise", "slow_ramp"])
def test_the_culprit_slows_one_tenants_calls_while_engines_on_their_path_slow_on_their_own(family: str) -> None:
    for seed in SEEDS:
        scenario = make_scenario(family, seed)
        fault = next(f for f in scenario.fleet.faults if f.kind in ("auth_latency", "router_latency"))
        tenant = str(fault.params["tenant"])
        component = _served(scenario.fleet, fault.target)
        # the culprit is the component, for that tenant's calls only: a part of its calls, so its own change is small
        assert scenario.root_cause["instances"] == [component.id]
        assert scenario.root_cause["for_tenant"] == tenant
        assert 0.0 < _tenant_share(scenario.fleet, component, tenant) <= 0.5
        # the bystander: engines of a model that tenant sends through the component, slowed for their own reasons,
        # recorded as a confounder and never as the cause
        (confounder,) = scenario.confounders
        noise = confounder["fault"]
        assert noise.kind == "engine_slowdown" and noise.param("factor") >= 2.0
        tenant_spec = next(t for t in scenario.fleet.tenants if t.name == tenant)
        assert noise.target in component.models and noise.target in tenant_spec.models
        assert not set(confounder["instances"]) & set(scenario.root_cause["instances"])
        # while the culprit's fault is on
        assert fault.start_s - 40 <= noise.start_s < fault.start_s + fault.duration_s
        assert noise.start_s + noise.duration_s > fault.start_s + fault.duration_s - 1


def test_a_slow_ramps_bystander_steps_up_partway_into_the_ramp() -> None:
    for seed in SEEDS:
        scenario = make_scenario("slow_ramp", seed)
        fault = next(f for f in scenario.fleet.faults if f.kind in ("auth_latency", "router_latency"))
        ramp = float(fault.params["ramp_s"])
        assert 180 <= ramp <= 360 and scenario.root_cause["ramp_s"] == ramp
        step = scenario.confounders[0]["fault"]
        assert fault.start_s + 0.2 * ramp <= step.start_s <= fault.start_s + 0.5 * ramp
        assert "ramp_s" not in step.params  # at once, beside the component's gradual change


def test_a_component_with_workers_keeps_headroom_for_the_tenants_slower_calls() -> None:
    for seed in SEEDS:
        scenario = make_scenario("engine_noise", seed)
        fault = next(f for f in scenario.fleet.faults if f.kind in ("auth_latency", "router_latency"))
        component = _served(scenario.fleet, fault.target)
        if not component.workers:
            continue
        group = scenario.fleet.auth if isinstance(component, AuthSpec) else scenario.fleet.routers
        sharing = {m: max(sum(m in c.models for c in group), 1) for m in scenario.fleet.model_names}
        traced = sum(model_rates(scenario.fleet)[m] / sharing[m] for m in component.models)
        busy = (traced + component.background_rps) * component.latency_ms / 1e3
        held = _tenant_share(scenario.fleet, component, str(fault.params["tenant"])) * traced * \
            fault.param("extra_ms") / 1e3
        assert (busy + held) / component.workers < 0.9
