"""What a store can answer, said out loud: the report names the analyses a store cannot support and why, counts
what ingest quarantined, and refuses a `--model`, `--tenant` or `--components` it cannot use, naming the
alternatives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertrace.cli import app
from infertrace.sources.capabilities import store_coverage
from infertrace.sources.components import load_rules, parse_rules
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from tests.incident_stores import sample_store

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "sources"


def test_a_store_of_tgi_spans_says_which_analyses_it_cannot_run_and_what_ingest_quarantined(tmp_path: Path) -> None:
    traces = tmp_path / "tgi.jsonl"
    shutil.copy(FIXTURES / "tgi.jsonl", traces)
    with traces.open("a") as f:
        f.write('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz", "spanId": "00f067aa0ba902b7", '
                '"name": "broken"}]}]}]}\n')
    ingest_paths(tmp_path / "store", [traces])
    with Store.open(tmp_path / "store") as store:
        coverage = store_coverage(store)
    assert coverage.sources == {"tgi": 1} and coverage.entry_requests == 0
    assert coverage.tokens_from_spans == 2 and coverage.step_spans == 0
    supported = {a.key: a.supported for a in coverage.analyses}
    assert supported == {"slo": True, "incidents": True, "rca_components": False, "itl": True, "ttft": True,
                         "prefix_cache": False, "prefill_throughput": False, "tokens": True}
    assert "per-token times from SGLang decode_loop or TGI send_generation spans" in coverage.analysis("itl").detail
    assert "request-only method" in coverage.analysis("itl").detail
    assert "Text Generation Inference export none" in coverage.analysis("prefix_cache").detail
    assert coverage.quarantine.records == 1 and "traceId" in coverage.quarantine.reasons[0][0]

    result = CliRunner().invoke(app, ["report", "--store", str(tmp_path / "store"), "--format", "json",
                                      "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["coverage"]["quarantine"]["records"] == 1
    itl = doc["sections"]["itl"]  # one request with two tokens: a gap, no stall, and said so
    assert (itl["method"], itl["stalls"], itl["unexplained"]) == ("request spans + token spans", 0, 0)
    assert doc["sections"]["prefix_cache"]["status"] == "unavailable"


def test_a_converted_attribute_is_counted_and_said_not_quarantined(tmp_path: Path) -> None:
    summary = ingest_paths(tmp_path / "store", [FIXTURES / "vllm_v1.jsonl"])
    assert summary.skipped == 0
    with Store.open(tmp_path / "store") as store:
        coverage = store_coverage(store)
    assert coverage.quarantine.records == 0
    assert "converted 2 attribute values to their declared type (gen_ai.response.finish_reasons: 2)" in \
        coverage.stored_with_changes
    assert any(line.startswith("Stored with changes:") for line in coverage.sentences())


def test_a_segment_that_cannot_be_read_is_said_in_the_reports_coverage_not_silently_left_out(tmp_path: Path) -> None:
    from infertrace.store.segments import list_segments

    store_dir = tmp_path / "store"
    for name in ("vllm_v1", "vllm_v0"):  # one segment each
        ingest_paths(store_dir, [FIXTURES / f"{name}.jsonl"])
    first, _ = list_segments(store_dir)
    first.write_bytes(first.read_bytes()[:100])
    result = CliRunner().invoke(app, ["report", "--store", str(store_dir), "--format", "json", "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    coverage = json.loads(result.stdout)["coverage"]
    assert coverage["unreadable_segments"] == 1
    assert "1 segment could not be read and is left out of every analysis (infertrace store check)." in \
        coverage["summary"]


def test_a_store_of_this_projects_spans_supports_every_analysis() -> None:
    with Store.open(sample_store("rate_limiter_flapping").store) as store:
        coverage = store_coverage(store)
    assert all(a.supported for a in coverage.analyses), [a for a in coverage.analyses if not a.supported]
    assert coverage.sources == {"infertrace": coverage.engine_requests} and coverage.quarantine.records == 0


@pytest.mark.parametrize(("option", "value", "hint"), [("--model", "llama-3-8", "Did you mean 'llama-3-8b'?"),
                                                       ("--tenant", "tenant-z", "Known tenants: tenant-a")])
def test_a_model_or_tenant_that_matches_nothing_exits_2_naming_the_known_values(option: str, value: str,
                                                                                 hint: str) -> None:
    store = sample_store("rate_limiter_flapping").store
    result = CliRunner().invoke(app, ["report", "--store", str(store), option, value])
    assert result.exit_code == 2
    assert f"{option} '{value}' matches no request in the store" in result.output and hint in result.output


def test_a_components_file_names_kinds_and_a_bad_one_is_refused_with_its_name_and_rule(tmp_path: Path) -> None:
    rules = load_rules(ROOT / "examples" / "components" / "litellm.toml")
    assert [(r.span, r.kind) for r in rules][:3] == [("auth", "auth"), ("proxy_pre_call", "rate_limiter"),
                                                     ("router", "router")]
    assert parse_rules({"component": [{"service": "rl", "kind": "queue"}]})[0].kind == "scheduler"
    for raw, problem in (({"component": [{"span": "x", "kind": "database"}]}, "kind must be one of"),
                         ({"component": [{"kind": "auth"}]}, "give at least one of"),
                         ({"component": [{"span": "x", "kind": "auth", "host": "h"}]}, r"unknown keys \['host'\]"),
                         ({"components": []}, "unknown top-level keys")):
        with pytest.raises(ValueError, match=problem):
            parse_rules(raw, "c.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[component]\nspan = 'x'")
    result = CliRunner().invoke(app, ["report", "--store", str(sample_store("rate_limiter_flapping").store),
                                      "--components", str(bad)])
    assert result.exit_code == 2 and f"--components {bad}: not TOML" in result.output


def _web_service_trace(path: Path, requests: int) -> None:
    """A web service's traces, as a user's export of everything holds them: server spans over database calls, no
    model named anywhere."""
    lines = []
    for i in range(requests):
        trace, start = f"{i + 1:032x}", 1_767_225_600_000_000_000 + i * 10**8
        spans = [{"traceId": trace, "spanId": f"{2 * i + 1:016x}", "name": "GET /api/items", "kind": 2,
                  "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 5 * 10**7),
                  "attributes": [{"key": "http.route", "value": {"stringValue": "/api/items"}}]},
                 {"traceId": trace, "spanId": f"{2 * i + 2:016x}", "parentSpanId": f"{2 * i + 1:016x}",
                  "name": "SELECT items", "kind": 3, "startTimeUnixNano": str(start + 10**6),
                  "endTimeUnixNano": str(start + 4 * 10**7)}]
        lines.append({"resourceSpans": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "shop-api"}}]}, "scopeSpans": [{"spans": spans}]}]})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_entry_spans_that_name_no_model_are_counted_and_no_summary_or_detection_is_claimed_on_them(
        tmp_path: Path) -> None:
    _web_service_trace(tmp_path / "web.jsonl", 40)
    ingest_paths(tmp_path / "store", [tmp_path / "web.jsonl"])
    with Store.open(tmp_path / "store") as store:
        coverage = store_coverage(store)
    assert (coverage.entry_requests, coverage.entries_without_model) == (40, 40)
    for key in ("slo", "incidents"):
        analysis = coverage.analysis(key)
        assert not analysis.supported and analysis.detail.startswith("No request names a model"), analysis
    assert any(line.startswith("40 of these entries name no model") for line in coverage.sentences())


def test_entries_whose_traces_reach_an_engine_count_as_named_by_it() -> None:
    with Store.open(sample_store("prefill_storm").store) as store:
        coverage = store_coverage(store)
    assert coverage.entry_requests > 0 and coverage.entries_without_model == 0


def test_calls_to_a_model_seen_only_by_their_client_are_counted_and_said_to_be_in_no_figure(tmp_path: Path) -> None:
    """An application's GenAI instrumentation (OpenLLMetry's OpenAI spans): CLIENT spans naming the model, in
    traces of their own. Before, the store read as holding no request at all."""
    lines = []
    for i in range(30):
        start = 1_767_225_600_000_000_000 + i * 10**9
        span = {"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": "openai.chat", "kind": 3,
                "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 2 * 10**9),
                "attributes": [{"key": "gen_ai.request.model", "value": {"stringValue": "gpt-4o"}},
                               {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "120"}}]}
        lines.append({"resourceSpans": [{"resource": {"attributes": [
            {"key": "service.name", "value": {"stringValue": "my-app"}}]}, "scopeSpans": [{"spans": [span]}]}]})
    (tmp_path / "app.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    ingest_paths(tmp_path / "store", [tmp_path / "app.jsonl"])
    with Store.open(tmp_path / "store") as store:
        coverage = store_coverage(store)
    assert coverage.client_calls == 30 and coverage.engine_requests == coverage.entry_requests == 0
    assert coverage.analysis("slo").detail.startswith("No request spans (only 30 calls seen by their clients)")
    assert any(line.startswith("30 spans are calls to a model seen by their client") for line in coverage.sentences())
    assert "Gateway: no gateway span." in coverage.sentences()
    with Store.open(sample_store("prefill_storm").store) as served:
        assert store_coverage(served).client_calls == 0  # the gateway's and engines' own spans are not clients'


def test_a_web_services_traces_beside_an_llm_fleets_are_counted_apart_from_its_requests(tmp_path: Path) -> None:
    sample = sample_store("prefill_storm")
    _web_service_trace(tmp_path / "web.jsonl", 25)
    ingest_paths(tmp_path / "store", [sample.traces, tmp_path / "web.jsonl"])
    with Store.open(sample.store) as alone, Store.open(tmp_path / "store") as mixed:
        before, after = store_coverage(alone), store_coverage(mixed)
    assert (after.entry_requests, after.entries_without_model) == (before.entry_requests + 25, 25)
    assert after.analysis("incidents").detail.startswith(
        f"Per model and tenant, from {before.entry_requests} requests at gateway entry spans.")
