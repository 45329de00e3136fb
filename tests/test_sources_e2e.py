"""Each engine's own telemetry, end to end: a fleet incident simulated with `--telemetry P` is sent through the
real OTLP exporter to `infertrace collect` on 127.0.0.1; nothing is quarantined, the relations hold the right
models, instances and timings (against the same simulation recorded with this project's spans), and the report
finds the incident and says what it could not do.

Two incidents: two models' engines slowed at once with no gateway span at all (detection runs per model from the
engines' spans alone: the affected models and the onset), and a router slowing the two models behind it, seen
through a gateway whose spans are named like LiteLLM's (RCA names the shared router). Every test runs over
OTLP/HTTP and OTLP/gRPC (vLLM, SGLang and TGI export gRPC by default; TGI only gRPC).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from infertrace.report import ReportOptions, build_report, render
from infertrace.store.collector import Collector
from infertrace.store.ingest import ingest_paths
from infertrace.store.segments import QUARANTINE_DIR
from infertrace.store.store import Store
from reference_engine.fleet.fleet import Fleet
from reference_engine.fleet.workload import fleet_requests
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter, SdkExporterSink, SpanSink
from reference_engine.telemetry.profiles import TelemetrySpec
from reference_engine.workload import DEFAULT_EPOCH_NS
from tests.fleet_traces import fleet_from_toml

TRANSPORTS = ("http", "grpc")
SEED = 5
DURATION_S = 240.0
FAULT_START_S = 120.0
SLOWED = ("llama-3-8b", "qwen-2.5-1.5b")
REPLICAS = {"llama-3-8b": 2, "qwen-2.5-1.5b": 1, "mixtral-8x7b": 1}

FLEET = """
name = "three-models"
region = "us-east-1"

[[auth]]
id = "auth-0"
latency_ms = 1.0

[[router]]
id = "router-a"
models = ["llama-3-8b", "qwen-2.5-1.5b"]
policy = "least_loaded"

[[router]]
id = "router-b"
models = ["mixtral-8x7b"]

[[model]]
name = "llama-3-8b"
replicas = 2
hardware = "H100-SXM"

[[model]]
name = "qwen-2.5-1.5b"
hardware = "H100-SXM"

[[model]]
name = "mixtral-8x7b"
hardware = "H100-SXM"
engine = { tensor_parallel = 2 }

[[tenant]]
name = "acme"
models = ["llama-3-8b", "qwen-2.5-1.5b", "mixtral-8x7b"]
rate = 2.0
prompt_mean = 600.0
output_mean = 12.0
max_tokens = 48

[[tenant]]
name = "globex"
models = ["llama-3-8b", "qwen-2.5-1.5b", "mixtral-8x7b"]
rate = 1.5
prompt_mean = 800.0
output_mean = 12.0
max_tokens = 48
system_prompt_tokens = 512
"""

ENGINE_FAULTS = """
[[fault]]
kind = "engine_slowdown"
target = "llama-3-8b"
start_s = 120.0
duration_s = 90.0
factor = 4.0

[[fault]]
kind = "engine_slowdown"
target = "qwen-2.5-1.5b"
start_s = 120.0
duration_s = 90.0
factor = 4.0
"""

ROUTER_FAULT = """
[[fault]]
kind = "router_latency"
target = "router-a"
start_s = 120.0
duration_s = 90.0
extra_ms = 400.0
"""


@contextmanager
def receiver(transport: str, root: Path) -> Iterator[Callable[[], SpanSink]]:
    """`infertrace collect` on 127.0.0.1 (OTLP/HTTP, and OTLP/gRPC with `--grpc`); yields a factory of sinks that
    export to it over `transport` with the real OpenTelemetry exporter."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

    collector = Collector(root, "127.0.0.1", 0, grpc=("127.0.0.1", 0), compact_interval_s=None)
    collector.start()
    try:
        if transport == "grpc":
            yield lambda: SdkExporterSink(GrpcSpanExporter(endpoint=collector.grpc_address, insecure=True))
        else:
            yield lambda: SdkExporterSink(HttpSpanExporter(endpoint=f"http://{collector.address}/v1/traces"))
    finally:
        collector.shutdown()


def _run(faults: str, sink: SpanSink, telemetry: TelemetrySpec | None) -> None:
    spec = fleet_from_toml(FLEET + faults)
    try:
        Fleet(spec, sink, SEED, telemetry=telemetry).run(fleet_requests(spec, DURATION_S, SEED))
    finally:
        sink.close()


@cache
def _native(faults: str, root: Path) -> pd.DataFrame:
    """The same simulation recorded with this project's spans: the requests relation to compare with."""
    path = root / "native.jsonl"
    _run(faults, OtlpJsonLinesWriter(path), None)
    ingest_paths(root / "native", [path])
    with Store.open(root / "native") as store:
        return store.sql("SELECT * FROM requests").df()


@pytest.fixture(scope="module")
def native_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("native")


def _collected(transport: str, faults: str, telemetry: TelemetrySpec, root: Path) -> Store:
    with receiver(transport, root / "store") as sink:
        _run(faults, sink(), telemetry)
    assert not list((root / "store" / QUARANTINE_DIR).glob("*")), "spans were quarantined"
    return Store.open(root / "store")


def _incident(doc: dict[str, Any]) -> dict[str, Any]:
    incidents = doc["sections"]["incidents"]["incidents"]
    assert incidents, "no incident found"
    return incidents[0]


def _onset_s(incident: dict[str, Any]) -> float:
    onset = pd.Timestamp(incident["onset"]).value
    return (onset - DEFAULT_EPOCH_NS) / 1e9


# Whether the source tells the replicas of a model apart without service.instance.id.
INSTANCES_TOLD_APART = {"infertrace": True, "vllm-v1": True, "vllm-v0": False, "sglang": True, "tgi": False}
# The API server's latency before the engine (vLLM V1, SGLang, TGI front ends) and after it, in ms.
FRONTEND = {"infertrace": (0, 0), "vllm-v0": (0, 0), "vllm-v1": (3, 1), "sglang": (3, 1), "tgi": (3, 1)}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("profile", ["infertrace", "vllm-v1", "vllm-v0",
                                     pytest.param("sglang", marks=pytest.mark.slow),
                                     pytest.param("tgi", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_an_engine_incident_without_gateway_spans_is_found_from_each_engines_own_spans(
        profile: str, transport: str, tmp_path: Path, native_dir: Path) -> None:
    truth = _native(ENGINE_FAULTS, native_dir)
    with _collected(transport, ENGINE_FAULTS, TelemetrySpec(profile, "none"), tmp_path) as store:
        rows = store.sql("SELECT * FROM requests").df()
        doc = build_report(store, ReportOptions(sections=("incidents", "itl")))
        text = render(doc, "table")

    # the relations: every finished request, on the right model and instance, with the engine's timings
    assert set(rows["source"]) == {profile}
    assert len(rows) == len(truth)
    assert rows.groupby("model").size().to_dict() == truth.groupby("model").size().to_dict()
    for model, part in rows.groupby("model"):
        expected = REPLICAS[model] if INSTANCES_TOLD_APART[profile] else 1
        assert part["instance"].nunique() == expected, (model, sorted(part["instance"].unique()))
    before_ms, after_ms = FRONTEND[profile]
    for model, part in rows.groupby("model"):
        mine = part.sort_values("arrival_ns")
        theirs = truth[truth["model"] == model].sort_values("arrival_ns")
        lead = (theirs["arrival_ns"].to_numpy() - mine["arrival_ns"].to_numpy()) / 1e6
        assert (lead >= 0).all() and (lead <= before_ms + 1e-6).all(), (model, lead.min(), lead.max())
        for column in ("first_token_ns", "finish_ns"):
            lag = (np.sort(mine[column].to_numpy()) - np.sort(theirs[column].to_numpy())) / 1e6
            assert np.median(np.abs(lag)) <= after_ms + 1e-6 and np.abs(lag).max() <= before_ms + after_ms + 1, \
                (model, column, np.abs(lag).max())
    if profile not in ("tgi",):  # TGI exports no request id
        joined = rows.merge(truth, on="request_id", suffixes=("", "_truth"))
        assert len(joined) == len(truth) and (joined["model"] == joined["model_truth"]).all()
        if INSTANCES_TOLD_APART[profile]:  # one instance here for each of the simulation's
            pairs = joined.groupby("instance")["instance_truth"].nunique()
            assert (pairs == 1).all() and joined["instance_truth"].nunique() == joined["instance"].nunique()

    # the report: the two slowed models, from about the fault's start, each blamed on its own engines (two
    # independent faults: one incident each, or one incident with both); and what it could not do
    incidents = doc["sections"]["incidents"]["incidents"]
    assert {m for incident in incidents for m in incident["models"]} == set(SLOWED)
    for incident in incidents:
        assert abs(_onset_s(incident) - FAULT_START_S) <= 60
        top = {cause["id"] for cause in incident["causes"][:len(incident["models"])]}
        assert top == {f"{model} engines" for model in incident["models"]}, top
    assert "cannot rank shared components" in text
    analyses = {a["key"]: a for a in doc["coverage"]["analyses"]}
    assert not analyses["rca_components"]["supported"]
    # SGLang and TGI time each token: the request-only method runs on them; vLLM's spans alone time none
    assert analyses["itl"]["supported"] == (profile in ("infertrace", "sglang", "tgi"))
    if profile in ("sglang", "tgi"):
        assert doc["sections"]["itl"]["method"] == "request spans + token spans"
    elif profile != "infertrace":
        assert doc["sections"]["itl"]["status"] == "unavailable"
        assert "ITL attribution needs engine_step spans, client token times or an iteration log" in text
        assert "stalled steps" not in text


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("gateway", ["infertrace", "litellm"])
def test_a_router_incident_behind_a_gateway_is_ranked_on_the_shared_router_whatever_its_spans_are_called(
        gateway: str, transport: str, tmp_path: Path) -> None:
    with _collected(transport, ROUTER_FAULT, TelemetrySpec("vllm-v1", gateway), tmp_path) as store:
        doc = build_report(store, ReportOptions(sections=("incidents",)))
        names = store.sql("SELECT DISTINCT component FROM component_calls WHERE role = 'call'").fetchall()
    incident = _incident(doc)
    assert set(incident["models"]) == set(SLOWED)
    assert abs(_onset_s(incident) - FAULT_START_S) <= 60
    top = incident["causes"][0]
    assert top["id"] == "router-a" and top["shared"]
    assert {n for (n,) in names} == ({"auth", "route"} if gateway == "infertrace" else {"auth", "router"})
