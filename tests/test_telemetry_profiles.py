"""The reference engine's emulations of other engines' telemetry (`simulate --telemetry`): the default stays this
project's own spans byte for byte; vLLM gets one span per request and nothing per step, on vLLM's own clocks;
the gateway can name its spans like LiteLLM's or emit none; and the side files (vLLM's iteration log, a streaming
client's token times) have their documented formats. Spans are read with the official opentelemetry-proto
parser."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertrace import semconv as sc
from infertrace.analyzers.itl_requests import ITERATION_LINE
from infertrace.cli import app
from reference_engine.engine.config import EngineConfig
from reference_engine.fleet.fleet import Fleet
from reference_engine.fleet.workload import fleet_requests
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.profiles import TelemetrySpec
from reference_engine.telemetry.tgi import rust_duration
from reference_engine.workload import SyntheticWorkload, synthetic_requests
from tests.engine_runs import run_to_store
from tests.fleet_traces import fleet_from_toml
from tests.otlp_proto import spans

ROOT = Path(__file__).resolve().parent.parent
CONFIG = EngineConfig(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=1024)


def _requests(seconds: float = 6.0, seed: int = 3) -> list:
    return synthetic_requests(SyntheticWorkload(rate=5.0, output_mean=24, max_tokens=64), seconds, seed=seed,
                              model=CONFIG.model)


def _simulate(path: Path, telemetry: TelemetrySpec | None, config: EngineConfig = CONFIG) -> None:
    simulate(config, _requests(), OtlpJsonLinesWriter(path), seed=3, telemetry=telemetry)


def test_the_default_profile_writes_the_same_bytes_as_the_engine_without_any_profile(tmp_path: Path) -> None:
    _simulate(tmp_path / "plain.jsonl", None)
    _simulate(tmp_path / "native.jsonl", TelemetrySpec())
    # with a side file the run goes through the profile machinery, and still writes the same spans
    _simulate(tmp_path / "with_client.jsonl", TelemetrySpec(client_tokens=tmp_path / "client.jsonl"))
    plain = (tmp_path / "plain.jsonl").read_bytes()
    assert plain == (tmp_path / "native.jsonl").read_bytes() == (tmp_path / "with_client.jsonl").read_bytes()

    fleet = fleet_from_toml((ROOT / "examples" / "fleets" / "two_models.toml").read_text())
    outputs = []
    for i, telemetry in enumerate((None, TelemetrySpec(client_tokens=tmp_path / "fleet_client.jsonl"))):
        writer = OtlpJsonLinesWriter(tmp_path / f"fleet{i}.jsonl")
        try:
            Fleet(fleet, writer, 4, telemetry=telemetry).run(fleet_requests(fleet, 10.0, 4))
        finally:
            writer.close()
        outputs.append((tmp_path / f"fleet{i}.jsonl").read_bytes())
    assert outputs[0] == outputs[1] and len(outputs[0]) > 10_000


def test_vllm_v1_emits_one_llm_request_per_request_on_the_api_servers_and_the_engine_cores_clocks(
        tmp_path: Path) -> None:
    _simulate(tmp_path / "v1.jsonl", TelemetrySpec("vllm-v1"))
    parsed = spans(tmp_path / "v1.jsonl")
    truth = run_to_store(tmp_path, CONFIG, _requests())[0]
    native = {r[0]: r[1:] for r in truth.sql("SELECT request_id, arrival_ns, scheduled_ns, first_token_ns, finish_ns "
                                             "FROM requests").fetchall()}
    assert {p.span.name for p in parsed} == {sc.SPAN_REQUEST}  # nothing per step, no phase spans
    assert len(parsed) == len(native)
    for p in parsed:
        a = p.attrs
        arrival, scheduled, first, finish = native[a[sc.REQUEST_ID]]
        start = p.span.start_time_unix_nano
        frontend_in = arrival - start  # the API server had it this much before the engine core
        assert 1_000_000 <= frontend_in <= 3_000_000
        assert round(a[sc.LATENCY_TIME_IN_QUEUE] * 1e9) == pytest.approx(scheduled - arrival, abs=1)
        # start + time_in_queue is early by the API server's latency; first token - prefill is not
        queue_ns, ttft_ns, prefill_ns = (round(a[k] * 1e9) for k in (
            sc.LATENCY_TIME_IN_QUEUE, sc.LATENCY_TIME_TO_FIRST_TOKEN, sc.LATENCY_TIME_IN_MODEL_PREFILL))
        assert start + queue_ns == pytest.approx(scheduled - frontend_in, abs=2)
        frontend_out = start + ttft_ns - first  # the API server learns of the first token this much later
        assert 200_000 - 2 <= frontend_out <= 1_000_000 + 2
        assert start + ttft_ns - prefill_ns == pytest.approx(scheduled + frontend_out, abs=2)
        assert start + round(a[sc.LATENCY_E2E] * 1e9) - finish <= 1_000_000 + 2  # its own draw of that latency
        assert json.loads(a[sc.RESPONSE_FINISH_REASONS])[0] in ("stop", "length")  # a JSON string, as vLLM's
        assert sc.RESPONSE_MODEL not in a and sc.USAGE_CACHE_READ_INPUT_TOKENS not in a
        assert sc.SERVICE_INSTANCE_ID not in p.resource and p.resource[sc.VLLM_RES_PROCESS_ID].isdigit()


def test_sglang_and_tgi_time_every_token_and_tgi_links_each_step_to_its_requests(tmp_path: Path) -> None:
    _simulate(tmp_path / "sglang.jsonl", TelemetrySpec("sglang"))
    _simulate(tmp_path / "tgi.jsonl", TelemetrySpec("tgi"))
    sglang, tgi = spans(tmp_path / "sglang.jsonl"), spans(tmp_path / "tgi.jsonl")
    roots = [p for p in sglang if p.span.name.startswith(sc.SGLANG_SPAN_REQUEST_PREFIX)]
    loops = Counter(p.span.trace_id for p in sglang if p.span.name == "decode_loop")
    for root in roots:  # one decode_loop per token after the first
        assert loops[root.span.trace_id] == root.attrs[sc.VLLM_USAGE_COMPLETION_TOKENS] - 1
        assert root.span.trace_id[:8] == bytes(8)  # SGLang's 64-bit trace ids
    assert {p.resource[sc.SERVICE_NAME] for p in sglang} == {"sglang"}
    handlers = [p for p in tgi if p.span.name == "chat_completions"]
    sent = Counter(p.span.trace_id for p in tgi if p.span.name == "send_generation")
    assert len(handlers) == len(roots) and sum(sent.values()) == sum(loops.values()) + len(roots)
    batches = {p.span.span_id for p in tgi if p.span.name == "batch"}
    infers = [p for p in tgi if p.span.name == "infer"]
    assert infers and all(len(p.span.links) == 1 and p.span.links[0].span_id in batches for p in infers)
    assert {p.span.kind for p in tgi} == {1}  # tracing-opentelemetry makes every span INTERNAL
    assert all(p.resource == {sc.SERVICE_NAME: CONFIG.model} for p in tgi)


def test_rust_durations_print_as_tgi_records_them() -> None:
    assert [rust_duration(ns) for ns in (1_234_567_891, 2_000_000_000, 12_500_000, 850_000, 40)] == [
        "1.234567891s", "2s", "12.5ms", "850µs", "40ns"]


def test_the_iteration_log_has_vllms_line_format_one_line_per_step_and_dummy_lines_for_idle_dp_ranks(
        tmp_path: Path) -> None:
    fleet = fleet_from_toml((ROOT / "examples" / "fleets" / "two_models.toml").read_text())
    telemetry = TelemetrySpec("vllm-v1", iteration_logs=tmp_path / "logs")
    writer = OtlpJsonLinesWriter(tmp_path / "spans.jsonl")
    try:
        Fleet(fleet, writer, 2, telemetry=telemetry).run(fleet_requests(fleet, 15.0, 2))
    finally:
        writer.close()
    logs = sorted((tmp_path / "logs").glob("*.log"))
    assert [p.stem for p in logs] == ["llama-3-8b-0", "llama-3-8b-1", "qwen-2.5-1.5b-0"]
    for path in logs:
        lines = path.read_text().splitlines()
        assert lines and all(ITERATION_LINE.search(line) for line in lines)
        assert [int(ITERATION_LINE.search(line)["iteration"]) for line in lines] == list(range(len(lines)))
        rank = "DP1" if path.stem == "llama-3-8b-1" else "DP0"
        assert all(line.startswith(f"(EngineCore_{rank} pid=") for line in lines)
        dummies = [line for line in lines if line.endswith(" (dummy)")]
        # llama's two replicas form a data-parallel group: an idle rank logs dummy iterations; qwen's is alone
        assert bool(dummies) == path.stem.startswith("llama")
        assert all("0 context requests, 0 context tokens, 0 generation requests, 0 generation tokens" in d
                   for d in dummies)


def test_client_token_times_are_one_json_line_per_request_in_order_and_after_the_engine(tmp_path: Path) -> None:
    path = tmp_path / "client.jsonl"
    _simulate(tmp_path / "spans.jsonl", TelemetrySpec(client_tokens=path, client_delay_ms=2.0, client_jitter_ms=1.0))
    truth = run_to_store(tmp_path, CONFIG, _requests())[0]
    engine = {}
    for rid, t in truth.sql("SELECT request_id, time_ns FROM tokens ORDER BY request_id, time_ns").fetchall():
        engine.setdefault(rid, []).append(t)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(engine)
    for line in lines:
        assert set(line) == {"request_id", "model", "sent_ns", "token_ns"}
        times, produced = line["token_ns"], engine[line["request_id"]]
        assert len(times) == len(produced) and times == sorted(times)
        assert all(2_000_000 <= c - e <= 3_000_000 for c, e in zip(times, produced, strict=True)) or all(
            c >= e + 2_000_000 for c, e in zip(times, produced, strict=True))
        assert line["sent_ns"] < times[0]


def test_a_gateway_named_like_litellms_or_none_at_all(tmp_path: Path) -> None:
    fleet = fleet_from_toml((ROOT / "examples" / "fleets" / "two_models.toml").read_text())
    out = {}
    for gateway in ("litellm", "none"):
        writer = OtlpJsonLinesWriter(tmp_path / f"{gateway}.jsonl")
        try:
            Fleet(fleet, writer, 1, telemetry=TelemetrySpec("vllm-v1", gateway)).run(fleet_requests(fleet, 10.0, 1))
        finally:
            writer.close()
        out[gateway] = spans(tmp_path / f"{gateway}.jsonl")
    names = Counter(p.span.name for p in out["litellm"])
    assert {"Received Proxy Server Request", "litellm_request", "auth", "proxy_pre_call", "router"} <= set(names)
    assert not {sc.SPAN_GATEWAY, sc.SPAN_ROUTE, sc.SPAN_RATE_LIMIT} & set(names)
    assert not any(k.startswith(sc.PREFIX) for p in out["litellm"] for k in [*p.attrs, *p.resource])
    by_id = {p.span.span_id: p for p in out["litellm"]}
    for p in out["litellm"]:
        if p.span.name == sc.SPAN_REQUEST:  # the engine's span is the child of the proxy's call to it
            assert by_id[p.span.parent_span_id].span.name == "litellm_request"
    assert {p.span.name for p in out["none"]} == {sc.SPAN_REQUEST}
    assert all(not p.span.parent_span_id for p in out["none"])


def test_simulate_refuses_an_unknown_profile_and_an_iteration_log_without_vllm_v1(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["simulate", "--telemetry", "triton", "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2 and "--telemetry must be one of" in result.output
    result = runner.invoke(app, ["simulate", "--telemetry", "sglang", "--iteration-logs", str(tmp_path / "logs"),
                                 "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2 and "vLLM V1" in result.output
    result = runner.invoke(app, ["simulate", "--gateway-telemetry", "litellm", "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2 and "needs --fleet" in result.output
