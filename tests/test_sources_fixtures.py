"""What real engines and gateways export (tests/fixtures/sources/, shaped as each source's code makes its spans)
becomes the same relations as the reference engine's spans, with each source's clocks and identity; and the
reference engine's emulation of each source (`simulate --telemetry`) emits spans of the same shape, and nothing
the source would not."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from infertrace.analyzers import query_text
from infertrace.analyzers.topology import read_topology
from infertrace.sources.components import load_rules, register
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.engine.config import EngineConfig
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.profiles import TelemetrySpec
from reference_engine.workload import SyntheticWorkload, synthetic_requests
from tests.otlp_proto import spans

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "sources"
T0 = 1767225600_000_000_000
MS = 1_000_000


def _store(tmp_path: Path, name: str) -> Store:
    summary = ingest_paths(tmp_path / name, [FIXTURES / f"{name}.jsonl"])
    assert summary.skipped == 0, summary.paragraph()
    return Store.open(tmp_path / name)


def _rows(store: Store, sql: str) -> list[dict[str, Any]]:
    frame = store.sql(sql).df()
    return [{k: (None if v != v else v) for k, v in row.items()} for row in frame.to_dict("records")]


def test_vllm_v1_spans_become_requests_on_v1s_clocks_with_the_model_from_service_name(tmp_path: Path) -> None:
    with _store(tmp_path, "vllm_v1") as store:
        rows = _rows(store, "SELECT * FROM requests ORDER BY arrival_ns")
    assert [r["request_id"] for r in rows] == ["chatcmpl-7f3a9c", "chatcmpl-81c2de"]
    first = rows[0]
    assert (first["source"], first["timing_source"]) == ("vllm-v1", "gen_ai.latency")
    # TTFT on the API server's clock; the prefill (engine core) ends at the first token, so scheduling is the first
    # token less the prefill: 50 ms after arrival, not the core's 30 ms time_in_queue after it.
    assert first["arrival_ns"] == T0
    assert first["first_token_ns"] == T0 + 250 * MS
    assert first["scheduled_ns"] == T0 + 50 * MS and first["queue_ns"] == 50 * MS
    assert first["finish_ns"] == T0 + 1500 * MS and first["e2e_ns"] == 1500 * MS
    assert (first["input_tokens"], first["output_tokens"], first["max_tokens"]) == (512, 64, 256)
    assert first["cached_tokens"] is None and first["preemptions"] is None
    assert [r["finish_reason"] for r in rows] == ["stop", "length"]
    assert {(r["model"], r["model_source"]) for r in rows} == {("llama-3-8b", "service.name")}
    assert {(r["instance"], r["instance_source"]) for r in rows} == {("llama-3-8b:48213",
                                                                      "service.name+vllm.process_id")}


def test_vllm_v0_spans_keep_one_clock_and_the_response_model(tmp_path: Path) -> None:
    with _store(tmp_path, "vllm_v0") as store:
        (row,) = _rows(store, "SELECT * FROM requests")
    assert (row["source"], row["request_id"], row["model"]) == ("vllm-v0", "cmpl-3f1", "Qwen/Qwen2.5-1.5B-Instruct")
    assert row["scheduled_ns"] == T0 + 12 * MS and row["first_token_ns"] == T0 + 80 * MS
    assert row["finish_ns"] == T0 + 950 * MS and row["prefill_ns"] == 68 * MS
    assert (row["input_tokens"], row["output_tokens"], row["finish_reason"]) == (420, 100, None)
    assert (row["instance"], row["instance_source"]) == ("vllm-qwen", "service.name")


def test_sglang_request_stages_and_decode_loops_give_the_request_and_each_tokens_time(tmp_path: Path) -> None:
    with _store(tmp_path, "sglang") as store:
        (row,) = _rows(store, "SELECT * FROM requests")
        tokens = _rows(store, "SELECT * FROM tokens ORDER BY token_index")
    assert (row["source"], row["request_id"], row["model"]) == ("sglang", "a1b2c3d4e5f60718",
                                                                 "meta-llama/Llama-3.1-8B-Instruct")
    assert (row["instance"], row["instance_source"]) == ("3f2a9c1e:2042", "sglang scheduler")
    assert row["scheduled_ns"] == T0 + 40 * MS  # prefill_forward starts
    assert row["first_token_ns"] == T0 + 150 * MS and row["finish_ns"] == T0 + 1200 * MS
    assert (row["input_tokens"], row["output_tokens"], row["cached_tokens"]) == (256, 3, 128)
    assert (row["prefill_chunks"], row["preemptions"], row["finish_reason"]) == (0, 0, "stop")
    assert [t["time_ns"] - T0 for t in tokens] == [148 * MS, 600 * MS, 1199 * MS]
    assert [t["itl_ns"] for t in tokens] == [None, 452 * MS, 599 * MS]
    assert [t["from_prefill"] for t in tokens] == [True, False, False]
    assert {t["instance"] for t in tokens} == {"3f2a9c1e:2042"}


def _sglang_pd_leg(role: str, trace_id: str, ids: str, scheduler_pid: int, room: int | None) -> str:
    """The SGLang fixture's request as one server of a P/D pair exports it in its own trace (no trace context from
    the router): its root span named `<role> Req <rid[:8]>` with `bootstrap_room` as `str(hex(room))`
    (TraceReqContext.trace_req_start at sgl-project/sglang@b8e5a7c39773), its own trace and span ids and scheduler."""
    text = (FIXTURES / "sglang.jsonl").read_text()
    text = text.replace("00000000000000007c1e5a9b3d2f4e60", trace_id).replace("a1000000000000", ids)
    batch = json.loads(text)
    for resource_spans in batch["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                attributes = {a["key"]: a for a in span.get("attributes", [])}
                if span["name"].startswith("Req "):
                    span["name"] = f"{role} {span['name']}"
                    if room is not None:
                        span["attributes"].append({"key": "bootstrap_room", "value": {"stringValue": hex(room)}})
                if attributes.get("thread_label", {}).get("value") == {"stringValue": "Scheduler"}:
                    span["name"] = span["name"].replace("pid:2042", f"pid:{scheduler_pid}")
                    attributes["pid"]["value"] = {"intValue": str(scheduler_pid)}
    return json.dumps(batch)


def test_sglang_prefill_and_decode_legs_in_two_traces_are_one_request_paired_by_bootstrap_room(
        tmp_path: Path) -> None:
    """SGLang's router sends a P/D request to a prefill and a decode server with one bootstrap_room; without trace
    context each server's `Req` span starts its own trace. The room pairs them: one request, counted once; a decode
    leg with another room stays a request of its own that says its prefill leg is missing."""
    room = 0x5DEECE66D2B1A3F
    legs = [_sglang_pd_leg("prefill", "0000000000000000" + "1" * 16, "b1000000000000", 3101, room),
            _sglang_pd_leg("decode", "0000000000000000" + "2" * 16, "c1000000000000", 3202, room),
            _sglang_pd_leg("decode", "0000000000000000" + "3" * 16, "d1000000000000", 3303, room + 1)]
    path = tmp_path / "sglang_pd.jsonl"
    path.write_text("\n".join(legs) + "\n")
    summary = ingest_paths(tmp_path / "store", [path])
    assert summary.skipped == 0, summary.paragraph()
    with Store.open(tmp_path / "store") as store:
        legs_rows = _rows(store, "SELECT trace_id, role, pair_key FROM request_legs ORDER BY trace_id")
        rows = _rows(store, "SELECT * FROM requests ORDER BY trace_id")
    assert [(r["role"], r["pair_key"]) for r in legs_rows] == [("prefill", hex(room)), ("decode", hex(room)),
                                                               ("decode", hex(room + 1))]
    assert len(rows) == 2
    paired, alone = rows
    assert paired["trace_id"] == "0000000000000000" + "2" * 16  # the decode leg's: the client's tokens came from it
    assert (paired["serving"], paired["legs"], paired["leg_roles"], paired["leg_problem"]) == (
        "disaggregated", 2, "declared", None)
    assert (paired["prefill_instance"], paired["decode_instance"]) == ("3f2a9c1e:3101", "3f2a9c1e:3202")
    assert (paired["input_tokens"], paired["output_tokens"], paired["cached_tokens"]) == (256, 3, 128)
    # sent at once, the decode leg arrived before the prefill ended: the transfer is not measured (not negative),
    # the decode worker's wait runs from the prefill's end, and the phases still sum to the client's TTFT
    assert paired["kv_transfer_ns"] is None
    assert paired["decode_queue_ns"] >= 0 and paired["first_decode_ns"] >= 0
    assert (paired["queue_ns"] + paired["prefill_ns"] + paired["decode_queue_ns"] + paired["first_decode_ns"]
            == paired["client_ttft_ns"])
    assert (alone["legs"], alone["serving"], alone["leg_problem"]) == (1, "disaggregated",
                                                                      "decode leg without a prefill leg")
    assert alone["decode_instance"] == "3f2a9c1e:3303" and alone["prefill_instance"] is None


def test_tgi_handler_spans_are_requests_and_send_generation_spans_their_tokens(tmp_path: Path) -> None:
    with _store(tmp_path, "tgi") as store:
        (row,) = _rows(store, "SELECT * FROM requests")
        tokens = _rows(store, "SELECT * FROM tokens ORDER BY token_index")
        outcomes = _rows(store, query_text("request_outcomes"))
    assert (row["source"], row["model"], row["model_source"]) == ("tgi", "text-generation-inference.router",
                                                                  "service.name")
    assert row["request_id"] == "c100000000000001"  # TGI exports no request id: the handler span's id
    assert (row["arrival_ns"], row["scheduled_ns"]) == (T0, T0 + 50 * MS)
    assert (row["first_token_ns"], row["finish_ns"]) == (T0 + 450 * MS, T0 + 900 * MS)
    assert (row["output_tokens"], row["input_tokens"]) == (2, None)
    assert [t["itl_ns"] for t in tokens] == [None, 430 * MS]
    # the batch spans are traces of their own, not requests; without a gateway the engine's span is the caller's
    assert [(o["seen_at"], o["ttft_ns"]) for o in outcomes] == [("engine", 450 * MS)]


def test_a_litellm_proxys_in_process_hooks_are_components_once_a_components_file_names_them(tmp_path: Path) -> None:
    with _store(tmp_path, "litellm_vllm_v0") as store:
        calls = _rows(store, "SELECT component, role, found_by FROM component_calls ORDER BY start_ns")
        assert [(c["component"], c["role"]) for c in calls] == [("gateway", "entry"), ("auth", "call"),
                                                                 ("redis", "call"), ("router", "call")]
        assert {c["found_by"] for c in calls if c["role"] == "call"} == {"same_service"}  # litellm_request wraps
        assert not read_topology(store).has_components  # in-process hooks: unnamed, they are not components
        register(store, load_rules(ROOT / "examples" / "components" / "litellm.toml"))
        nodes = {(n.kind, n.instance) for n in read_topology(store).nodes}
        (outcome,) = _rows(store, query_text("request_outcomes"))
        (request,) = _rows(store, "SELECT tenant, model FROM requests")
    assert nodes == {("auth", "litellm auth"), ("router", "litellm router"), ("engine", "vllm-qwen")}
    assert (outcome["seen_at"], outcome["ttft_ns"], outcome["pre_engine_ns"]) == ("entry", 100 * MS, 10 * MS)
    assert request == {"tenant": "team-red", "model": "Qwen/Qwen2.5-1.5B-Instruct"}


@pytest.mark.slow
def test_a_components_file_changes_what_report_ranks_even_after_the_store_materialised_its_results_without_one(
        tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from infertrace.cli import app
    from infertrace.results import result

    store_dir, rules = tmp_path / "store", ROOT / "examples" / "components" / "litellm.toml"
    runner = CliRunner()
    ingested = runner.invoke(app, ["ingest", "--store", str(store_dir), str(FIXTURES / "litellm_vllm_v0.jsonl")])
    assert ingested.exit_code == 0, ingested.output
    assert list((store_dir / "derived" / "results" / "report").iterdir()), "ingest materialised the report"

    def report(*extra: str) -> dict[str, Any]:
        out = runner.invoke(app, ["report", "--store", str(store_dir), "--format", "json", "--fail-on", "never",
                                  *extra])
        assert out.exit_code == 0, out.output
        return {a["key"]: a for a in json.loads(out.stdout)["coverage"]["analyses"]}

    for extra in ((), ("--components", str(rules)), ()):  # without, with, and without the rules again
        components = report(*extra)["rca_components"]
        assert components["supported"] == bool(extra), components
        assert ("2 component calls" in components["detail"]) == bool(extra), components
    with Store.open(store_dir) as store:
        assert not result(store, "rca").topology.has_components
        register(store, load_rules(rules))
        assert result(store, "rca").topology.has_components  # kept under a key of its own


# ------------------------------------------------------------------------------- the emulations' shape
def _shape(path: Path) -> dict[str, dict[str, str]]:
    """Per span name (SGLang's request and thread spans by their fixed part), each attribute key and its value
    kind; and the resource's keys under "(resource)"."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for p in spans(path):
        name = p.span.name
        if name.startswith("Req "):
            name = "Req …"
        elif "(host:" in name:
            name = name.split(" ")[0] + " (host:…)"
        for kv in p.span.attributes:
            out[name][kv.key] = kv.value.WhichOneof("value")
        out["(resource)"].update({k: type(v).__name__ for k, v in p.resource.items()})
    return dict(out)


@pytest.mark.parametrize(("profile", "fixture"), [("vllm-v1", "vllm_v1"), ("vllm-v0", "vllm_v0"),
                                                  ("sglang", "sglang"), ("tgi", "tgi")])
def test_the_emulation_emits_what_the_engine_emits_and_nothing_more(profile: str, fixture: str,
                                                                      tmp_path: Path) -> None:
    config = EngineConfig(chunked_prefill=True, policy="decode_first", max_num_batched_tokens=512)
    requests = synthetic_requests(SyntheticWorkload(rate=4.0, output_mean=8, max_tokens=32), 3.0, seed=2,
                                  model=config.model)
    path = tmp_path / "emulated.jsonl"
    simulate(config, requests, OtlpJsonLinesWriter(path), seed=2, telemetry=TelemetrySpec(profile))
    emulated, real = _shape(path), _shape(FIXTURES / f"{fixture}.jsonl")
    extra_names = set(emulated) - set(real) - {"chunked_prefill"}  # the fixture's request had one chunk
    assert not extra_names, f"{profile} emits spans the engine does not: {extra_names}"
    for name, attributes in emulated.items():
        if name == "(resource)":
            assert set(attributes) <= set(real[name]) | {"service.name"}, (set(attributes), set(real[name]))
            continue
        known = real.get(name, {})
        extra = {k: v for k, v in attributes.items() if known.get(k) != v}
        assert not extra, f"{profile} {name}: keys or kinds the engine does not emit: {extra}"
