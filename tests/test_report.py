"""The report: its JSON validates against the documented schema, its numbers are the analyzers' numbers,
filters select, recommendations cite the numbers that justify them, and the CLI's exit codes follow
--fail-on (0 / 1) and usage or I/O errors (2)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import Result
from typer.testing import CliRunner

from infertrace.analyzers.itl import analyze_itl
from infertrace.analyzers.rca import analyze_incidents
from infertrace.analyzers.slo import SloTarget, parse_target, slo_summary, with_targets
from infertrace.cli import app
from infertrace.report import FORMATS, ReportOptions, build_report, render
from infertrace.store.store import Store
from tests.incident_stores import demo_store, incident_store, sample_store

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "infertrace" / "report" / "schema.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def store() -> Store:
    with Store.open(demo_store().store) as opened:
        opened.materialize()
        yield opened


@pytest.fixture(scope="module")
def analyses(store: Store) -> tuple:
    return analyze_incidents(store), analyze_itl(store)


@pytest.fixture(scope="module")
def doc(store: Store, analyses: tuple) -> dict:
    rca, itl = analyses
    return build_report(store, rca=rca, itl=itl)


def test_json_report_validates_against_the_documented_schema(doc: dict) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.validate(json.loads(render(doc, "json")), SCHEMA, cls=jsonschema.Draft202012Validator)
    assert doc["schema"] == "infertrace.report/2"


def test_the_schema_rejects_a_document_with_an_undocumented_field(doc: dict) -> None:
    broken = json.loads(render(doc, "json"))
    broken["sections"]["slo"]["models"][0]["surprise"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_slo_percentiles_equal_a_direct_computation_over_the_relations(store: Store, doc: dict) -> None:
    ttft = store.sql("SELECT r.model, r.first_token_ns - g.start_ns FROM requests r JOIN component_calls g "
                     "ON g.trace_id = r.trace_id AND g.component = 'gateway'").fetchall()
    itl = store.sql("SELECT r.model, t.itl_ns FROM tokens t JOIN requests r USING (request_id) "
                    "WHERE t.itl_ns IS NOT NULL").fetchall()
    for m in doc["sections"]["slo"]["models"]:
        values = np.array([v for model, v in ttft if model == m["model"] and v is not None], dtype=float)
        assert m["ttft_ms"]["p99"] == pytest.approx(np.quantile(values, 0.99) / 1e6, abs=1e-3)
        values = np.array([v for model, v in itl if model == m["model"]], dtype=float)
        assert m["itl_ms"]["p50"] == pytest.approx(np.quantile(values, 0.5) / 1e6, abs=1e-3)


def test_a_target_breached_by_twice_its_value_is_critical_and_just_above_it_a_warning(store: Store) -> None:
    base = slo_summary(store)
    model = base.models[0]
    p99 = model.itl.p99_ms
    warn = slo_summary(store, targets=(SloTarget("itl", 0.99, p99 / 1.5),))
    crit = slo_summary(store, targets=(SloTarget("itl", 0.99, p99 / 2.5),))
    ok = slo_summary(store, targets=(SloTarget("itl", 0.99, p99 * 1.01),))
    assert warn.model(model.model).severity == "warning"
    assert crit.model(model.model).severity == "critical"
    assert ok.model(model.model).severity == "ok"


def test_a_request_that_reached_an_engine_and_failed_before_its_first_token_counts_as_an_engine_request() -> None:
    with Store.open(sample_store("kv_transfer_congestion").store) as sample:
        [(requests, with_first_token)] = sample.sql(
            "SELECT count(*), count(first_token_ns) FROM requests WHERE model = 'llama-3-8b'").fetchall()
        model = slo_summary(sample, model="llama-3-8b").model("llama-3-8b")
    assert requests > with_first_token  # the sample has such a request
    assert model.engine_requests == requests and model.ttft.count == with_first_token


def test_slo_targets_parse_and_override_by_metric() -> None:
    targets = with_targets([parse_target("itl_p95_ms=80"), parse_target("error_rate=0.05")])
    assert SloTarget("itl", 0.95, 80.0) in targets and SloTarget("error_rate", None, 0.05) in targets
    assert sum(t.metric == "itl" for t in targets) == 1
    for bad in ("itl=3", "ttft_p98_ms=1", "e2e_p99_ms=fast", "error_rate"):
        with pytest.raises(ValueError):
            parse_target(bad)


def test_incident_section_renders_the_rca_analyzer_ranking_unchanged(doc: dict, analyses: tuple) -> None:
    rca, _ = analyses
    rendered = doc["sections"]["incidents"]["incidents"]
    assert [i["id"] for i in rendered] == [d.incident.id for d in rca.diagnoses]
    for shown, d in zip(rendered, rca.diagnoses, strict=True):
        assert [c["id"] for c in shown["causes"]] == [c.candidate.id for c in d.causes[:5]]
        assert shown["causes"][0]["score"] == pytest.approx(d.causes[0].score, abs=1e-4)
    truth = demo_store().truth["root_cause"]
    assert rendered[0]["causes"][0]["id"] == truth["instances"][0]  # the demo's injected router


def test_itl_section_lists_the_analyzers_top_culprits(doc: dict, analyses: tuple) -> None:
    _, itl = analyses
    shown = doc["sections"]["itl"]["top_culprits"]
    assert [c["request_id"] for c in shown] == [c.request_id for c in itl.culprits[:5]]
    assert shown[0]["victim_stall_ms"] == pytest.approx(itl.culprits[0].victim_stall_ns / 1e6, abs=1e-3)
    assert doc["sections"]["itl"]["stalls"] == len(itl.stalls)


def test_recommendations_cite_the_numbers_they_rest_on(doc: dict) -> None:
    recs = {r["id"]: r for r in doc["recommendations"]}
    chunked = [r for r in recs.values() if r["id"].startswith("chunked_prefill:")]
    assert chunked, "prefill-first engines with collisions get a chunked-prefill recommendation"
    for r in chunked:
        e = r["evidence"]
        assert e["itl_p99_with_chunk_budget_ms"] < e["itl_p99_ms"]
        assert f"{e['itl_p99_ms']} ms to {e['itl_p99_with_chunk_budget_ms']} ms" in r["because"]
    engines = {e["instance"]: e for e in doc["sections"]["itl"]["engines"]}
    assert not any(r["evidence"]["instance"] == i for r in chunked for i, e in engines.items()
                   if e["stalls"]["prefill"] == 0)
    assert any(r["id"].startswith("incident:") for r in recs.values())


def test_model_and_window_filters_select_models_and_stalls(store: Store, analyses: tuple, doc: dict) -> None:
    rca, itl = analyses
    one = build_report(store, ReportOptions(model="qwen-2.5-1.5b"), rca=rca, itl=itl)
    assert [m["model"] for m in one["sections"]["slo"]["models"]] == ["qwen-2.5-1.5b"]
    assert all(e["model"] == "qwen-2.5-1.5b" for e in one["sections"]["itl"]["engines"])
    start = min(s.start_ns for s in itl.stalls)
    first_minute = build_report(store, ReportOptions(since_ns=start, until_ns=start + 60 * 10**9), rca=rca, itl=itl)
    expected = sum(1 for s in itl.stalls if s.start_ns < start + 60 * 10**9)
    assert first_minute["sections"]["itl"]["stalls"] == expected < doc["sections"]["itl"]["stalls"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_shows_the_top_cause_and_the_top_culprit(doc: dict, fmt: str) -> None:
    text = render(doc, fmt)
    top_cause = doc["sections"]["incidents"]["incidents"][0]["causes"][0]["id"]
    top_culprit = doc["sections"]["itl"]["top_culprits"][0]["request_id"]
    assert top_cause in text and top_culprit in text
    savings = doc["sections"]["prefix_cache"]["billing"]["savings"]
    assert (str(savings) if fmt == "json" else f"{savings:.6g}") in text


def test_ttft_cache_and_roofline_sections_render_their_analyzers_results(store: Store, doc: dict) -> None:
    from infertrace.analyzers.prefix_cache import analyze_prefix_cache
    from infertrace.analyzers.roofline import analyze_prefill_roofline
    from infertrace.analyzers.ttft import analyze_ttft

    ttft, cache, roofline = analyze_ttft(store), analyze_prefix_cache(store), analyze_prefill_roofline(store)
    shown = {m["model"]: m for m in doc["sections"]["ttft"]["models"]}
    for m in ttft.models:
        assert shown[m.model]["dominant"] == m.dominant
        assert shown[m.model]["ttft_p99_ms"] == pytest.approx(m.ttft_p99_ns / 1e6, abs=1e-3)
        assert shown[m.model]["shares"] == pytest.approx(m.shares, abs=1e-4)
    # the demo's router adds latency before the engine: the gateway dominates the degraded models' TTFT
    assert shown["llama-3-8b"]["dominant"] == "gateway"
    tenants = {g["key"]: g["hit_rate"] for g in doc["sections"]["prefix_cache"]["by_tenant"]}
    assert tenants == pytest.approx({g.key: g.hit_rate for g in cache.by_tenant}, abs=1e-4)
    assert doc["sections"]["prefix_cache"]["billing"]["savings"] == pytest.approx(cache.billing.savings, abs=1e-4)
    engines = doc["sections"]["prefill_throughput"]["engines"]
    assert [(e["instance"], e["diagnosis"]) for e in engines] == [(e.instance, e.diagnosis) for e in roofline.engines]


def test_cache_busting_sample_gets_a_finding_and_a_recommendation_with_the_lost_tokens() -> None:
    sample = sample_store("cache_busting")
    with Store.open(sample.store) as opened:
        doc = build_report(opened, ReportOptions(sections=("prefix_cache",)))
    busting = doc["sections"]["prefix_cache"]["busting"]
    assert {b["tenant"] for b in busting} == {sample.truth["root_cause"]["tenant"]}
    recs = [r for r in doc["recommendations"] if r["id"].startswith("cache_busting:")]
    assert len(recs) == len(busting)
    for r, b in zip(recs, busting, strict=True):
        assert f"{b['lost_cached_tokens']} cached tokens were recomputed" in r["because"]
    assert doc["severity"] == "warning"


@pytest.mark.slow
def test_a_memory_bound_prefill_micro_batch_gets_a_larger_micro_batch_recommended() -> None:
    scenario = incident_store("prefill_microbatch_misconfig", seed=1, duration_s=120)
    with Store.open(scenario.store) as opened:
        doc = build_report(opened, ReportOptions(sections=("prefill_throughput",)))
    recs = [r for r in doc["recommendations"] if r["id"].startswith("microbatch:")]
    engines = {e["instance"]: e for e in doc["sections"]["prefill_throughput"]["engines"]}
    assert recs, engines
    for r in recs:
        e = engines[r["id"].split(":", 1)[1]]
        assert e["diagnosis"] == "microbatch_memory_bound"
        assert e["model"] in scenario.truth["root_cause"]["models"]
        assert r["evidence"]["recommended_microbatch_tokens"] > r["evidence"]["microbatch_tokens"]
        assert str(e["fix_tokens_per_s"]) in r["because"]


def _cli(*args: str) -> Result:
    return CliRunner().invoke(app, ["report", *args])


@pytest.mark.slow
def test_exit_codes_follow_fail_on_and_usage_errors(tmp_path: Path) -> None:
    store = str(demo_store().store)
    quick = ("--section", "slo")
    lenient = ("--slo", "ttft_p99_ms=1e9", "--slo", "itl_p99_ms=1e9", "--slo", "e2e_p99_ms=1e9",
               "--slo", "error_rate=1", "--slo", "rejected_rate=1")
    clean = _cli("--store", store, *quick, *lenient, "--fail-on", "warning", "--format", "json")
    assert clean.exit_code == 0, clean.stderr
    assert json.loads(clean.stdout)["severity"] == "ok"
    strict = _cli("--store", store, *quick, "--slo", "itl_p99_ms=0.001", "--fail-on", "warning")
    assert strict.exit_code == 1, strict.stderr
    assert "CRITICAL" in strict.stdout
    assert _cli("--store", store, *quick, "--slo", "itl_p99_ms=0.001", "--fail-on", "never").exit_code == 0
    for args, needle in ((("--store", str(tmp_path / "nope")), "nope"),
                         (("--store", store, "--format", "pdf"), "--format"),
                         (("--store", store, "--slo", "itl=3"), "itl=3"),
                         (("--store", store, "--since", "2026-01-01T00:01:00Z", "--until", "2026-01-01T00:00:00Z"),
                          "--since"),
                         (("--store", store, "--fail-on", "sometimes"), "--fail-on"),
                         (("--store", str(tmp_path)), "no spans")):
        bad = _cli(*args)
        assert bad.exit_code == 2 and needle in bad.stderr, (args, bad.stderr)


@pytest.mark.slow
def test_full_report_exits_1_on_the_demo_incident_at_the_default_fail_on_critical() -> None:
    result = subprocess.run([sys.executable, "-m", "infertrace.cli", "report", "--store", str(demo_store().store),
                             "--format", "markdown"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "## Incidents and ranked causes" in result.stdout


def test_an_incident_no_candidate_is_blamed_for_reads_as_unexplained_not_as_its_first_candidate(
        store: Store, analyses: tuple, doc: dict) -> None:
    rca, itl = analyses
    assert rca.diagnoses and all(d.explained for d in rca.diagnoses)  # the demo's incident has a cause
    assert all(inc["explained"] for inc in doc["sections"]["incidents"]["incidents"])
    # the same incidents with nobody blamed (as in an hour whose detected burst no candidate changed for)
    nobody = replace(rca, diagnoses=tuple(replace(d, causes=tuple(replace(c, score=0.0, blamed=0.0)
                                                                  for c in d.causes)) for d in rca.diagnoses))
    unexplained = build_report(store, rca=nobody, itl=itl)
    incidents = unexplained["sections"]["incidents"]["incidents"]
    assert incidents and not any(inc["explained"] for inc in incidents)
    jsonschema.validate(unexplained, SCHEMA)
    titles = [f["title"] for f in unexplained["findings"] if f["section"] == "incidents"]
    assert titles and all("No traced component" in t and "Most likely cause" not in t for t in titles)
    actions = [r["action"] for r in unexplained["recommendations"] if r["section"] == "incidents"]
    assert actions and all(a.startswith("Look outside the traces") for a in actions)
    assert "Unexplained:" in render(unexplained, "table") and "Evidence for #1" not in render(unexplained, "table")
    assert all("Most likely cause" not in d.summary() for d in nobody.diagnoses)


def test_an_slo_target_the_store_cannot_observe_is_unchecked_not_met(tmp_path: Path) -> None:
    """vLLM's request spans without a gateway: no per-token times, no gateway to count errors and 429s. Those
    targets are `unknown`, listed as unchecked with why, and never a finding; the text says so under the table."""
    from infertrace.store.ingest import ingest_paths

    ingest_paths(tmp_path / "store", [ROOT / "tests" / "fixtures" / "sources" / "vllm_v1.jsonl"])
    with Store.open(tmp_path / "store") as vllm:
        doc = build_report(vllm, ReportOptions(sections=("slo",)))
    jsonschema.validate(json.loads(render(doc, "json")), SCHEMA, cls=jsonschema.Draft202012Validator)
    (model,) = doc["sections"]["slo"]["models"]
    severity = {c["key"]: c["severity"] for c in model["checks"]}
    assert severity == {"ttft_p99_ms": "ok", "itl_p99_ms": "unknown", "e2e_p99_ms": "ok",
                        "error_rate": "unknown", "rejected_rate": "unknown"}
    assert {u["key"]: u["why"].split(" (")[0] for u in model["unchecked"]} == {
        "itl_p99_ms": "no per-token times", "error_rate": "no gateway entry span",
        "rejected_rate": "no gateway entry span"}
    assert model["severity"] == "ok" and not doc["findings"]
    text = " ".join(render(doc, "table").split())
    assert "TTFT and E2E from the engine's request span to the first/last token (no gateway entry span)" in text
    assert "Not checked, for lack of data (the slo column is the worst of the checks made): itl_p99_ms" in text


def test_the_same_store_gives_the_same_report_whatever_the_order_its_rows_are_read_in(tmp_path: Path) -> None:
    """Two samples' engines export the same instance ids and request ids, as two runs of one deployment (or two
    environments) in one store do: the coverage warns that their steps are mixed, and what the analyses make of
    them must still be one answer, not one that changes with the order DuckDB's threads deliver the rows in
    (before, two `report`s of one such store disagreed on the ITL stalls: ties in step indexes)."""
    from infertrace.store.ingest import ingest_paths
    from infertrace.store.store import RELATIONS

    samples = ROOT / "sample_traces"
    ingest_paths(tmp_path / "store", [samples / name / "traces.jsonl.gz"
                                      for name in ("prefill_storm", "engine_regression")])
    documents = []
    for order in ("ASC", "DESC"):
        with Store.open(tmp_path / "store") as store:
            assert store.sql("SELECT count(*) FROM (SELECT instance, step_index FROM steps GROUP BY ALL "
                             "HAVING count(*) > 1)").fetchall()[0][0] > 0  # step indexes repeat: ties to break
            store.con.execute(f"CREATE TEMP TABLE read_spans AS SELECT * FROM spans "
                              f"ORDER BY hash(trace_id, span_id) {order}")
            store.con.execute("CREATE OR REPLACE VIEW spans AS SELECT * FROM read_spans")
            derived = [name for name in RELATIONS if name != "tokens"]  # tokens expands token_runs and steps
            for name in derived:  # every relation's rows in another order too, as read from its files
                store.con.execute(f"CREATE TEMP TABLE read_{name} AS SELECT * FROM {name} "
                                  f"ORDER BY hash(COLUMNS(*)) {order}")
            for name in derived:
                store.con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_{name}")
            documents.append(build_report(store))
    assert documents[0] == documents[1]
