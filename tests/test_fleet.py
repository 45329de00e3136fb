"""The fleet: one trace per request through the gateway's components into an engine, HTTP-style outcomes,
router policies, and the fleet file's errors. Everything is read back from the exported spans."""

from __future__ import annotations

import tomllib
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertrace import semconv as sc
from infertrace.cli import app
from reference_engine.fleet.config import FleetFileError, fleet_to_toml, load_fleet, parse_fleet
from tests import otlp_proto
from tests.fleet_traces import Traces, fleet_from_toml, simulate_fleet

FLEET = """
name = "test-fleet"
region = "eu-west-1"

[[auth]]
id = "auth-0"
denied_tenants = ["intruder"]

[[rate_limiter]]
id = "ratelimit-0"
requests_per_s = 2.0
burst = 4.0
models = ["llama-3-8b"]

[[rate_limiter]]
id = "ratelimit-1"
requests_per_s = 50.0
burst = 50.0
models = ["qwen-2.5-1.5b"]

[[router]]
id = "router-0"
policy = "round_robin"

[[model]]
name = "llama-3-8b"
replicas = 2

[[model]]
name = "qwen-2.5-1.5b"
replicas = 1
engine = { policy = "decode_first", chunked_prefill = true, max_num_batched_tokens = 1024 }

[[tenant]]
name = "acme"
models = { "llama-3-8b" = 1, "qwen-2.5-1.5b" = 1 }
rate = 4.0
prompt_mean = 600.0
output_mean = 80.0

[[tenant]]
name = "intruder"
models = ["qwen-2.5-1.5b"]
rate = 0.5
"""


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Traces:
    path = tmp_path_factory.mktemp("fleet") / "fleet.jsonl"
    simulate_fleet(fleet_from_toml(FLEET), path, duration_s=90, seed=3)
    return Traces.read(path)


def test_every_request_is_one_trace_rooted_at_the_gateway_with_component_children(traces: Traces) -> None:
    by_trace = traces.by_trace()
    assert len(by_trace) == len(traces.named(sc.SPAN_GATEWAY)) > 300
    for spans in by_trace.values():
        roots = [p for p in spans if not p.span.parent_span_id]
        assert [p.span.name for p in roots] == [sc.SPAN_GATEWAY]
        ids = {p.span.span_id for p in spans}
        assert all(p.span.parent_span_id in ids for p in spans if p.span.parent_span_id)
        root = roots[0].span
        for p in spans:  # children lie inside the gateway span
            assert root.start_time_unix_nano <= p.span.start_time_unix_nano <= p.span.end_time_unix_nano \
                <= root.end_time_unix_nano


def test_the_engine_request_span_is_a_child_of_the_route_span_that_chose_its_engine(traces: Traces) -> None:
    served = 0
    for spans in traces.by_trace().values():
        by_id = {p.span.span_id: p for p in spans}
        for p in spans:
            if p.span.name == sc.SPAN_REQUEST:
                route = by_id[p.span.parent_span_id]
                assert route.span.name == sc.SPAN_ROUTE
                assert route.attrs[sc.ROUTE_TARGET] == p.resource[sc.SERVICE_INSTANCE_ID]
                assert route.span.end_time_unix_nano <= p.span.start_time_unix_nano
                served += 1
    assert served > 300


def test_each_component_reports_from_its_own_resource_and_instance(traces: Traces) -> None:
    seen = defaultdict(set)
    for p in traces.spans:
        seen[p.span.name].add((p.resource[sc.COMPONENT_KIND], p.resource[sc.SERVICE_INSTANCE_ID]))
    assert seen[sc.SPAN_GATEWAY] == {("gateway", "gateway-0")}
    assert seen[sc.SPAN_AUTH] == {("auth", "auth-0")}
    assert seen[sc.SPAN_RATE_LIMIT] == {("rate_limiter", "ratelimit-0"), ("rate_limiter", "ratelimit-1")}
    assert seen[sc.SPAN_ROUTE] == {("router", "router-0")}
    assert seen[sc.SPAN_REQUEST] == {("engine", "llama-3-8b-0"), ("engine", "llama-3-8b-1"),
                                     ("engine", "qwen-2.5-1.5b-0")}
    assert all(p.resource[sc.CLOUD_REGION] == "eu-west-1" for p in traces.named(sc.SPAN_AUTH))


def test_auth_answers_401_to_a_denied_tenant_and_nobody_else(traces: Traces) -> None:
    outcomes = Counter((p.attrs[sc.TENANT_ID], p.attrs[sc.HTTP_STATUS_CODE]) for p in traces.named(sc.SPAN_AUTH))
    assert outcomes[("intruder", 401)] > 10 and outcomes[("intruder", 200)] == 0
    assert outcomes[("acme", 401)] == 0
    by_trace = traces.by_trace()
    for p in traces.named(sc.SPAN_AUTH):
        if p.attrs[sc.HTTP_STATUS_CODE] == 401:  # nothing runs after a 401
            assert {s.span.name for s in by_trace[p.span.trace_id]} == {sc.SPAN_GATEWAY, sc.SPAN_AUTH}


def test_the_token_bucket_admits_its_rate_and_answers_429_beyond(traces: Traces) -> None:
    # acme sends ~2 requests/s to llama behind a 2 requests/s bucket of 4: some 429s, most admitted;
    # the qwen limiter (50/s) never refuses.
    limited = traces.named(sc.SPAN_RATE_LIMIT)
    statuses = Counter((p.resource[sc.SERVICE_INSTANCE_ID], p.attrs[sc.HTTP_STATUS_CODE]) for p in limited)
    admitted, refused = statuses[("ratelimit-0", 200)], statuses[("ratelimit-0", 429)]
    assert refused > 5 and admitted > refused
    assert admitted <= 2.0 * 90 + 4 + 2  # never more than rate × time + burst
    assert statuses[("ratelimit-1", 429)] == 0
    gateway = {p.span.trace_id: p.attrs[sc.HTTP_STATUS_CODE] for p in traces.named(sc.SPAN_GATEWAY)}
    assert all(gateway[p.span.trace_id] == 429 for p in limited if p.attrs[sc.HTTP_STATUS_CODE] == 429)


def test_round_robin_spreads_a_models_requests_evenly_over_its_replicas(traces: Traces) -> None:
    targets = Counter(p.attrs[sc.ROUTE_TARGET] for p in traces.named(sc.SPAN_ROUTE)
                      if p.attrs[sc.ROUTE_TARGET].startswith("llama"))
    assert abs(targets["llama-3-8b-0"] - targets["llama-3-8b-1"]) <= 1


def test_the_gateway_span_carries_the_outcome_model_tenant_and_tokens(traces: Traces) -> None:
    requests = {p.attrs[sc.REQUEST_ID]: p for p in traces.named(sc.SPAN_REQUEST)}
    for g in traces.named(sc.SPAN_GATEWAY):
        if g.attrs[sc.HTTP_STATUS_CODE] == 200:
            r = requests[g.attrs[sc.REQUEST_ID]]
            assert g.attrs[sc.USAGE_OUTPUT_TOKENS] == r.attrs[sc.USAGE_OUTPUT_TOKENS]
            assert g.attrs[sc.REQUEST_MODEL] == r.attrs[sc.REQUEST_MODEL]
            assert g.span.end_time_unix_nano == r.span.end_time_unix_nano


def test_least_loaded_routing_sends_each_request_to_a_replica_with_the_fewest_in_flight(tmp_path: Path) -> None:
    text = FLEET.replace('policy = "round_robin"', 'policy = "least_loaded"').replace(
        "requests_per_s = 2.0", "requests_per_s = 50.0").replace("rate = 4.0", "rate = 12.0")
    simulate_fleet(fleet_from_toml(text), tmp_path / "ll.jsonl", duration_s=40, seed=1)
    traces = Traces.read(tmp_path / "ll.jsonl")
    ends = {p.span.trace_id: p.span.end_time_unix_nano for p in traces.named(sc.SPAN_REQUEST)}
    routes = sorted((p for p in traces.named(sc.SPAN_ROUTE) if p.attrs[sc.ROUTE_TARGET].startswith("llama")),
                    key=lambda p: p.span.start_time_unix_nano)
    busy_choices = 0
    for i, p in enumerate(routes):
        t = p.span.start_time_unix_nano
        inflight = Counter(q.attrs[sc.ROUTE_TARGET] for q in routes[:i] if ends[q.span.trace_id] > t)
        loads = [inflight[r] for r in ("llama-3-8b-0", "llama-3-8b-1")]
        assert inflight[p.attrs[sc.ROUTE_TARGET]] == min(loads)
        busy_choices += loads[0] != loads[1]
    assert busy_choices > 50  # the choice mattered many times


def test_prefix_aware_routing_keeps_a_system_prompt_on_one_replica(tmp_path: Path) -> None:
    text = FLEET.replace('policy = "round_robin"', 'policy = "prefix_aware"').replace(
        "requests_per_s = 2.0", "requests_per_s = 50.0").replace(
        'prompt_mean = 600.0', 'prompt_mean = 600.0\nsystem_prompt_fraction = 1.0\nsystem_prompts_per_tenant = 4')
    simulate_fleet(fleet_from_toml(text), tmp_path / "pa.jsonl", duration_s=60, seed=1)
    traces = Traces.read(tmp_path / "pa.jsonl")
    replicas = defaultdict(set)
    for p in traces.named(sc.SPAN_REQUEST):
        if p.attrs[sc.REQUEST_MODEL] == "llama-3-8b":
            replicas[p.attrs[sc.SYSTEM_PROMPT_ID]].add(p.resource[sc.SERVICE_INSTANCE_ID])
    assert len(replicas) == 4 and all(len(r) == 1 for r in replicas.values())
    hits = [p.attrs[sc.USAGE_CACHE_READ_INPUT_TOKENS] for p in traces.named(sc.SPAN_REQUEST)
            if p.attrs[sc.REQUEST_MODEL] == "llama-3-8b"]
    assert sum(h > 0 for h in hits) > 0.9 * len(hits)


def test_the_same_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    spec = fleet_from_toml(FLEET)
    simulate_fleet(spec, tmp_path / "a.jsonl.gz", duration_s=20, seed=5)
    simulate_fleet(spec, tmp_path / "b.jsonl.gz", duration_s=20, seed=5)
    simulate_fleet(spec, tmp_path / "c.jsonl.gz", duration_s=20, seed=6)
    a, b, c = ((tmp_path / f"{x}.jsonl.gz").read_bytes() for x in "abc")
    assert a == b != c


# ---------------------------------------------------------------------------------------- fleet files
WORKLOADS = Path(__file__).resolve().parents[2] / "shared" / "workloads"


@pytest.mark.parametrize("path", sorted(Path("examples/fleets").glob("*.toml")), ids=lambda p: p.stem)
def test_example_fleet_files_load_and_write_back_as_the_same_fleet(path: Path) -> None:
    if "shared/workloads" in path.read_text() and not WORKLOADS.is_dir():
        pytest.skip("replays ../shared/workloads, which is not beside this clone")
    spec = load_fleet(path)
    assert parse_fleet(tomllib.loads(fleet_to_toml(spec))) == spec


@pytest.mark.parametrize(("change", "message"), [
    (('name = "llama-3-8b"\nreplicas = 2', 'name = "gpt-9"\nreplicas = 2'), "unknown model 'gpt-9'"),
    (('policy = "round_robin"', 'policy = "random"'), "policy must be one of"),
    (("requests_per_s = 2.0", "requests_per_s = -2.0"), "rate_limiter[0].requests_per_s: must be > 0"),
    (("rate = 4.0", "rate = 4.0\ncolour = 3"), "tenant[0]: unknown key(s) ['colour']"),
    (('id = "router-0"', 'id = "auth-0"'), "component ids must be unique"),
])
def test_a_bad_fleet_file_names_the_place_and_the_problem(change: tuple[str, str], message: str) -> None:
    text = FLEET.replace(*change)
    assert text != FLEET
    with pytest.raises(FleetFileError) as e:
        fleet_from_toml(text)
    assert message in str(e.value)


def test_simulate_fleet_on_the_command_line_writes_traces_and_exits_2_on_bad_input(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    out = tmp_path / "out.jsonl.gz"
    runner = CliRunner()
    ok = runner.invoke(app, ["simulate", "--fleet", str(fleet), "--duration", "10", "--out", str(out),
                             "--no-progress"])
    assert ok.exit_code == 0, ok.output
    assert len(Traces.read(out).named(sc.SPAN_GATEWAY)) > 20
    fleet.write_text(FLEET.replace('replicas = 2', 'replicas = 0'))
    bad = runner.invoke(app, ["simulate", "--fleet", str(fleet), "--duration", "10", "--out", str(out)])
    assert bad.exit_code == 2
    assert "fleet.toml" in bad.output and "replicas" in bad.output
    missing = runner.invoke(app, ["simulate", "--fleet", str(tmp_path / "nope.toml"), "--duration", "10", "--out",
                                  str(out)])
    assert missing.exit_code == 2 and "nope.toml" in missing.output


def test_the_fleets_file_parses_with_the_official_otlp_parser_and_ids_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "fleet.jsonl"
    simulate_fleet(fleet_from_toml(FLEET), path, duration_s=15, seed=2)
    official = otlp_proto.spans(path)
    ours = Traces.read(path).spans
    assert len(official) == len(ours) > 100
    for a, b in zip(official, ours, strict=True):
        assert (a.span.trace_id.hex(), a.span.span_id.hex(), a.span.parent_span_id.hex()) == (
            b.span.trace_id, b.span.span_id, b.span.parent_span_id)
        assert a.span.name == b.span.name and a.attrs == b.attrs and a.resource == b.resource
