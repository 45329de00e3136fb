"""What the report could not analyse reads as not analysed, never as "no problem": incident detection names the
metrics it could not score and why ("No incident" covers only the scored ones), the TTFT decomposition leaves a
component no span measured empty instead of 0, and recommendation rules whose evidence is missing are listed.
Stores: vLLM V1's own request spans without a gateway (a simulated fleet, and the two-span source fixture)."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd

from infertrace.analyzers.anomalies import detect_in_requests
from infertrace.report import ReportOptions, build_report, render
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.telemetry.profiles import TelemetrySpec
from tests.fleet_traces import fleet_from_toml, simulate_fleet

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "infertrace" / "report" / "schema.json").read_text(encoding="utf-8"))
_ROOT = tempfile.TemporaryDirectory(prefix="infertrace-test-unmeasured-")

FLEET = """
name = "vllm-alone"
region = "us-east-1"

[[model]]
name = "llama-3-8b"
replicas = 1
hardware = "H100-SXM"

[[tenant]]
name = "acme"
models = ["llama-3-8b"]
rate = 4.0
prompt_mean = 600.0
output_mean = 20.0
max_tokens = 64
"""


def _text(doc: dict) -> str:
    return " ".join(render(doc, "table").split())


@functools.cache
def _vllm_doc() -> dict:
    """Two simulated minutes of one engine exporting vLLM V1's request spans, no gateway in front."""
    root = Path(_ROOT.name)
    simulate_fleet(fleet_from_toml(FLEET), root / "vllm.jsonl", 120.0, seed=5,
                   telemetry=TelemetrySpec("vllm-v1", "none"))
    ingest_paths(root / "store", [root / "vllm.jsonl"])
    with Store.open(root / "store") as store:
        return build_report(store)


def test_no_incident_covers_only_the_metrics_detection_scored_and_names_the_rest() -> None:
    doc = _vllm_doc()
    jsonschema.validate(json.loads(render(doc, "json")), SCHEMA, cls=jsonschema.Draft202012Validator)
    section = doc["sections"]["incidents"]
    assert section["incidents"] == [] and section["models"] == ["llama-3-8b"]
    checked = [c["metric"] for c in section["checked"]]
    assert checked == ["ttft", "tpot", "e2e", "errors", "truncated"]  # the 429 rate is a gateway's answer
    (unchecked,) = section["unchecked"]
    assert unchecked["metric"] == "rate_limited" and unchecked["models"] == ["llama-3-8b"]
    assert "none of these requests passed a gateway entry span" in unchecked["why"]
    text = _text(doc)
    assert ("No incident: no model's time to first token, decode time per output token, end-to-end latency, error "
            "(5xx) rate or share of generations cut at max_tokens departed from its own baseline.") in text
    assert "Not checked: 429 rate (every model): 429s are a gateway's answers" in text


def test_a_store_too_short_to_score_says_no_metric_was_scored_instead_of_no_incident(tmp_path: Path) -> None:
    ingest_paths(tmp_path / "store", [ROOT / "tests" / "fixtures" / "sources" / "vllm_v1.jsonl"])
    with Store.open(tmp_path / "store") as store:
        doc = build_report(store)
    section = doc["sections"]["incidents"]
    assert section["checked"] == []
    assert {u["metric"] for u in section["unchecked"]} == {"ttft", "tpot", "e2e", "errors", "rate_limited",
                                                            "truncated"}
    text = _text(doc)
    assert doc["severity"] == "ok"  # no finding: but the headline says what "ok" leaves out
    assert text.startswith("INFERTRACE REPORT: OK ===================== store of 2 spans")
    assert ("[WARNING] ok covers only what this store could check. Not checked: Root cause: shared components; ITL "
            "spike attribution; Prefix cache and billing; Prefill throughput against the roofline; Per-token times; "
            "SLO targets error_rate, itl_p99_ms, rejected_rate; incident detection on time to first token,") in text
    assert "No incident: no model's" not in text
    assert "No incident found, but no metric could be scored: nothing here says the fleet was healthy." in text
    assert "too little traffic: 0 buckets of 20 s with 3 or more such requests, 4 are needed" in text
    assert "too little traffic: 1 bucket of 20 s with requests, 4 are needed" in text


def test_detection_names_per_model_what_it_could_not_score() -> None:
    """One model behind a gateway with steady traffic, one seen only at its engine with a request a minute: the
    first is scored on every metric; the second only on its error rate (a rate needs buckets, not requests in
    each), each other metric with its reason."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(600):  # ten minutes, one request a second, through a gateway
        arrival = i * 1_000_000_000
        rows.append(("busy", "entry", arrival, "stop", float(rng.uniform(20e6, 30e6)), 5e6))
    for i in range(10):  # a request a minute, engine spans only, no finish reason
        rows.append(("quiet", "engine", i * 60_000_000_000, None, 25e6, np.nan))
    frame = pd.DataFrame(rows, columns=["model", "seen_at", "arrival_ns", "finish_reason", "ttft_ns", "tpot_ns"])
    frame = frame.assign(
        tenant="t", end_ns=frame["arrival_ns"] + 200_000_000, e2e_ns=200_000_000.0, failed=False, rejected=False,
        truncated=False, resend_count=np.nan).sort_values("arrival_ns", kind="stable", ignore_index=True)
    report = detect_in_requests(frame)
    assert report.checked() == ("ttft", "tpot", "e2e", "errors", "rate_limited", "truncated")
    why = {u.metric: (u.models, u.why) for u in report.unchecked}
    assert set(why) == {"ttft", "tpot", "e2e", "rate_limited", "truncated"}
    assert all(models == ("quiet",) for models, _ in why.values())
    assert why["tpot"][1] == "no request has a decode time with two or more output tokens"
    assert why["truncated"][1] == "no span gives a finish reason"
    assert why["rate_limited"][1].startswith("429s are a gateway's answers")
    assert why["ttft"][1] == "too little traffic: 0 buckets of 20 s with 3 or more such requests, 4 are needed"
    assert why["e2e"][1] == why["ttft"][1]


def test_ttft_components_no_span_measured_are_empty_not_zero() -> None:
    """Without a gateway span there is no gateway share, and without step spans no split of the prefill into its
    own compute and waiting: those shares are null ('-' in the table) and the whole prefill has a share of its own,
    instead of a gateway of 0 and a prefill_wait of 0."""
    doc = _vllm_doc()
    (model,) = doc["sections"]["ttft"]["models"]
    shares = model["shares"]
    assert shares["gateway"] is None and shares["prefill_compute"] is None and shares["prefill_wait"] is None
    assert shares["kv_transfer"] == 0  # colocated: there is no transfer, which is known
    assert shares["queue"] > 0 and shares["prefill"] > 0
    assert abs(sum(v for v in shares.values() if v is not None) - 1) < 1e-3
    assert model["dominant"] in ("queue", "prefill")
    text = _text(doc)
    assert "TTFT from the engine's arrival: no gateway span" in text
    assert "'-': not measured (gateway: no gateway span; prefill_compute, prefill_wait: no step spans" in text
    assert "No engine fitted: a fit needs each request's own prefill compute time, from step spans" in text


def test_recommendation_rules_without_their_evidence_are_listed_as_not_evaluated() -> None:
    doc = _vllm_doc()
    text = _text(doc)
    assert "Not evaluated, for lack of data: Chunked prefill and prefill/decode disaggregation: ITL attribution " \
           "needs engine_step spans" in text
    assert "Prefill micro-batch: Prefill throughput needs engine_step spans" in text
    assert "Cache busting: Prefix-cache hit rates need a cached-token count per request" in text
    only_slo = build_report_sections(("slo",))
    assert "Not evaluated" not in _text(only_slo)  # a section left out on request is not a lack of data


def build_report_sections(sections: tuple[str, ...]) -> dict:
    with Store.open(Path(_ROOT.name) / "store") as store:
        return build_report(store, ReportOptions(sections=sections))


def test_cache_busting_on_spans_naming_no_system_prompt_is_not_checked_not_absent() -> None:
    """Our fleet's engines count cached tokens but the vLLM-profile ones do not; neither names a system prompt.
    Cache busting compares hits on a named system prompt, so it was not looked for: the report says so instead of
    "No cache busting detected", and lists the rule as not evaluated."""
    doc = _vllm_doc()
    section = doc["sections"]["prefix_cache"]
    assert section["status"] != "ok"  # vLLM V1's spans count no cached tokens at all: the whole section is out
    assert "Cache busting: Prefix-cache hit rates need a cached-token count per request" in _text(doc)


def test_requests_without_a_cached_token_count_are_left_out_of_hit_rates_not_counted_as_misses(
        tmp_path: Path) -> None:
    """The cache-busting sample (this project's spans, every request counted) with two vLLM V1 requests of one of
    its models added (no count): the hit rates and the busting found are the sample's own, not lowered by two
    "misses"; the two requests are named as uncounted."""
    sample = ROOT / "sample_traces" / "cache_busting"
    truth = json.loads((sample / "ground_truth.json").read_text(encoding="utf-8"))
    vllm = ROOT / "tests" / "fixtures" / "sources" / "vllm_v1.jsonl"
    sections = {}
    for name, paths in (("alone", [sample / truth["traces"]]), ("mixed", [sample / truth["traces"], vllm])):
        ingest_paths(tmp_path / name, paths)
        with Store.open(tmp_path / name) as store:
            doc = build_report(store, ReportOptions(sections=("prefix_cache",)))
        jsonschema.validate(json.loads(render(doc, "json")), SCHEMA, cls=jsonschema.Draft202012Validator)
        sections[name] = doc["sections"]["prefix_cache"]
    alone, mixed = sections["alone"], sections["mixed"]
    assert alone["uncounted"] == [] and mixed["uncounted"] == [{"model": "llama-3-8b", "requests": 2}]
    assert "llama-3-8b" in {g["key"] for g in alone["by_model"]}
    for key in ("by_model", "by_tenant", "by_system_prompt", "busting"):
        assert mixed[key] == alone[key], key
    assert mixed["busting"] and mixed["busting_unchecked"] is None
    assert mixed["billing"]["input_tokens"] == alone["billing"]["input_tokens"] + 512 + 300  # billed, as uncached
    assert "Without a cached-token count (their spans give none): 2 requests of llama-3-8b." in _text(
        {**doc, "sections": {"prefix_cache": mixed}})
