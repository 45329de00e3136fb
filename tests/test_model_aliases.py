"""A gateway that names models by aliases of its own (LiteLLM's `model_name` in front of the served model): its
entry spans say "chat-large" where the engines say "llama-3-8b". Unresolved, every model became two: the gateway's
name with the error and 429 rates and no latency, the engines' with the latency and no gateway. An alias the
traces show served by exactly one engine model is that model, on both backends, and the store says so; an alias
served by several models stays as it is."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from infertrace import semconv as sc
from infertrace.analyzers.slo import slo_summary
from infertrace.report import ReportOptions, build_report, render
from infertrace.sources.capabilities import store_coverage
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from tests.fleet_traces import rewrite_trace
from tests.test_propagation import _trace

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "infertrace" / "report" / "schema.json").read_text())
_ROOT = tempfile.TemporaryDirectory(prefix="infertrace-test-aliases-")
ALIASES = {"one each": {"llama-3-8b": "chat-large", "qwen-2.5-1.5b": "chat-small"},
           "one for both": {"llama-3-8b": "chat", "qwen-2.5-1.5b": "chat"}}


@functools.cache
def _store(name: str) -> Path:
    """The fleet with its gateway's spans naming each model by `ALIASES[name]` (its engines' spans as they are)."""
    aliases = ALIASES[name]

    def edit(resource_spans: dict[str, Any], span: dict[str, Any]) -> None:
        resource = {a["key"]: a["value"].get("stringValue") for a in resource_spans["resource"]["attributes"]}
        if resource.get(sc.COMPONENT_KIND) == "engine":
            return
        for attribute in span.get("attributes", []):
            value = attribute["value"].get("stringValue")
            if attribute["key"] == sc.REQUEST_MODEL and value in aliases:
                attribute["value"] = {"stringValue": aliases[value]}

    trace = Path(_ROOT.name) / f"{name.replace(' ', '-')}.jsonl"
    rewrite_trace(_trace(), trace, edit)
    root = Path(_ROOT.name) / f"store-{name.replace(' ', '-')}"
    ingest_paths(root, [trace])
    return root


def test_a_gateways_aliases_are_the_engines_models_in_every_figure() -> None:
    with Store.open(_store("one each")) as aliased, Store.open(_store_as_simulated()) as plain:
        slo = slo_summary(aliased)
        expected = slo_summary(plain)
        coverage = store_coverage(aliased)
        document = build_report(aliased, ReportOptions(sections=("slo", "incidents")))
        entry_models = dict(aliased.sql("SELECT model, count(*) FROM component_calls WHERE role = 'entry' "
                                        "GROUP BY ALL").fetchall())
        raw = {m for (m,) in aliased.sql("SELECT DISTINCT \"attr.gen_ai.request.model\" FROM spans WHERE "
                                         "\"attr.gen_ai.request.model\" LIKE 'chat-%'").fetchall()}
    assert raw == {"chat-large", "chat-small"}  # the spans do say the aliases
    assert [m.model for m in slo.models] == ["llama-3-8b", "qwen-2.5-1.5b"]
    for got, want in zip(slo.models, expected.models, strict=True):
        assert (got.gateway_requests, got.engine_requests, got.ttft, got.error_rate) == (
            want.gateway_requests, want.engine_requests, want.ttft, want.error_rate)
    assert set(entry_models) == {"llama-3-8b", "qwen-2.5-1.5b"}
    assert coverage.aliases == (("chat-large", "llama-3-8b", entry_models["llama-3-8b"]),
                                ("chat-small", "qwen-2.5-1.5b", entry_models["qwen-2.5-1.5b"]))
    assert any(line.startswith("Model names: the gateway's chat-large is llama-3-8b (") for line in
               coverage.sentences())
    jsonschema.validate(json.loads(render(document, "json")), SCHEMA, cls=jsonschema.Draft202012Validator)
    assert document["coverage"]["aliases"][0] == {"gateway_name": "chat-large", "model": "llama-3-8b",
                                                  "requests": entry_models["llama-3-8b"]}


def test_an_alias_served_by_several_models_is_left_as_it_is() -> None:
    with Store.open(_store("one for both")) as store:
        entry_models = {m for (m,) in store.sql("SELECT DISTINCT model FROM component_calls WHERE role = 'entry'")
                        .fetchall()}
        assert store_coverage(store).aliases == ()
    assert entry_models == {"chat"}


@pytest.mark.parametrize("name", sorted(ALIASES))
def test_the_clickhouse_form_resolves_aliases_as_the_duckdb_form(name: str) -> None:
    from infertrace.store.clickhouse.store import ClickHouseStore
    from tests.clickhouse_stores import clickhouse_relation_rows, exported

    local = str(_store(name))
    with Store.open(local) as store, ClickHouseStore.open(exported(local, f"aliases_{name}")) as clickhouse:
        expected = store.sql("SELECT * FROM component_calls ORDER BY ALL").to_arrow_table()
        got = clickhouse_relation_rows(clickhouse, "component_calls", expected)
    assert got.num_rows == expected.num_rows > 0
    assert got.equals(expected)


def _store_as_simulated() -> Path:
    root = Path(_ROOT.name) / "store-simulated"
    if not root.exists():
        ingest_paths(root, [_trace()])
    return root
