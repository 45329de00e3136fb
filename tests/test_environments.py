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


def _split_environments(resource_spans: dict[str, Any]) -> str:
    attributes = {a["key"]: a["value"].get("stringValue") for a in resource_spans["resource"]["attributes"]}
    return "staging" if str(attributes.get("service.instance.id", "")).startswith("qwen") else "production"


def test_ingest_with_resource_keeps_one_environment_whole_and_counts_what_it_left_out(tmp_path: Path) -> None:
    """`infertrace ingest --resource deployment.environment.name=production`: the store holds exactly the
    production spans of the mixed file, byte for byte the rows a store of everything holds for them."""
    from typer.testing import CliRunner

    from infertrace.cli import app

    mixed = _with_environment(tmp_path, "mixed", _split_environments)
    trace = tmp_path / "mixed.jsonl"
    result = CliRunner().invoke(app, ["ingest", "--store", str(tmp_path / "production"), "--no-progress",
                                      "--no-materialize", "--resource", "deployment.environment.name=production",
                                      str(trace)])
    assert result.exit_code == 0, result.output
    production = "coalesce(resource_attributes['deployment.environment.name'], '') = 'production'"
    columns = "trace_id, span_id, name, start_ns, end_ns, \"res.service.instance.id\""
    with Store.open(mixed) as everything, Store.open(tmp_path / "production") as kept:
        expected = sorted(everything.sql(f"SELECT {columns} FROM spans WHERE {production}").fetchall())
        others = everything.sql(f"SELECT count(*) FROM spans WHERE NOT {production}").fetchall()[0][0]
        assert sorted(kept.sql(f"SELECT {columns} FROM spans").fetchall()) == expected
        assert list(store_coverage(kept).environments) == ["production"]
    assert expected and others
    assert f"Left out {others} spans whose resource is not deployment.environment.name=production." in " ".join(
        result.output.split())


def test_ingest_resource_that_is_not_key_equals_value_is_a_usage_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from infertrace.cli import app

    result = CliRunner().invoke(app, ["ingest", "--store", str(tmp_path / "s"), "--resource", "production",
                                      str(_trace())])
    assert result.exit_code == 2
    assert "--resource 'production': expected KEY=VALUE" in " ".join(result.output.split())
    assert not (tmp_path / "s").exists()


def test_notes_follow_their_rows_when_spans_are_left_out() -> None:
    import numpy as np

    from infertrace.store.values import Notes

    notes = Notes()
    notes.add([0, 2, 5], "converted", "a")
    notes.add([3], "truncated", "b")
    kept = notes.take(np.array([2, 3, 4]))
    assert kept.counts() == {"converted": {"a": 1}, "truncated": {"b": 1}}
    assert kept.counts(np.array([0])) == {"converted": {"a": 1}}  # row 2 is now row 0
    assert kept.counts(np.array([1])) == {"truncated": {"b": 1}}
