"""A gateway that does not pass its trace context on to the engines: each request becomes two traces, the
gateway's and the engine's. The store says so per model, names the engines, and says what it does to the
answers; a fleet whose context is propagated, and one whose gateway and engines serve different models (an
external API behind the gateway, engines called directly), get no such finding."""

from __future__ import annotations

import functools
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import jsonschema

from infertrace import semconv as sc
from infertrace.analyzers import query_text
from infertrace.analyzers.propagation import propagation_breaks
from infertrace.report import ReportOptions, build_report, render
from infertrace.sources.capabilities import store_coverage
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from tests.fleet_traces import fleet_from_toml, rewrite_trace, simulate_fleet
from tests.test_clocks import FLEET

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "infertrace" / "report" / "schema.json").read_text())
_ROOT = tempfile.TemporaryDirectory(prefix="infertrace-test-propagation-")


@functools.cache
def _trace() -> Path:
    path = Path(_ROOT.name) / "fleet.jsonl"
    simulate_fleet(fleet_from_toml(FLEET), path, 40.0, seed=4)
    return path


def _resource(resource_spans: dict[str, Any]) -> dict[str, str]:
    return {a["key"]: a["value"].get("stringValue", "") for a in resource_spans["resource"]["attributes"]}


def _is_engine(resource_spans: dict[str, Any], model: str | None = None) -> bool:
    resource = _resource(resource_spans)
    return resource.get(sc.COMPONENT_KIND) == "engine" and model in (None, resource.get(sc.ENGINE_MODEL))


@functools.cache
def _store(name: str) -> Path:
    """The fleet as exported when `name` is "propagated" (as simulated), "unpropagated" (no engine gets the
    gateway's traceparent: each engine request in a trace of its own), "qwen-unpropagated" (only qwen's engines),
    or "different-models" (qwen served by an API that exports nothing, llama's engines called without the
    gateway)."""
    llama_traces: set[str] = set()
    if name == "different-models":
        with _trace().open() as lines:
            llama_traces = {span["traceId"] for line in lines for rs in json.loads(line)["resourceSpans"]
                            if _is_engine(rs, "llama-3-8b") for scope in rs["scopeSpans"] for span in scope["spans"]}

    def edit(resource_spans: dict[str, Any], span: dict[str, Any]) -> bool | None:
        if name == "different-models":
            if _is_engine(resource_spans, "qwen-2.5-1.5b"):
                return False  # an external API: no spans of its own
            if not _is_engine(resource_spans) and span["traceId"] in llama_traces:
                return False  # llama's requests never passed the gateway
            return None
        model = "qwen-2.5-1.5b" if name == "qwen-unpropagated" else None
        if _is_engine(resource_spans, model) and span["name"] != sc.SPAN_STEP:
            span["traceId"] = hashlib.md5(span["traceId"].encode()).hexdigest()  # a trace of the engine's own
            if span["name"] == sc.SPAN_REQUEST:
                span.pop("parentSpanId", None)
        return None

    trace = Path(_ROOT.name) / f"{name}.jsonl"
    if name == "propagated":
        trace = _trace()
    else:
        rewrite_trace(_trace(), trace, edit)
    root = Path(_ROOT.name) / f"store-{name}"
    ingest_paths(root, [trace])
    return root


def test_a_gateway_that_does_not_propagate_its_trace_context_is_named_per_model_with_its_engines() -> None:
    with Store.open(_store("unpropagated")) as store:
        coverage = store_coverage(store)
        document = build_report(store, ReportOptions(sections=("slo", "incidents")))
        seen = dict(store.sql(f"SELECT seen_at, count(*) FROM ({query_text('request_outcomes')}) GROUP BY ALL")
                    .fetchall())
        requests = store.sql("SELECT count(*) FROM requests").fetchall()[0][0]
    jsonschema.validate(json.loads(render(document, "json")), SCHEMA, cls=jsonschema.Draft202012Validator)
    by_model = {f.model: f for f in coverage.propagation}
    assert set(by_model) == {"llama-3-8b", "qwen-2.5-1.5b"}
    llama = by_model["llama-3-8b"]
    assert llama.instances == ("llama-3-8b-0", "llama-3-8b-1", "llama-3-8b-2")
    assert llama.gateway_alone == llama.gateway_requests > 50 and llama.engine_alone == llama.engine_requests
    # what the finding says happens, happens: detection sees each request at the gateway and at its engine
    assert seen == {"entry": requests, "engine": requests}
    assert f"Trace context: {llama.sentence()}" in coverage.sentences()
    assert "the trace context (traceparent) is not passed on from the gateway to these engines" in llama.sentence()
    assert "each is counted twice, at the gateway and at its engine" in coverage.analysis("incidents").detail
    assert "their TTFT and E2E are from the engine alone" in coverage.analysis("slo").detail
    assert "none for llama-3-8b, qwen-2.5-1.5b (see Trace context)" in coverage.analysis("ttft").detail
    [entry, _] = document["coverage"]["propagation"]
    assert entry["model"] == "llama-3-8b" and entry["instances"] == list(llama.instances)
    text = " ".join(render(document, "table").split())
    assert "Trace context: llama-3-8b: " in text
    # the SLO summary's TTFT runs from the engines' spans here, and its header says so
    assert "TTFT and E2E from the engine's request span to the first/last token (no gateway entry span)" in text


def test_one_model_whose_engines_get_no_context_is_named_alone() -> None:
    with Store.open(_store("qwen-unpropagated")) as store:
        found = propagation_breaks(store)
    assert [(f.model, f.instances) for f in found] == [("qwen-2.5-1.5b", ("qwen-2.5-1.5b-0", "qwen-2.5-1.5b-1"))]


def test_a_propagated_fleet_and_a_gateway_serving_other_models_than_the_engines_get_no_finding() -> None:
    """The second: the gateway's qwen requests go to an API that exports nothing (answered, no engine span), and
    llama's engines are called directly (no gateway span): one side alone each, for different models."""
    for name in ("propagated", "different-models"):
        with Store.open(_store(name)) as store:
            alone = {side: n for side, n in store.sql(
                "SELECT side, sum(alone) FROM (" + query_text("trace_propagation") + ") GROUP BY ALL").fetchall()}
            coverage = store_coverage(store)
        assert coverage.propagation == (), name
        assert not any(line.startswith("Trace context:") for line in coverage.sentences())
        if name == "different-models":
            assert alone["gateway"] > 50 and alone["engine"] > 50  # both sides alone, but not the same models
