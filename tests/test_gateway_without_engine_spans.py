"""A service in front of models whose engines emit no spans (vLLM traces nothing unless told to, a hosted API
traces nothing the caller sees): the service's own GenAI instrumentation (OpenLLMetry, the OpenTelemetry GenAI
conventions) names the model on its CLIENT span for the call, not on the SERVER span of the request it serves.

Before, every such request read as "names no model" and the store as holding nothing to summarise. Now an entry
takes the one model its trace's CLIENT spans call, the SLO summary gives those requests' E2E from their entry
span (no TTFT: nothing in the trace says when the first token came), and the store says both; a trace calling
two models is in no per-model figure and is said to be. Spans are made by the OpenTelemetry SDK and written as the
Collector's file exporter writes them."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from infertrace.analyzers.slo import slo_summary
from infertrace.otlp_json import message_to_otlp_json
from infertrace.report import ReportOptions, build_report
from infertrace.sources.capabilities import store_coverage
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store

_ROOT = tempfile.TemporaryDirectory(prefix="infertrace-test-gateway-alone-")
START_NS = 1_767_225_600_000_000_000
CALLS = 40  # requests calling gpt-4o: every 7th fails (HTTP 500), one in ten is slow
TWO_MODELS = 3  # requests calling gpt-4o and then a second model (an agent's plan and act)


def _span(tracer: trace.Tracer, name: str, kind: trace.SpanKind, start_ns: int, end_ns: int,
          attributes: dict[str, str | int], parent: trace.Span | None = None) -> trace.Span:
    context = trace.set_span_in_context(parent) if parent is not None else None
    span = tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=start_ns)
    span.end(end_time=end_ns)
    return span


def _requests(tracer: trace.Tracer) -> None:
    for i in range(CALLS + TWO_MODELS):
        start = START_NS + i * 2 * 10**9
        call_ns = (900 if i % 10 == 3 else 150 + 7 * i) * 10**6
        end = start + call_ns + 30 * 10**6
        server = tracer.start_span("POST /v1/answer", kind=trace.SpanKind.SERVER, start_time=start,
                                   attributes={"http.route": "/v1/answer", "http.request.method": "POST"})
        _span(tracer, "SELECT documents", trace.SpanKind.CLIENT, start + 10**6, start + 9 * 10**6,
              {"db.system": "postgresql"}, server)
        models = ["gpt-4o"] if i < CALLS else ["gpt-4o", "claude-sonnet"]
        for k, model in enumerate(models):
            _span(tracer, f"chat {model}", trace.SpanKind.CLIENT, start + (10 + k) * 10**6,
                  start + (10 + k) * 10**6 + call_ns // len(models),
                  {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                   "gen_ai.usage.input_tokens": 200 + i, "gen_ai.usage.output_tokens": 40}, server)
        failed = i < CALLS and i % 7 == 5
        server.set_attribute("http.response.status_code", 500 if failed else 200)
        if failed:
            server.set_status(Status(StatusCode.ERROR))
        server.end(end_time=end)


@functools.cache
def _store() -> Path:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "answer-api"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _requests(provider.get_tracer("answer-api"))
    traces = Path(_ROOT.name) / "answer-api.jsonl"
    traces.write_text(message_to_otlp_json(encode_spans(exporter.get_finished_spans())) + "\n")
    root = Path(_ROOT.name) / "store"
    ingest_paths(root, [traces])
    return root


def _expected_e2e_ms() -> np.ndarray:
    """The entry spans' durations of the gpt-4o requests answered without error, as `_requests` made them."""
    return np.array([(900 if i % 10 == 3 else 150 + 7 * i) + 30 for i in range(CALLS) if i % 7 != 5], dtype=float)


def test_an_entry_takes_the_one_model_its_trace_calls_and_a_trace_calling_two_takes_none() -> None:
    with Store.open(_store()) as store:
        entries = store.sql("SELECT model, count(*) FROM component_calls WHERE role = 'entry' GROUP BY ALL "
                            "ORDER BY ALL").fetchall()
        coverage = store_coverage(store)
    assert entries == [("gpt-4o", CALLS), (None, TWO_MODELS)]
    assert (coverage.entry_requests, coverage.entries_model_from_client, coverage.entries_without_model,
            coverage.entries_without_engine, coverage.engine_requests) == (CALLS + TWO_MODELS, CALLS, TWO_MODELS,
                                                                           len(_expected_e2e_ms()), 0)
    lines = coverage.sentences()
    assert f"{CALLS} of these entries take their model from the CLIENT span their trace calls it with" in " ".join(
        lines)
    assert any(line.startswith(f"{TWO_MODELS} of these entries name no model") and "called several" in line
               for line in lines)


def test_the_slo_summary_gives_their_e2e_from_the_entry_spans_and_says_they_have_no_ttft() -> None:
    with Store.open(_store()) as store:
        summary = slo_summary(store)
        coverage = store_coverage(store)
    (model,) = summary.models
    expected = _expected_e2e_ms()
    assert model.model == "gpt-4o"
    assert (model.gateway_requests, model.engine_requests, model.errors) == (CALLS, 0, CALLS // 7 + (CALLS % 7 > 5))
    assert model.e2e.count == len(expected)  # the failed requests are in the error rate, not in the latency
    assert [model.e2e.p50_ms, model.e2e.p95_ms, model.e2e.p99_ms] == pytest.approx(
        list(np.quantile(expected, [0.5, 0.95, 0.99])), abs=1e-6)  # DuckDB's quantile_cont: linear, as numpy's
    assert model.ttft.count == 0 and model.itl.count == 0
    unchecked = {c.target.metric for c in model.unchecked}
    assert unchecked == {"ttft", "itl"}
    assert f"{len(expected)} requests reach no engine span" in coverage.analysis("slo").detail


def test_the_report_counts_them_in_its_coverage() -> None:
    with Store.open(_store()) as store:
        document = build_report(store, ReportOptions(sections=("slo",)))
    coverage = document["coverage"]
    assert (coverage["gateway_requests"], coverage["gateway_requests_model_from_client"],
            coverage["gateway_requests_without_model"], coverage["gateway_requests_without_engine"]) == (
        CALLS + TWO_MODELS, CALLS, TWO_MODELS, len(_expected_e2e_ms()))


@pytest.mark.parametrize("name", ["component_calls", "slo_requests"])
def test_the_clickhouse_forms_give_the_same_rows(name: str) -> None:
    from infertrace.store.clickhouse.store import ClickHouseStore
    from tests.clickhouse_stores import DUCKDB_FORM, clickhouse_relation_rows, exported

    local = str(_store())
    with Store.open(local) as store, ClickHouseStore.open(exported(local, "gateway_alone")) as clickhouse:
        if name == "component_calls":
            expected = store.sql("SELECT * FROM component_calls ORDER BY ALL").to_arrow_table()
            got = clickhouse_relation_rows(clickhouse, name, expected)
        else:
            query, params_of = DUCKDB_FORM[name]
            expected = store.aggregate(name, query, params_of(store)).to_arrow_table()
            got = clickhouse.aggregate(name, query, params_of(store)).to_arrow_table()
            assert not clickhouse.spans_read
    assert got.num_rows == expected.num_rows > 0
    assert got.equals(expected)


def test_slowest_requests_lists_them_seen_at_the_gateway_slowest_first() -> None:
    from infertrace.runbook import run_query

    with Store.open(_store()) as store:
        frame = run_query(store, "slowest_requests", {"top": "5"})
    assert set(frame["seen_at"]) == {"gateway"} and frame["ttft_ms"].isna().all()
    durations = sorted(((900 if i % 10 == 3 else 150 + 7 * i) + 30 for i in range(CALLS + TWO_MODELS)),
                       reverse=True)  # every entry, failed ones too: the outcome column says which
    assert frame["e2e_ms"].tolist() == [float(d) for d in durations[:5]]
