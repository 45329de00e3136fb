"""Prefill/decode disaggregation as users see it: one `requests` row per request, however many engine legs
served it, with each TTFT phase from the leg it belongs to, compared with what the engines themselves did."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from infertrace import semconv as sc
from infertrace.runbook.runner import run_query
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.engine.llm_engine import LLMEngine, StepReport
from reference_engine.engine.sequence import Sequence
from reference_engine.fleet.config import FleetSpec
from reference_engine.fleet.fleet import Fleet
from reference_engine.fleet.workload import fleet_requests
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.timeline import Timeline
from tests.fleet_traces import fleet_from_toml

ROOT = Path(__file__).resolve().parents[1]

CPU_DECODE = """
[[router]]
id = "router-0"

[[link]]
id = "lan"
bandwidth_gb_s = 12.5   # 100 Gbit/s
latency_ms = 0.5

[[model]]
name = "llama-3-8b"
hardware = "L4"
[model.disaggregation]
prefill_replicas = 1
decode_replicas = 1
decode_hardware = "CPU-host"
link = "lan"

[[tenant]]
name = "acme"
rate = 0.3
prompt_mean = 8000.0
prompt_sigma = 0.3
output_mean = 60.0
system_prompt_fraction = 0.0
"""


@dataclass
class Leg:
    instance: str
    arrival_ns: int
    token_ns: list[int]


@dataclass
class Truth:
    """What the engines did, recorded by an observer on every engine while the fleet ran."""

    gateway_ns: dict[str, int] = field(default_factory=dict)  # request → arrival at the gateway
    legs: dict[str, dict[str, Leg]] = field(default_factory=dict)  # request → role → leg


class LegRecorder:
    def __init__(self, truth: Truth, instance: str, role: str) -> None:
        self.truth, self.instance, self.role = truth, instance, role
        self.timeline = Timeline(with_steps=False)

    def on_step(self, report: StepReport) -> None:
        self.timeline.on_step(report)

    def on_finish(self, seq: Sequence) -> None:
        tokens = self.timeline.pop(seq.request_id).token_ns
        role = {"prefill_worker": "prefill", "decode_worker": "decode"}.get(self.role, "colocated")
        self.truth.legs.setdefault(seq.request_id, {})[role] = Leg(self.instance, seq.request.arrival_ns, tokens)


@dataclass(frozen=True)
class Run:
    store: Path
    traces: Path
    truth: Truth
    gateway_requests: int


def _run(spec: FleetSpec, root: Path, duration_s: float, seed: int) -> Run:
    truth = Truth()
    roles = {instance: role for m in spec.model_names for instance, role in spec.engine_instances(m)}

    def observers(instance: str, engine: LLMEngine) -> list[Any]:
        return [LegRecorder(truth, instance, roles[instance])]

    requests = fleet_requests(spec, duration_s, seed)
    truth.gateway_ns = {r.request_id: r.arrival_ns for r in requests}
    traces = root / "traces.jsonl"
    writer = OtlpJsonLinesWriter(traces)
    try:
        summary = Fleet(spec, writer, seed, observers=observers).run(requests)
    finally:
        writer.close()
    ingest_paths(root / "store", [traces])
    return Run(root / "store", traces, truth, summary.requests)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    example = fleet_from_toml((ROOT / "examples" / "fleets" / "disaggregated.toml").read_text(encoding="utf-8"))
    return {"disaggregated": _run(example, tmp_path_factory.mktemp("disaggregated"), 30.0, seed=1),
            "cpu_decode": _run(fleet_from_toml(CPU_DECODE), tmp_path_factory.mktemp("cpu_decode"), 60.0, seed=2)}


FLEETS = ("disaggregated", "cpu_decode")


@pytest.mark.parametrize("fleet", FLEETS)
def test_requests_counts_each_request_once_as_the_gateway_does(runs: dict[str, Run], fleet: str) -> None:
    run = runs[fleet]
    with Store.open(run.store) as store:
        n, distinct = store.sql("SELECT count(*), count(DISTINCT request_id) FROM requests").fetchall()[0]
        gateway = store.sql("SELECT count(*) FROM component_calls WHERE component = 'gateway'").fetchall()[0][0]
        legs = dict(store.sql("SELECT role, count(*) FROM request_legs GROUP BY role").fetchall())
        problems = store.sql("SELECT count(leg_problem) FROM requests").fetchall()[0][0]
    assert n == distinct == gateway == run.gateway_requests > 20
    assert legs["prefill"] == legs["decode"] > 20  # the legs are all kept, one per engine span
    assert problems == 0


@pytest.mark.parametrize("fleet", FLEETS)
def test_ttft_phases_each_from_its_own_leg_sum_to_the_client_ttft_within_1ms(runs: dict[str, Run],
                                                                           fleet: str) -> None:
    with Store.open(runs[fleet].store) as store:
        rows = store.sql("""
            SELECT request_id, serving, client_ttft_ns, gateway_start_ns,
                   gateway_ns + queue_ns + prefill_ns + coalesce(kv_transfer_ns, 0) + coalesce(decode_queue_ns, 0)
                       + coalesce(first_decode_ns, 0) AS phases
            FROM requests WHERE outcome = 'ok'""").fetchall()
    assert len(rows) > 20
    for request_id, serving, client_ttft, gateway_start, phases in rows:
        assert gateway_start is not None, request_id
        assert abs(phases - client_ttft) <= 1_000_000, request_id
        assert serving == "disaggregated" or fleet == "disaggregated"  # the example's second model is colocated


@pytest.mark.parametrize("fleet", FLEETS)
def test_each_disaggregated_request_matches_what_its_prefill_and_decode_engines_did(runs: dict[str, Run],
                                                                                  fleet: str) -> None:
    run = runs[fleet]
    with Store.open(run.store) as store:
        rows = store.sql("""
            SELECT request_id, serving, prefill_instance, decode_instance, instance, arrival_ns, first_token_ns,
                   finish_ns, output_tokens, kv_transfer_ns, client_ttft_ns, ttft_ns
            FROM requests""").df().set_index("request_id")
        tokens = store.sql("SELECT request_id, instance, token_index, time_ns, itl_ns, handover_ns FROM tokens "
                           "ORDER BY request_id, instance, token_index").df()
    tokens = {key: t for key, t in tokens.groupby(["request_id", "instance"])}
    checked = 0
    for request_id, legs in run.truth.legs.items():
        row = rows.loc[request_id]
        if "colocated" in legs:
            leg = legs["colocated"]
            assert (row.serving, row.instance, row.arrival_ns) == ("colocated", leg.instance, leg.arrival_ns)
            assert row.first_token_ns == leg.token_ns[0]
            continue
        prefill, decode = legs["prefill"], legs["decode"]
        assert row.serving == "disaggregated"
        assert (row.prefill_instance, row.decode_instance, row.instance) == (prefill.instance, decode.instance,
                                                                             decode.instance)
        assert row.arrival_ns == prefill.arrival_ns
        # the client's first token is the decode worker's (the prefill worker's one token goes to the proxy)
        assert row.first_token_ns == decode.token_ns[0]
        assert row.finish_ns == decode.token_ns[-1]
        assert row.output_tokens == len(decode.token_ns)
        assert row.kv_transfer_ns == decode.arrival_ns - prefill.token_ns[-1]
        assert row.ttft_ns == decode.token_ns[0] - prefill.arrival_ns
        assert row.client_ttft_ns == decode.token_ns[0] - run.truth.gateway_ns[request_id]
        # ITL comes from the decode leg's own tokens; the gap since the prefill worker's token is labelled
        mine = tokens[(request_id, decode.instance)]
        assert mine["time_ns"].tolist() == decode.token_ns
        gaps = [b - a for a, b in zip(decode.token_ns, decode.token_ns[1:], strict=False)]
        assert mine["itl_ns"].iloc[1:].tolist() == gaps
        assert mine["itl_ns"].isna().iloc[0]
        assert mine["handover_ns"].iloc[0] == decode.token_ns[0] - prefill.token_ns[-1]
        assert mine["handover_ns"].iloc[1:].isna().all()
        checked += 1
    assert checked > 20


def test_the_ttft_breakdown_query_counts_each_request_once_with_every_phase(runs: dict[str, Run]) -> None:
    with Store.open(runs["cpu_decode"].store) as store:
        result = run_query(store, "ttft_breakdown", {"model": "llama-3-8b"})
        n = store.sql("SELECT count(*) FROM requests WHERE model = 'llama-3-8b'").fetchall()[0][0]
    phases = dict(zip(result["phase"], result["requests"], strict=True))
    assert list(phases) == ["gateway", "prefill_queue", "prefill", "kv_transfer", "decode_queue", "first_decode",
                            "ttft_engine", "ttft_client"]
    assert set(phases.values()) == {n}
    with Store.open(runs["cpu_decode"].store) as store:
        share = run_query(store, "pd_ttft_transfer_share", {})
        expected = store.sql("SELECT sum(kv_transfer_ns) / sum(client_ttft_ns) FROM requests").fetchall()[0][0]
    assert share["requests"].tolist() == [n] and share["unmatched"].tolist() == [0]
    assert share["kv_share_of_total"].iloc[0] == pytest.approx(expected, abs=1e-4)


def _drop_prefill_legs(source: Path, target: Path, request_ids: set[str]) -> None:
    """The traces without some requests' prefill-worker `llm_request` spans (as when one pool's spans are lost)."""
    with open(source, encoding="utf-8") as f, gzip.open(target, "wt", encoding="utf-8") as out:
        for line in f:
            data = json.loads(line)
            for rs in data["resourceSpans"]:
                kind = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}.get(sc.COMPONENT_KIND, {})
                if kind.get("stringValue") != "prefill_worker":
                    continue
                for ss in rs["scopeSpans"]:
                    ss["spans"] = [s for s in ss["spans"] if not (
                        s["name"] == sc.SPAN_REQUEST and any(
                            a["key"] == sc.REQUEST_ID and a["value"].get("stringValue") in request_ids
                            for a in s["attributes"]))]
            out.write(json.dumps(data) + "\n")


def test_a_decode_leg_without_its_prefill_leg_is_kept_and_says_so(runs: dict[str, Run], tmp_path: Path) -> None:
    run = runs["cpu_decode"]
    lost = set(sorted(run.truth.legs)[:3])
    traces = tmp_path / "traces.jsonl.gz"
    _drop_prefill_legs(run.traces, traces, lost)
    ingest_paths(tmp_path / "store", [traces])
    with Store.open(tmp_path / "store") as store:
        rows = store.sql("SELECT request_id, leg_problem, prefill_instance, kv_transfer_ns, client_ttft_ns "
                         "FROM requests").fetchall()
        breakdown = run_query(store, "ttft_breakdown", {"model": "llama-3-8b"})
    assert len(rows) == run.gateway_requests
    said = {r[0]: r for r in rows if r[1] is not None}
    assert set(said) == lost
    for _, problem, prefill_instance, kv_transfer_ns, client_ttft_ns in said.values():
        assert problem == "decode leg without a prefill leg"
        assert (prefill_instance, kv_transfer_ns) == (None, None)
        assert client_ttft_ns > 0  # the gateway still dates the client's wait
    assert dict(zip(breakdown["phase"], breakdown["requests"], strict=True))[
        "unmatched legs: decode leg without a prefill leg"] == 3


def test_the_report_counts_a_disaggregated_request_once_in_slo_and_ttft(runs: dict[str, Run]) -> None:
    from infertrace.report.model import ReportOptions, build_report

    with Store.open(runs["disaggregated"].store) as store:
        doc = build_report(store, ReportOptions(sections=("slo", "ttft")))
        gateway = dict(store.sql("SELECT model, count(*) FROM component_calls WHERE component = 'gateway' "
                                 "GROUP BY model").fetchall())
    slo = {m["model"]: m for m in doc["sections"]["slo"]["models"]}
    for model, n in gateway.items():
        assert slo[model]["engine_requests"] == slo[model]["gateway_requests"] == n
    [pd] = doc["sections"]["ttft"]["disaggregated"]
    assert (pd["model"], pd["requests"], pd["unmatched"], pd["links"]) == ("llama-3-8b", gateway["llama-3-8b"], {},
                                                                          ["dc1-dc2"])
    assert 0 < pd["kv_share_of_ttft"] < 1
    shares = {m["model"]: m["shares"] for m in doc["sections"]["ttft"]["models"]}
    assert shares["llama-3-8b"]["kv_transfer"] > 0 and shares["qwen-2.5-1.5b"]["kv_transfer"] == 0


def test_each_disaggregated_models_prefill_and_decode_pools_are_rca_candidates(runs: dict[str, Run]) -> None:
    from infertrace.analyzers.candidates import RcaInputs, candidates

    with Store.open(runs["disaggregated"].store) as store:
        inputs = RcaInputs.load(store)
    found = {c.id: c.instances for c in candidates(inputs.topology)}
    assert found["llama-3-8b prefill pool"] == ("llama-3-8b-prefill-0",)
    assert found["llama-3-8b decode pool"] == ("llama-3-8b-decode-0", "llama-3-8b-decode-1")
    assert found["dc1-dc2"] == ("dc1-dc2",)
    assert not any(k.startswith("qwen-2.5-1.5b") and k.endswith("pool") for k in found)  # colocated: no pools


def test_vllm_legs_behind_a_pd_proxy_are_joined_by_their_timing_and_counted_once(runs: dict[str, Run],
                                                                                tmp_path: Path) -> None:
    """vLLM's `llm_request` spans say nothing of P/D: two legs in one trace, the first with one output token
    ending before the second arrives, are the prefill and the decode leg (docs/sources.md)."""
    from typer.testing import CliRunner

    from infertrace.cli import app

    traces = tmp_path / "vllm.jsonl"
    result = CliRunner().invoke(app, ["simulate", "--fleet", str(ROOT / "examples" / "fleets" / "disaggregated.toml"),
                                      "--telemetry", "vllm-v1", "--duration", "30", "--seed", "1", "--out",
                                      str(traces)])
    assert result.exit_code == 0, result.output
    ingest_paths(tmp_path / "store", [traces])
    with Store.open(tmp_path / "store") as store:
        rows = store.sql("""
            SELECT request_id, serving, leg_roles, leg_problem, kv_transfer_ns, client_ttft_ns,
                   gateway_ns + queue_ns + prefill_ns + coalesce(kv_transfer_ns, 0) + coalesce(decode_queue_ns, 0)
                       + coalesce(first_decode_ns, 0) AS phases
            FROM requests WHERE model = 'llama-3-8b'""").df().set_index("request_id")
        legs = set(store.sql("SELECT DISTINCT role FROM request_legs").fetchall())
    assert legs == {("colocated",)}  # vLLM declares no role: the legs' own relation says so
    truth = runs["disaggregated"].truth
    expected = {r for r, legs_of in truth.legs.items() if "decode" in legs_of}
    assert set(rows.index) == expected
    assert (rows["serving"] == "disaggregated").all() and (rows["leg_roles"] == "inferred").all()
    assert rows["leg_problem"].isna().all()
    assert ((rows["phases"] - rows["client_ttft_ns"]).abs() <= 1_000_000).all()
    # The same simulation, seen through vLLM's spans: they start at the API server and time the request on its
    # clock, so each leg's edges move by the frontend's latency (a few ms): the gap between the legs is the
    # engines' transfer within that.
    errors = []
    for request_id, row in rows.iterrows():
        prefill, decode = truth.legs[request_id]["prefill"], truth.legs[request_id]["decode"]
        errors.append(abs(row["kv_transfer_ns"] - (decode.arrival_ns - prefill.token_ns[-1])))
    assert max(errors) <= 5_000_000, max(errors)
