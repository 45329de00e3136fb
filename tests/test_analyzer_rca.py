"""Root-cause ranking on small hand-built topologies whose answer is known without the analyzer: spans
written by the engine's own OTLP writer, ingested into a real store, ranked; and two tiny fleets run by the
real engine with an injected fault."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infertrace import semconv as sc
from infertrace.analyzers.rca import analyze_incidents, describe, ochiai
from infertrace.analyzers.topology import read_topology
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.telemetry.otlp import SPAN_KIND_SERVER, STATUS_ERROR, OtlpJsonLinesWriter, SpanRecord
from tests.fleet_traces import fleet_from_toml, simulate_fleet

EPOCH = 1_767_225_600_000_000_000


@dataclass
class Fault:
    target: str  # a component instance, or a model (its engines)
    start_s: float
    end_s: float
    extra_ms: float = 0.0  # added to the component's latency
    reject: float = 0.0  # share of calls a rate limiter rejects with 429
    fail: float = 0.0  # share of calls the component answers 503
    slowdown: float = 1.0  # engine: TTFT and decode time multiplied by this
    models: tuple[str, ...] = ()  # a component fault that only hits these models' requests (default: all)


@dataclass
class HandFleet:
    """Models with their engines; components with their kind and the models they serve; one tenant per
    model plus a shared one; requests at `rate` per second per model."""

    engines: dict[str, list[str]]
    components: dict[str, tuple[str, list[str]]]
    rate: float = 3.0
    duration_s: float = 360.0
    faults: list[Fault] = field(default_factory=list)
    prefill_share: float = 0.05  # requests with an assistant prefill

    def write(self, path: Path, seed: int = 1) -> None:
        rng = random.Random(seed)
        spans: dict[str, list[SpanRecord]] = {}
        kinds = {i: k for i, (k, _) in self.components.items()}
        kinds.update({e: "engine" for es in self.engines.values() for e in es})
        span_ids = iter(range(1, 1 << 40))
        order = ("auth", "rate_limiter", "scheduler", "router")
        spans_by_kind = {"auth": sc.SPAN_AUTH, "rate_limiter": sc.SPAN_RATE_LIMIT, "scheduler": sc.SPAN_GLOBAL_QUEUE,
                         "router": sc.SPAN_ROUTE}
        n = 0
        for model, engines in self.engines.items():
            t = 0.0
            chain = sorted((i for i, (k, ms) in self.components.items() if model in ms),
                           key=lambda i: order.index(self.components[i][0]))
            while True:
                t += rng.expovariate(self.rate)
                if t >= self.duration_s:
                    break
                n += 1
                trace = rng.getrandbits(128) | 1
                tenant = rng.choice([f"tenant-{model}", "tenant-shared"])
                request_id = f"req-{n}"
                base = {sc.REQUEST_ID: request_id, sc.TENANT_ID: tenant, sc.REQUEST_MODEL: model}
                root = next(span_ids)
                now = EPOCH + int(t * 1e9)
                start = now
                status = 200
                parent = root
                for instance in chain:
                    kind = self.components[instance][0]
                    latency = rng.lognormvariate(0, 0.25) * 1.0e6
                    code, outcome = 200, "ok"
                    for f in self.faults:
                        if f.target == instance and f.start_s <= t < f.end_s and model in (f.models or (model,)):
                            latency += f.extra_ms * 1e6
                            if f.reject and rng.random() < f.reject:
                                code, outcome = 429, "rejected"
                            elif f.fail and rng.random() < f.fail:
                                code, outcome = 503, "error"
                    sid = next(span_ids)
                    attrs = {**base, sc.HTTP_STATUS_CODE: code, sc.COMPONENT_OUTCOME: outcome}
                    engine = engines[n % len(engines)]
                    if kind == "router":
                        attrs[sc.ROUTE_TARGET] = engine
                    spans.setdefault(instance, []).append(
                        SpanRecord(trace, sid, root, spans_by_kind[kind], now, now + int(latency), attrs))
                    now += int(latency)
                    parent = sid
                    if code != 200:
                        status = code
                        break
                output = 0
                prefill = rng.random() < self.prefill_share
                if status == 200:
                    engine = engines[n % len(engines)]
                    slow = 1.0
                    for f in self.faults:
                        if f.target == model and f.start_s <= t < f.end_s:
                            slow = f.slowdown
                    ttft = 0.05 * rng.lognormvariate(0, 0.3) * slow
                    output = rng.randint(50, 300)
                    decode = output * 0.01 * rng.lognormvariate(0, 0.05) * slow
                    end = now + int((ttft + decode) * 1e9)
                    attrs = {**base, sc.RESPONSE_MODEL: model, sc.USAGE_INPUT_TOKENS: rng.randint(100, 3000),
                             sc.USAGE_OUTPUT_TOKENS: output, sc.REQUEST_MAX_TOKENS: 1024,
                             sc.ASSISTANT_PREFILL_TOKENS: 32 if prefill else 0,
                             sc.LATENCY_TIME_IN_QUEUE: 0.001, sc.LATENCY_TIME_TO_FIRST_TOKEN: ttft,
                             sc.LATENCY_E2E: ttft + decode}
                    spans.setdefault(engine, []).append(
                        SpanRecord(trace, next(span_ids), parent, sc.SPAN_REQUEST, now, end, attrs,
                                   kind=SPAN_KIND_SERVER))
                    now = end
                gw = {**base, sc.HTTP_STATUS_CODE: status, sc.USAGE_OUTPUT_TOKENS: output}
                record = SpanRecord(trace, root, 0, sc.SPAN_GATEWAY, start, now, gw, kind=SPAN_KIND_SERVER)
                if status >= 500:
                    record.status_code = STATUS_ERROR
                spans.setdefault("gateway-0", []).append(record)
        writer = OtlpJsonLinesWriter(path)
        kinds["gateway-0"] = "gateway"
        for instance, records in spans.items():
            resource = {sc.SERVICE_NAME: kinds[instance], sc.SERVICE_INSTANCE_ID: instance,
                        sc.COMPONENT_KIND: kinds[instance]}
            if kinds[instance] == "engine":
                resource[sc.ENGINE_MODEL] = next(m for m, es in self.engines.items() if instance in es)
            writer.export(resource, records)
        writer.close()


def hand_store(tmp_path: Path, fleet: HandFleet) -> Store:
    traces = tmp_path / "traces.jsonl"
    fleet.write(traces)
    ingest_paths(tmp_path / "store", [traces])
    return Store.open(tmp_path / "store")


# Three models: A and B behind router-0, C behind router-1; one auth and one rate limiter for all.
THREE = dict(
    engines={"model-a": ["a-0", "a-1"], "model-b": ["b-0"], "model-c": ["c-0"]},
    components={"auth-0": ("auth", ["model-a", "model-b", "model-c"]),
                "ratelimit-0": ("rate_limiter", ["model-a", "model-b", "model-c"]),
                "router-0": ("router", ["model-a", "model-b"]),
                "router-1": ("router", ["model-c"])})


def test_ochiai_is_the_textbook_coefficient() -> None:
    assert ochiai(10, 0, 0) == 1.0
    assert ochiai(0, 10, 5) == 0.0
    assert ochiai(6, 2, 3) == pytest.approx(6 / (8 * 9) ** 0.5)


def test_topology_is_read_from_the_spans(tmp_path: Path) -> None:
    with hand_store(tmp_path, HandFleet(**THREE, duration_s=60)) as store:
        topology = read_topology(store)
    assert topology.node("router-0").models == ("model-a", "model-b")
    assert topology.node("router-1").models == ("model-c",)
    assert topology.node("auth-0").models == ("model-a", "model-b", "model-c")
    assert topology.engines("model-a") == ("a-0", "a-1")
    assert topology.node("router-0").kind == "router"


def test_a_slow_router_is_ranked_first_when_the_two_models_behind_it_degrade(tmp_path: Path) -> None:
    fleet = HandFleet(**THREE, faults=[Fault("router-0", 150.5, 260.0, extra_ms=400.0)])
    with hand_store(tmp_path, fleet) as store:
        report = analyze_incidents(store)
    assert len(report.diagnoses) == 1
    diagnosis = report.diagnoses[0]
    assert diagnosis.incident.models == ("model-a", "model-b")
    top = diagnosis.causes[0]
    assert top.candidate.id == "router-0"
    assert top.n_f == 0 and top.ochiai > 0.9 and top.own.score > 0.9
    # auth-0 carries every anomalous request too, but also model-c's normal ones, and is not slow itself
    auth = next(c for c in diagnosis.causes if c.candidate.id == "auth-0")
    assert auth.ochiai < top.ochiai and auth.own.score < 0.05
    assert "router-0" in describe(report)[1]
    assert abs(diagnosis.incident.onset_ns - (EPOCH + 150.5e9)) < 5e9  # mid-bucket onset, dated to seconds


def test_one_degraded_model_points_to_its_engines_not_to_the_router_it_shares(tmp_path: Path) -> None:
    fleet = HandFleet(**THREE, faults=[Fault("model-a", 160.0, 270.0, slowdown=3.0)])
    with hand_store(tmp_path, fleet) as store:
        report = analyze_incidents(store)
    diagnosis = report.diagnoses[0]
    assert diagnosis.incident.models == ("model-a",)
    assert diagnosis.causes[0].candidate.id == "model-a engines"
    assert diagnosis.causes[0].candidate.instances == ("a-0", "a-1")
    assert not diagnosis.causes[0].candidate.shared


def test_equal_coverage_is_decided_by_the_components_own_anomaly(tmp_path: Path) -> None:
    # auth-1 and router-0 both serve exactly model-a and model-b: only the own anomaly separates them.
    fleet = HandFleet(engines={"model-a": ["a-0"], "model-b": ["b-0"], "model-c": ["c-0"]},
                      components={"auth-1": ("auth", ["model-a", "model-b"]), "auth-2": ("auth", ["model-c"]),
                                  "router-0": ("router", ["model-a", "model-b"]),
                                  "router-1": ("router", ["model-c"])},
                      faults=[Fault("auth-1", 130.0, 230.0, extra_ms=250.0)])
    with hand_store(tmp_path, fleet) as store:
        causes = analyze_incidents(store).diagnoses[0].causes
    first, second = causes[0], next(c for c in causes if c.candidate.id == "router-0")
    assert first.candidate.id == "auth-1"
    assert first.ochiai == pytest.approx(second.ochiai)
    assert second.score < 0.1 * first.score


def test_a_slow_engine_whose_waits_show_in_the_shared_queue_in_front_of_it_is_still_the_cause(tmp_path: Path) -> None:
    # model-a's engines slow down, so the global queue in front of all three models holds model-a's requests
    # longer: the queue has an anomaly of its own, but only on a third of its calls, and it also carries
    # the normal requests of model-b and model-c.
    fleet = HandFleet(engines={"model-a": ["a-0"], "model-b": ["b-0"], "model-c": ["c-0"]},
                      components={"queue-0": ("scheduler", ["model-a", "model-b", "model-c"]),
                                  "router-0": ("router", ["model-a", "model-b", "model-c"])},
                      faults=[Fault("model-a", 140.0, 250.0, slowdown=3.0),
                              Fault("queue-0", 140.0, 250.0, extra_ms=150.0, models=("model-a",))])
    with hand_store(tmp_path, fleet) as store:
        causes = analyze_incidents(store).diagnoses[0].causes
    queue = next(c for c in causes if c.candidate.id == "queue-0")
    assert queue.own.score > 0.2  # the queue's own anomaly is real
    assert causes[0].candidate.id == "model-a engines"
    assert queue.ochiai < causes[0].ochiai


def test_a_flapping_rate_limiter_is_found_from_its_429s(tmp_path: Path) -> None:
    fleet = HandFleet(engines={"model-a": ["a-0"], "model-b": ["b-0"], "model-c": ["c-0"]},
                      components={"auth-0": ("auth", ["model-a", "model-b", "model-c"]),
                                  "ratelimit-0": ("rate_limiter", ["model-a", "model-b"]),
                                  "ratelimit-1": ("rate_limiter", ["model-c"])},
                      faults=[Fault("ratelimit-0", 140.0, 240.0, reject=0.5)])
    with hand_store(tmp_path, fleet) as store:
        diagnosis = analyze_incidents(store).diagnoses[0]
    top = diagnosis.causes[0]
    assert top.candidate.id == "ratelimit-0"
    assert top.own.signal == "rejections" and top.own.share_during > 0.3
    assert "rejected (429)" in top.sentence()


def test_a_quiet_fleet_has_no_incident(tmp_path: Path) -> None:
    with hand_store(tmp_path, HandFleet(**THREE)) as store:
        report = analyze_incidents(store)
    assert report.diagnoses == ()
    assert describe(report)[0].startswith("No incident")


TWO_MODELS = """
name = "two"
region = "us-east-1"
[[auth]]
id = "auth-0"
[[router]]
id = "router-0"
[[model]]
name = "qwen-2.5-1.5b"
hardware = "H100-SXM"
[[model]]
name = "llama-3-8b"
hardware = "H100-SXM"
[[tenant]]
name = "t"
models = ["qwen-2.5-1.5b", "llama-3-8b"]
workload = "synthetic"
rate = 4.0
prompt_mean = 512.0
output_mean = 120.0
"""


@pytest.mark.parametrize(("fault", "cause"), [
    ("kind = 'engine_slowdown'\ntarget = 'llama-3-8b'\nfactor = 2.5", "llama-3-8b engines"),
    ("kind = 'router_latency'\ntarget = 'router-0'\nextra_ms = 300.0", "router-0"),
])
def test_the_real_engine_fleet_fault_is_ranked_first(tmp_path: Path, fault: str, cause: str) -> None:
    spec = fleet_from_toml(TWO_MODELS + f"[[fault]]\nstart_s = 100.0\nduration_s = 70.0\n{fault}\n")
    simulate_fleet(spec, tmp_path / "t.jsonl", duration_s=240.0, seed=3)
    ingest_paths(tmp_path / "store", [tmp_path / "t.jsonl"])
    with Store.open(tmp_path / "store") as store:
        report = analyze_incidents(store)
    assert report.diagnoses, "no incident detected"
    top = report.diagnoses[0].causes[0]
    assert top.candidate.id == cause, describe(report)
