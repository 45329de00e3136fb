"""An engine whose clock disagrees with the gateway's: the store says so, names the engine and the size of the
offset, and says which answer it makes wrong; a fleet whose clocks agree gets no such finding.

The skewed host is made the way it happens: the same fleet run, with every timestamp one engine instance's exporter
wrote moved by the offset (its spans, their events), before ingest."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from infertrace.analyzers.clocks import clock_offsets
from infertrace.report import ReportOptions, build_report, render
from infertrace.sources.capabilities import store_coverage
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from tests.fleet_traces import fleet_from_toml, move_span, resource_instance, rewrite_trace, simulate_fleet, traces_of

FLEET = """
name = "three-replicas"
region = "us-east-1"

[[auth]]
id = "auth-0"
latency_ms = 1.0

[[router]]
id = "router-0"
models = ["llama-3-8b", "qwen-2.5-1.5b"]
policy = "round_robin"

[[model]]
name = "llama-3-8b"
replicas = 3
hardware = "H100-SXM"

[[model]]
name = "qwen-2.5-1.5b"
replicas = 2
hardware = "H100-SXM"

[[tenant]]
name = "acme"
models = ["llama-3-8b", "qwen-2.5-1.5b"]
rate = 8.0
prompt_mean = 600.0
output_mean = 20.0
max_tokens = 64
"""

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "infertrace" / "report" / "schema.json").read_text())
_ROOT = tempfile.TemporaryDirectory(prefix="infertrace-test-clocks-")
MS = 1_000_000


@functools.cache
def _trace() -> Path:
    path = Path(_ROOT.name) / "fleet.jsonl"
    simulate_fleet(fleet_from_toml(FLEET), path, 40.0, seed=4)
    return path


def _shifted(instance: str, offset_ns: int, path_delay: bool) -> Path:
    """The fleet's trace with `instance`'s clock off by `offset_ns` (every time its resource's spans carry); or,
    with `path_delay`, its clock right but the network to it `offset_ns` slower each way: its spans that much later,
    and the gateway entry span of each request it served ending twice that later (the response comes back late)."""
    served = traces_of(_trace(), instance)
    assert served, f"no span of {instance} in the trace"

    def edit(resource_spans: dict[str, Any], span: dict[str, Any]) -> None:
        if resource_instance(resource_spans) == instance:
            move_span(span, offset_ns)
        elif path_delay and span["traceId"] in served and not span.get("parentSpanId"):
            move_span(span, 0, 2 * offset_ns)  # the entry span: the response arrives late

    out = Path(_ROOT.name) / f"{instance}{offset_ns:+d}{'-path' if path_delay else ''}.jsonl"
    rewrite_trace(_trace(), out, edit)
    return out


@functools.cache
def _store(instance: str = "", offset_ns: int = 0, path_delay: bool = False) -> Path:
    trace = _shifted(instance, offset_ns, path_delay) if instance else _trace()
    root = Path(_ROOT.name) / f"store{instance}{offset_ns:+d}{'-path' if path_delay else ''}"
    ingest_paths(root, [trace])
    return root


def test_a_fleet_whose_clocks_agree_gets_no_clock_finding() -> None:
    with Store.open(_store()) as store:
        coverage = store_coverage(store)
        instances = {i for (i,) in store.sql("SELECT DISTINCT instance FROM requests").fetchall()}
    assert len(instances) == 5
    assert coverage.clock_offsets == ()
    assert not any(line.startswith("Clocks:") for line in coverage.sentences())


@pytest.mark.parametrize("engine", ["vllm-v1", "sglang", "tgi"])
def test_other_engines_spans_behind_litellm_get_no_clock_finding(engine: str) -> None:
    """Their request spans are an API server's (vLLM's, SGLang's tokenizer, TGI's HTTP handler), whose own
    latency sits between the proxy's call and the engine: none of it reads as a clock."""
    from reference_engine.telemetry.profiles import TelemetrySpec

    path = Path(_ROOT.name) / f"{engine}.jsonl"
    simulate_fleet(fleet_from_toml(FLEET), path, 40.0, seed=4, telemetry=TelemetrySpec(engine, "litellm"))
    ingest_paths(Path(_ROOT.name) / f"store-{engine}", [path])
    with Store.open(Path(_ROOT.name) / f"store-{engine}") as store:
        assert store.sql("SELECT count(*) FROM requests WHERE gateway_ns IS NOT NULL").fetchall()[0][0] > 100
        assert clock_offsets(store) == ()


def test_a_replica_whose_clock_runs_ahead_is_named_with_its_offset_against_the_other_replicas() -> None:
    """40 ms ahead: every request of that replica seems to spend 40 ms more in the gateway. Nothing is impossible,
    but its floor of gateway time stands 40 ms above its two siblings'."""
    with Store.open(_store("llama-3-8b-1", 40 * MS)) as store:
        coverage = store_coverage(store)
        document = build_report(store, ReportOptions(sections=("slo",)))
    [finding] = coverage.clock_offsets
    jsonschema.validate(json.loads(render(document, "json")), SCHEMA, cls=jsonschema.Draft202012Validator)
    [entry] = document["coverage"]["clock_offsets"]
    assert entry["instances"] == ["llama-3-8b-1"] and entry["offset_ms"] == round(finding.offset_ns / 1e6, 3)
    assert finding.instances == ("llama-3-8b-1",) and not finding.at_least
    assert 38 * MS <= finding.offset_ns <= 42 * MS
    assert finding.sentence().startswith("llama-3-8b-1 (llama-3-8b): its clock runs about ")
    assert "ms ahead of the gateway's" in finding.sentence()
    assert f"Clocks: {finding.sentence()}" in coverage.sentences()
    assert "the gateway share of the requests of llama-3-8b-1 is off" in coverage.analysis("ttft").detail
    # the TTFT itself runs from the gateway's clock to the engine's: it moves by the offset, and the SLO says so
    assert "The TTFT of the requests of llama-3-8b-1 is off by their clocks' offset" in coverage.analysis("slo").detail
    ttft = "SELECT median(client_ttft_ns) FROM requests WHERE instance = 'llama-3-8b-1'"
    with Store.open(_store()) as right, Store.open(_store("llama-3-8b-1", 40 * MS)) as skewed:
        moved = skewed.sql(ttft).fetchall()[0][0] - right.sql(ttft).fetchall()[0][0]
    assert 39 * MS <= moved <= 41 * MS


def test_a_slower_network_path_to_a_replica_is_not_taken_for_its_clock() -> None:
    """20 ms more each way to one replica: its requests arrive later, as with a clock 20 ms ahead, but their
    responses also come back later, where a clock ahead would bring them back earlier."""
    with Store.open(_store("llama-3-8b-1", 20 * MS, path_delay=True)) as store:
        gateway = store.sql("SELECT min(gateway_ns) FROM requests WHERE instance = 'llama-3-8b-1'").fetchall()[0][0]
        assert gateway > 20 * MS
        assert clock_offsets(store) == ()


def test_a_replica_whose_clock_runs_behind_is_caught_by_requests_reaching_it_before_the_gateway() -> None:
    with Store.open(_store("llama-3-8b-2", -40 * MS)) as store:
        [finding] = clock_offsets(store)
        negative = store.sql("SELECT count(*) FROM requests WHERE gateway_ns < 0").fetchall()[0][0]
    assert negative > 0
    assert finding.instances == ("llama-3-8b-2",) and finding.at_least
    assert -40 * MS <= finding.offset_ns <= -30 * MS  # a bound: the true offset is at least this far behind
    assert "its clock runs at least 3" in finding.sentence() and "behind the gateway's" in finding.sentence()


@pytest.mark.parametrize("offset_ms", [25, -25])
def test_of_two_replicas_whose_clocks_differ_neither_is_blamed(offset_ms: int) -> None:
    """Two replicas of qwen: a floor apart says their clocks differ, not whose is right (unless one is behind so
    far that its requests arrive before they entered the gateway)."""
    with Store.open(_store("qwen-2.5-1.5b-0", offset_ms * MS)) as store:
        findings = clock_offsets(store)
    [finding] = findings
    if offset_ms > 0:
        assert finding.instances == ("qwen-2.5-1.5b-0", "qwen-2.5-1.5b-1") and not finding.at_least
        assert 23 * MS <= finding.offset_ns <= 27 * MS
        assert "which one is off cannot be told" in finding.sentence()
    else:
        assert finding.instances == ("qwen-2.5-1.5b-0",) and finding.at_least


PD_FLEET = """
name = "pd"
region = "us-east-1"

[[router]]
id = "router-0"
models = ["llama-3-8b"]
policy = "round_robin"

[[link]]
id = "link-0"
bandwidth_gb_s = 50.0
latency_ms = 0.5

[[model]]
name = "llama-3-8b"
hardware = "H100-SXM"
disaggregation = { prefill_replicas = 3, decode_replicas = 1, link = "link-0" }

[[tenant]]
name = "acme"
models = ["llama-3-8b"]
rate = 6.0
prompt_mean = 800.0
output_mean = 20.0
max_tokens = 64
"""


def test_a_prefill_worker_ahead_is_named_and_its_finding_says_a_slower_path_would_look_the_same() -> None:
    """A disaggregated request's prefill worker never sends the last token, so no gap after its span bounds the
    clock from the other side: the finding says what it could not check."""
    trace = Path(_ROOT.name) / "pd.jsonl"
    simulate_fleet(fleet_from_toml(PD_FLEET), trace, 30.0, seed=2)

    def edit(resource_spans: dict[str, Any], span: dict[str, Any]) -> None:
        if resource_instance(resource_spans) == "llama-3-8b-prefill-1":
            move_span(span, 30 * MS)

    rewrite_trace(trace, Path(_ROOT.name) / "pd-ahead.jsonl", edit)
    for name, path, named in (("pd", trace, ()), ("pd-ahead", Path(_ROOT.name) / "pd-ahead.jsonl",
                                                  ("llama-3-8b-prefill-1",))):
        ingest_paths(Path(_ROOT.name) / name, [path])
        with Store.open(Path(_ROOT.name) / name) as store:
            findings = clock_offsets(store)
        assert tuple(i for f in findings for i in f.instances) == named
    [finding] = findings
    assert 28 * MS <= finding.offset_ns <= 32 * MS and not finding.at_least
    assert "a network path that much slower would look the same" in finding.sentence()
