"""Instance ids that are not one engine's run: one id written into every replica's resource attributes, and an
engine restarted under its id. The store says which, and that the ITL attribution on it is not reliable; a fleet
configured right gets no such finding.

Each mistake is made the way an operator makes it: the same fleet run, its exporters' resource attributes (and,
for the restart, the time of the second run) changed before ingest."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import jsonschema

from infertrace.analyzers.instances import instance_problems
from infertrace.report import ReportOptions, build_report, render
from infertrace.sources.capabilities import store_coverage
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.telemetry.profiles import TelemetrySpec
from tests.fleet_traces import (
    fleet_from_toml,
    move_span,
    resource_instance,
    rewrite_trace,
    simulate_fleet,
    traces_of,
)

FLEET = """
name = "two-replicas"
region = "us-east-1"

[[router]]
id = "router-0"
models = ["llama-3-8b"]
policy = "round_robin"

[[model]]
name = "llama-3-8b"
replicas = 2
hardware = "H100-SXM"

[[tenant]]
name = "acme"
models = ["llama-3-8b"]
rate = 4.0
prompt_mean = 900.0
output_mean = 40.0
max_tokens = 96
"""
DURATION_S = 30.0
SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "infertrace" / "report" / "schema.json").read_text())
_ROOT = tempfile.TemporaryDirectory(prefix="infertrace-test-instances-")


@functools.cache
def _trace(engine: str = "infertrace") -> Path:
    path = Path(_ROOT.name) / f"{engine}.jsonl"
    simulate_fleet(fleet_from_toml(FLEET), path, DURATION_S, seed=6, telemetry=TelemetrySpec(engine, "infertrace"))
    return path


def _ingested(name: str, trace: Path) -> Path:
    root = Path(_ROOT.name) / name
    ingest_paths(root, [trace])
    return root


def _set_instance(resource_spans: dict[str, Any], instance: str) -> None:
    attributes = resource_spans["resource"]["attributes"]
    attributes[:] = [a for a in attributes if a["key"] != "service.instance.id"]
    attributes.append({"key": "service.instance.id", "value": {"stringValue": instance}})


def test_a_fleet_whose_engines_have_their_own_ids_gets_no_instance_finding() -> None:
    with Store.open(_ingested("right", _trace())) as store:
        coverage = store_coverage(store)
    assert coverage.instance_problems == ()
    assert not any(line.startswith("Instances:") for line in coverage.sentences())


def test_two_engines_under_one_id_are_found_by_their_overlapping_steps() -> None:
    def edit(resource_spans: dict[str, Any], span: dict[str, Any]) -> None:
        if resource_instance(resource_spans) == "llama-3-8b-1":
            _set_instance(resource_spans, "llama-3-8b-0")

    rewrite_trace(_trace(), Path(_ROOT.name) / "one-id.jsonl", edit)
    with Store.open(_ingested("one-id", Path(_ROOT.name) / "one-id.jsonl")) as store:
        coverage = store_coverage(store)
    [problem] = coverage.instance_problems
    assert problem.instance == "llama-3-8b-0" and problem.several_engines and problem.overlapping > 0
    assert "several engines export this service.instance.id" in problem.sentence()
    assert f"Instances: {problem.sentence()}" in coverage.sentences()
    assert "Not reliable on llama-3-8b-0: its step spans" in coverage.analysis("itl").detail


def test_an_engine_restarted_under_its_id_is_found_by_its_step_indexes_starting_over() -> None:
    """The second replica's run, moved after the first's end and given its id: the same engine, restarted."""
    served = traces_of(_trace(), "llama-3-8b-1")
    later = int((DURATION_S + 60) * 1e9)

    def edit(resource_spans: dict[str, Any], span: dict[str, Any]) -> None:
        if resource_instance(resource_spans) == "llama-3-8b-1":
            _set_instance(resource_spans, "llama-3-8b-0")
            move_span(span, later)
        elif span["traceId"] in served:
            move_span(span, later)

    rewrite_trace(_trace(), Path(_ROOT.name) / "restart.jsonl", edit)
    with Store.open(_ingested("restart", Path(_ROOT.name) / "restart.jsonl")) as store:
        [problem] = instance_problems(store)
    assert problem.instance == "llama-3-8b-0" and not problem.several_engines
    assert problem.overlapping == 0 and problem.repeated > 0
    assert "its step indexes start over" in problem.sentence()


def test_vllm_engines_under_one_id_are_found_by_their_processes() -> None:
    """vLLM exports no step spans; its resource names its process (vllm.process_id)."""
    def edit(resource_spans: dict[str, Any], span: dict[str, Any]) -> None:
        attributes = {a["key"]: a["value"] for a in resource_spans["resource"]["attributes"]}
        if "vllm.process_id" in attributes:
            _set_instance(resource_spans, "vllm-0")

    rewrite_trace(_trace("vllm-v1"), Path(_ROOT.name) / "vllm-one-id.jsonl", edit)
    with Store.open(_ingested("vllm-one-id", Path(_ROOT.name) / "vllm-one-id.jsonl")) as store:
        [problem] = instance_problems(store)
        requests = store.sql("SELECT count(DISTINCT instance) FROM requests").fetchall()[0][0]
    assert requests == 1  # what the mistake does: both engines read as one
    assert problem.instance == "vllm-0" and problem.processes == 2 and problem.step_spans == 0
    assert "its spans come from 2 processes" in problem.sentence()


def test_step_spans_an_exporter_dropped_are_counted_from_the_gaps_in_the_step_indexes() -> None:
    """Every third step span of one replica left out, as an SDK whose export queue is full drops them: the store
    counts exactly the steps between the first and the last span that no span covers, and says the ITL attribution
    is incomplete there."""
    runs: list[tuple[int, int, bool]] = []  # (first step index, steps, dropped) of each of its step spans

    def edit(resource_spans: dict[str, Any], span: dict[str, Any]) -> bool:
        if resource_instance(resource_spans) != "llama-3-8b-1" or span["name"] != "engine_step":
            return True
        attributes = {a["key"]: a["value"] for a in span["attributes"]}
        first = int(attributes["infertrace.step.index"]["intValue"])
        steps = len(attributes["infertrace.step.durations_ns"]["arrayValue"]["values"])
        runs.append((first, steps, len(runs) % 3 == 1))
        return not runs[-1][2]

    rewrite_trace(_trace(), Path(_ROOT.name) / "dropped.jsonl", edit)
    with Store.open(_ingested("dropped", Path(_ROOT.name) / "dropped.jsonl")) as store:
        coverage = store_coverage(store)
        document = build_report(store, ReportOptions(sections=("slo",)))
    kept = [first for first, _, dropped in runs if not dropped]
    expected = sum(steps for first, steps, dropped in runs if dropped and min(kept) < first < max(kept))
    [problem] = coverage.instance_problems
    assert problem.instance == "llama-3-8b-1" and not problem.mixed
    assert problem.missing_steps == expected > 0
    assert f"the store holds no engine_step span for {expected} of its" in problem.sentence()
    assert "Incomplete on llama-3-8b-1" in coverage.analysis("itl").detail
    jsonschema.validate(json.loads(render(document, "json")), SCHEMA, cls=jsonschema.Draft202012Validator)
    [entry] = document["coverage"]["instances"]
    assert entry["instance"] == "llama-3-8b-1" and entry["missing_steps"] == expected


def test_request_spans_an_exporter_dropped_are_counted_from_the_requests_that_left_the_steps() -> None:
    """Every fourth request span of one replica left out: those requests still took part in its steps and left them,
    so they finished, and the store counts them as lost (all but one that finished in the replica's last step,
    if it is among them: nothing after it shows it left)."""
    dropped = 0

    def edit(resource_spans: dict[str, Any], span: dict[str, Any]) -> bool:
        nonlocal dropped
        if resource_instance(resource_spans) != "llama-3-8b-1" or span["name"] != "llm_request":
            return True
        dropped += 1
        return dropped % 4 != 0

    rewrite_trace(_trace(), Path(_ROOT.name) / "no-requests.jsonl", edit)
    lost = dropped // 4
    with Store.open(_ingested("no-requests", Path(_ROOT.name) / "no-requests.jsonl")) as store:
        coverage = store_coverage(store)
    [problem] = coverage.instance_problems
    assert problem.instance == "llama-3-8b-1" and not problem.mixed and problem.missing_steps == 0
    assert lost - 1 <= problem.unseen_requests <= lost and lost >= 5
    assert f"no request span for {problem.unseen_requests} requests that took part in its steps" in problem.sentence()
    assert "Requests of llama-3-8b-1 whose request spans were lost are in no figure" in coverage.analysis("slo").detail
