"""Spans of several deployment environments in one store (a collector receiving staging and production): every
figure would mix them without a word. The store names the environments and says so; one environment, or none
named, says nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from infertrace.report import ReportOptions, build_report, render
from infertrace.sources.capabilities import store_coverage
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from tests.fleet_traces import rewrite_trace
from tests.test_propagation import _trace

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "infertrace" / "report" / "schema.json").read_text())


def _with_environment(tmp_path: Path, name: str, environment: Any) -> Path:
    """The fleet, each resource named with `environment(resource)` (None: left as it is)."""
    def edit(resource_spans: dict[str, Any], span: dict[str, Any]) -> None:
        env = environment(resource_spans)
        attributes = resource_spans["resource"]["attributes"]
        if env is not None and not any(a["key"] == "deployment.environment.name" for a in attributes):
            attributes.append({"key": "deployment.environment.name", "value": {"stringValue": env}})

    trace = tmp_path / f"{name}.jsonl"
    rewrite_trace(_trace(), trace, edit)
    ingest_paths(tmp_path / name, [trace])
    return tmp_path / name


def test_spans_of_two_deployment_environments_are_named_and_said_to_mix(tmp_path: Path) -> None:
    def environment(resource_spans: dict[str, Any]) -> str:
        attributes = {a["key"]: a["value"].get("stringValue") for a in resource_spans["resource"]["attributes"]}
        return "staging" if str(attributes.get("service.instance.id", "")).startswith("qwen") else "production"

    with Store.open(_with_environment(tmp_path, "mixed", environment)) as store:
        coverage = store_coverage(store)
        spans = store.sql("SELECT count(*) FROM spans").fetchall()[0][0]
        document = build_report(store, ReportOptions(sections=("slo",)))
    assert set(coverage.environments) == {"production", "staging"}
    assert sum(coverage.environments.values()) == spans
    line = next(s for s in coverage.sentences() if s.startswith("Environments:"))
    assert "the spans name 2 deployment environments, production (" in line and "Every figure mixes them" in line
    jsonschema.validate(json.loads(render(document, "json")), SCHEMA, cls=jsonschema.Draft202012Validator)
    assert document["coverage"]["environments"] == coverage.environments


def test_one_environment_or_none_named_says_nothing(tmp_path: Path) -> None:
    with Store.open(_with_environment(tmp_path, "one", lambda _: "production")) as store:
        coverage = store_coverage(store)
    assert list(coverage.environments) == ["production"]
    assert not any(s.startswith("Environments:") for s in coverage.sentences())
    with Store.open(_with_environment(tmp_path, "none", lambda _: None)) as store:
        assert store_coverage(store).environments == {}
