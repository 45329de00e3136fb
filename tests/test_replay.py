"""`infertrace replay` and the what-if validation: a captured window read back from a real store, replayed on the
reference engine under its captured config and under variants, and checked against actual runs of the variants
on the same requests."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from infertrace.cli.replay import replay_distribution, what_if
from infertrace.evaluation.whatif import evaluate_whatif
from infertrace.replay.capture import read_capture
from infertrace.replay.deployment import apply_settings, parse_setting
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "fleets"


def infertrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infertrace.cli", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two minutes of the two-model example fleet (a denied tenant among its traffic), ingested."""
    from reference_engine.api import FleetSimulation

    root = tmp_path_factory.mktemp("two-models")
    FleetSimulation(EXAMPLES / "two_models.toml", 60.0, 3, root / "traces.jsonl.gz", None).run()
    ingest_paths(root / "store", [root / "traces.jsonl.gz"])
    return root / "store"


@pytest.fixture(scope="module")
def whatif_bank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from reference_engine.api import generate_whatif

    root = tmp_path_factory.mktemp("whatif")
    generate_whatif(seed=11, count=2, duration_s=40.0, out_dir=root)  # a chunk budget, then a policy change
    return root


def test_the_capture_carries_the_engines_config_prefix_sharing_and_what_never_reached_an_engine(
        two_models: Path) -> None:
    with Store.open(two_models) as store:
        capture = read_capture(store, "qwen-2.5-1.5b")
        served = store.sql("SELECT count(DISTINCT request_id) FROM requests WHERE model = 'qwen-2.5-1.5b'").fetchall()
    d = capture.deployment
    assert capture.config_source == "spans"
    assert (d.hardware, d.policy, d.chunked_prefill, d.max_num_batched_tokens, d.replicas) == (
        "L4", "decode_first", True, 1024, 1)
    assert len(capture.requests) == served[0][0]
    shared = [r for r in capture.requests if r.system_prompt_id]
    assert shared and all(r.system_prompt_tokens < r.input_tokens for r in shared)
    assert len({r.system_prompt_id for r in shared}) < len(shared)  # the same prompt, named by several requests
    assert capture.unserved.get(401, 0) > 0  # the denied tenant's requests: not replayed, and said so
    assert any("never reached an engine" in n for n in capture.notes)


def test_a_baseline_replay_of_the_captured_config_reproduces_the_captured_ttft_and_itl(two_models: Path) -> None:
    with Store.open(two_models) as store:
        capture = read_capture(store, "llama-3-8b")
    result = what_if(capture, [], calibrated=False)
    assert capture.deployment.router_policy == "prefix_aware"  # read from the router's choices
    assert result.trust.trustworthy is True, result.trust.sentence()
    for metric, error in result.trust.errors.items():
        assert abs(error) < 0.01, (metric, error)


def test_a_baseline_that_misses_the_capture_says_the_replay_is_not_trustworthy_and_by_how_much(
        two_models: Path) -> None:
    with Store.open(two_models) as store:
        capture = read_capture(store, "llama-3-8b")
    wrong = replace(capture, deployment=apply_settings(capture.deployment, [("tensor_parallel", "4")]))
    sentence = what_if(wrong, [], calibrated=False).trust.sentence()
    assert sentence.startswith("The replay is not trustworthy: its baseline misses the capture by -")
    assert "%" in sentence


def test_replay_prints_a_table_per_variant_and_writes_the_json_document(two_models: Path, tmp_path: Path) -> None:
    out = tmp_path / "whatif.json"
    result = infertrace("replay", "--store", str(two_models), "--model", "llama-3-8b", "--set", "chunk=512",
                        "--set", "replicas=1,tp=2", "--json", str(out))
    assert result.returncode == 0, result.stderr
    for row in ("captured", "baseline replay", "chunk=512", "replicas=1 tensor_parallel=2", "TTFT p99", "ITL p99"):
        assert row in result.stdout, (row, result.stdout)
    doc = json.loads(out.read_text())
    assert doc["schema"] == "infertrace.whatif/1"
    assert [v["name"] for v in doc["variants"]] == ["chunk=512", "replicas=1 tensor_parallel=2"]
    second = doc["variants"][1]["deployment"]
    assert (second["replicas"], second["tensor_parallel"]) == (1, 2)
    assert doc["trust"]["trustworthy"] is True


@pytest.mark.slow
def test_replay_bad_settings_exit_2_naming_the_setting(two_models: Path) -> None:
    for args, named in ((("--set", "warp=9"), "warp"), (("--set", "tp=two"), "tp=two"),
                        (("--set", "pd=2"), "pd=2"), (("--model", "gpt-7"), "gpt-7")):
        result = infertrace("replay", "--store", str(two_models), "--model", "llama-3-8b", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert named in result.stderr, (args, result.stderr)


def test_replay_of_a_store_whose_requests_name_no_model_exits_2_saying_there_is_no_traffic(tmp_path: Path) -> None:
    span = {"traceId": "1" * 32, "spanId": "2" * 16, "name": "GET /api/items", "kind": 2,
            "startTimeUnixNano": "1767225600000000000", "endTimeUnixNano": "1767225600050000000"}
    (tmp_path / "web.jsonl").write_text(json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "shop-api"}}]}, "scopeSpans": [{"spans": [span]}]}]}) + "\n")
    ingest_paths(tmp_path / "store", [tmp_path / "web.jsonl"])
    result = infertrace("replay", "--store", str(tmp_path / "store"))
    assert result.returncode == 2 and "no engine request span names a model" in result.stderr, result.stderr


def test_settings_parse_into_a_variant_of_the_captured_deployment(two_models: Path) -> None:
    with Store.open(two_models) as store:
        base = read_capture(store, "llama-3-8b").deployment
    v = apply_settings(base, [parse_setting(s) for s in ("chunk=256", "pd=1:2", "microbatch=512")])
    assert (v.policy, v.chunked_prefill, v.max_num_batched_tokens, v.max_num_seqs) == ("decode_first", True, 256, 256)
    assert (v.prefill_replicas, v.decode_replicas, v.prefill_microbatch) == (1, 2, 512)


def test_a_replay_of_config_a_under_b_predicts_the_actual_run_of_b_on_the_same_requests(whatif_bank: Path) -> None:
    """Replay and actual run share the simulator: this pins that the reconstruction from the store (arrivals,
    routing times, lengths, prefix sharing, the captured config) loses nothing a prediction depends on."""
    section = evaluate_whatif(whatif_bank, replay_distribution)
    assert section["scenarios"] == 2
    assert {r["knob"] for r in section["per_scenario"]} == {"chunk", "policy"}
    for row in section["per_scenario"]:
        assert row["baseline_ok"], row
        assert row["prediction_ok"], row
        # config B really changes what the requests see, so the prediction is not the baseline again
        assert row["actual"] != row["captured"], row


def test_evaluate_whatif_section_on_a_bank_without_whatif_scenarios_says_nothing_was_evaluated(
        tmp_path: Path) -> None:
    section = evaluate_whatif(tmp_path, replay_distribution)
    assert section["scenarios"] == 0 and "nothing was evaluated" in section["note"]


@pytest.mark.slow
@pytest.mark.parametrize("hidden_cost", [False, True])
def test_whatif_replay_meets_its_criteria_over_24_scenarios_covering_every_knob(tmp_path: Path,
                                                                                 hidden_cost: bool) -> None:
    """With hidden costs the engines compute with parameters the spans do not carry: the uncalibrated baseline
    misses (and says so), the replay calibrated on the capture's steps meets the criteria."""
    from infertrace.cli.replay import calibrate_from_capture
    from reference_engine.api import WHATIF_KNOBS, generate_whatif

    generate_whatif(seed=0, count=24, duration_s=120.0, out_dir=tmp_path, jobs=2, hidden_cost=hidden_cost)
    section = evaluate_whatif(tmp_path, replay_distribution, calibrate_from_capture)
    assert section["scenarios"] == 24 and section["calibrated"] == (24 if hidden_cost else 0)
    assert set(section["per_knob"]) == set(WHATIF_KNOBS)
    assert section["baseline_ok"] == 24, section
    assert section["prediction_ok"] == 24, [r for r in section["per_scenario"] if not r["prediction_ok"]]
    if hidden_cost:
        assert max(section["worst_uncalibrated_baseline_error"].values()) > 0.05


@pytest.mark.slow
def test_the_reports_chunked_prefill_recommendation_quotes_a_kept_trustworthy_replay_and_says_so(
        tmp_path: Path) -> None:
    import shutil

    from infertrace.replay.saved import load_whatifs, save_whatif
    from infertrace.report import build_report
    from tests.incident_stores import sample_store

    store_dir = tmp_path / "store"  # a copy: the sample's store is shared by the session's tests
    shutil.copytree(sample_store("prefill_storm").store, store_dir)
    with Store.open(store_dir) as store:
        before = [r for r in build_report(store)["recommendations"] if r["id"].startswith("chunked_prefill:")]
    assert before and all("replay" not in r["because"] for r in before)  # the analyzer's bound alone
    rec = before[0]
    model = rec["action"].split("(")[1].split(")")[0]
    budget = rec["evidence"]["chunk_budget_tokens"]
    with Store.open(store_dir) as store:
        capture = read_capture(store, model)
    variant = apply_settings(capture.deployment, [("chunk", str(budget))])
    result = what_if(capture, [(f"chunk={budget}", variant)], calibrated=False)
    assert result.trust.trustworthy
    save_whatif(store_dir, result.to_json())
    assert [d["model"] for d in load_whatifs(store_dir)] == [model]
    with Store.open(store_dir) as store:
        after = {r["id"]: r for r in build_report(store)["recommendations"]}[rec["id"]]
    assert after["evidence"]["prediction"] == "replay" and after["evidence"]["calibrated"] is False
    assert f"A replay of {len(capture.requests)} captured requests under chunk={budget}" in after["because"]
    assert "uncalibrated roofline cost model" in after["because"]


@pytest.mark.slow
def test_replay_calibrate_fits_the_cost_model_to_the_captured_steps_and_says_the_replay_is_calibrated(
        two_models: Path) -> None:
    result = infertrace("replay", "--store", str(two_models), "--model", "llama-3-8b", "--calibrate", "--no-save",
                        "--set", "chunk=512")
    assert result.returncode == 0, result.stderr
    assert re.search(r"cost model fitted to \d+ measured steps of llama-3-8b: median error prefill", result.stderr)
    assert "(calibrated cost model)" in result.stdout
    assert "reproduces the capture" in result.stdout


def test_a_capture_without_step_spans_is_checked_on_ttft_alone_and_the_sentence_says_what_was_not_checked() -> None:
    import numpy as np

    from infertrace.replay.capture import Distribution
    from infertrace.replay.compare import trust

    ttft = np.array([10_000_000, 20_000_000, 30_000_000])
    observed = Distribution.from_arrays(ttft, np.zeros(0, np.int64), ttft * 10, 300, 10**9, None, None, 0)
    replayed = Distribution.from_arrays(ttft, np.array([5_000_000] * 10), ttft * 10, 300, 10**9, (0.1, 0.2), 0, 0)
    t = trust(observed, replayed)
    assert t.trustworthy is True and set(t.errors) == {"ttft_p50_ms", "ttft_p99_ms"}
    assert "not checked, the capture lacks them: itl p50, itl p99" in t.sentence()


@pytest.fixture(scope="module")
def vllm_whatif_bank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two what-if scenarios whose captures are exported as vLLM V1 spans only, by engines of a hidden speed."""
    from reference_engine.api import generate_whatif

    root = tmp_path_factory.mktemp("whatif-vllm")
    generate_whatif(seed=2, count=2, duration_s=45.0, out_dir=root, hidden_cost=True, telemetry="vllm-v1")
    return root


@pytest.mark.slow
def test_a_vllm_capture_without_step_spans_is_calibrated_on_request_timings_and_checked_on_the_core_ttft(
        vllm_whatif_bank: Path) -> None:
    from infertrace.cli.replay import calibrate_from_capture
    from infertrace.evaluation import open_ingested_store
    from infertrace.replay.capture import read_capture

    scenario = sorted(p for p in vllm_whatif_bank.iterdir() if p.is_dir())[0]
    model = json.loads((scenario / "whatif.json").read_text())["model"]
    with open_ingested_store(scenario / "capture" / "store", scenario / "capture" / "traces.jsonl.gz") as store:
        capture = read_capture(store, model)
        assert not capture.has_step_spans and capture.config_source == "flags"
        assert capture.observed.itl_p50_ms is None
        assert any("engine core" in n for n in capture.notes)
    section = evaluate_whatif(vllm_whatif_bank, replay_distribution, calibrate_from_capture)
    assert section["scenarios"] == 2 and section["calibrated"] == 2
    assert section["capture_telemetry"] == ["vllm-v1"] and section["criteria"]["p99"] == 0.15
    for row in section["per_scenario"]:
        assert "measured request phases" in row["calibration"], row["calibration"]
        assert row["baseline_compared_on"] == ["ttft_p50_ms", "ttft_p99_ms"]
        calibrated = max(abs(row["baseline_error"][m]) for m in row["baseline_compared_on"])
        uncalibrated = max(abs(row["uncalibrated_baseline_error"][m]) for m in row["baseline_compared_on"])
        assert calibrated < uncalibrated, row
        # the prediction of B is scored on B's own spans, per-token ITL included
        assert row["actual"]["itl_p99_ms"] is not None and row["predicted"]["itl_p99_ms"] is not None


@pytest.mark.slow
def test_a_vllm_iteration_log_gives_the_fit_the_steps_the_engines_own_step_spans_show(tmp_path: Path) -> None:
    """vLLM's iteration log, placed on the spans' clock, gives the fit every step of the engine: the same steps,
    prefill tokens, decodes and sampled tokens as the step spans of the same run exported as this project's
    telemetry, the decodes' summed context (estimated from the request spans) and the step times (the scheduler's
    time, which the log leaves out, read back) within 1%; the replay calibrates on them and says so."""
    from infertrace.cli.replay import calibrate_from_capture
    from infertrace.evaluation import open_ingested_store
    from infertrace.evaluation.whatif import evaluate_scenario
    from infertrace.replay.capture import measured_iterations, measured_steps
    from reference_engine.scenarios.whatif import whatif_scenarios, write_whatif_scenario

    s = whatif_scenarios(2, 1, 45.0, True)[0]
    write_whatif_scenario(s, tmp_path / "vllm", "vllm-v1", iteration_logs=True)
    write_whatif_scenario(s, tmp_path / "native", "infertrace")
    vllm, native = tmp_path / "vllm" / s["name"] / "capture", tmp_path / "native" / s["name"] / "capture"
    with open_ingested_store(vllm / "store", vllm / "traces.jsonl.gz",
                             logs=sorted((vllm / "iteration_logs").glob("*.log"))) as store:
        found = measured_iterations(store, s["model"], limit=10**9)
        logged, unplaced = found.steps, found.unplaced
    with open_ingested_store(native / "store", native / "traces.jsonl.gz") as store:
        steps = measured_steps(store, s["model"], limit=10**9)
        cached = dict(store.sql("SELECT request_id, coalesce(cached_tokens, 0) FROM requests").fetchall())
        prompt = dict(store.sql("SELECT request_id, input_tokens FROM requests").fetchall())
    assert unplaced == 0 and len(logged) == len(steps) > 1000
    # the prompt tokens the log shows each request's steps computing: its prompt less its prefix-cache hit, which
    # this project's spans of the same run report
    assert len(found.computed) >= 0.9 * len(prompt)
    exact = sum(prompt[rid] - n == cached[rid] for rid, n in found.computed.items())
    assert exact >= 0.98 * len(found.computed) and any(cached[rid] for rid in found.computed)

    def counts(xs: list) -> tuple[int, int, int]:
        return sum(n for chunks, *_ in xs for n, _ in chunks), sum(x[1] for x in xs), sum(x[3] for x in xs)

    assert counts(logged) == counts(steps)
    for column in (2, 4):  # the decodes' summed context, the step's time
        logged_total, true_total = sum(x[column] for x in logged), sum(x[column] for x in steps)
        assert abs(logged_total / true_total - 1) < 0.01, (column, logged_total, true_total)
    # what each chunk's prompt had computed or cached before it (attention's reach): known where a step was one
    # request's, so short of the truth by what steps shared by several requests leave out
    before = [sum(b for chunks, *_ in xs for _, b in chunks) for xs in (logged, steps)]
    assert 0.9 * before[1] <= before[0] <= before[1], before
    row = evaluate_scenario(tmp_path / "vllm" / s["name"], replay_distribution, calibrate_from_capture)
    assert row["calibration"].startswith(f"cost model fitted to {len(logged)} steps of vLLM's iteration log")
    assert row["baseline_ok"], row["baseline_error"]


def test_a_tp_or_hardware_variant_of_a_capture_calibrated_on_request_timings_says_it_is_not_trustworthy() -> None:
    """Request sums show a step's fixed time (overhead plus weight reads) only as a total, and one degree shows no
    all-reduce: the replay says so for such a variant instead of printing a confident number."""
    import numpy as np

    from infertrace.replay.capture import Capture, Distribution, ReplayRequest
    from infertrace.replay.compare import Variant, build, render_text, variant_caveat
    from infertrace.replay.deployment import Deployment

    ttft = np.array([10_000_000, 20_000_000])
    d = Distribution.from_arrays(ttft, np.zeros(0, np.int64), ttft * 10, 20, 10**9, None, None, 0)
    base = Deployment("llama-3-70b", tensor_parallel=4)
    request_spans = Capture("llama-3-70b", None, None, (ReplayRequest("r", 0, "t", 100, 10, 10),), base, d, {},
                            False, "flags")
    step_spans = replace(request_spans, has_step_spans=True)
    tp8, chunk = replace(base, tensor_parallel=8), replace(base, max_num_batched_tokens=512)
    caveat = variant_caveat(request_spans, tp8, calibrated=True)
    assert caveat is not None and caveat.startswith("not trustworthy: TP 4 → 8") and "all-reduce" in caveat
    assert "not trustworthy" in (variant_caveat(request_spans, replace(base, hardware="A100-SXM"), True) or "")
    assert variant_caveat(request_spans, chunk, calibrated=True) is None
    assert variant_caveat(step_spans, tp8, calibrated=True) is None
    baseline = Variant("baseline", base.as_dict(), base.label(), d, 0.0)
    text = render_text(build(request_spans, baseline, [Variant("tp=8", tp8.as_dict(), tp8.label(), d, 0.0, caveat)],
                             True))
    assert "tp=8: " in text and "not trustworthy: TP 4 → 8" in text


def test_an_sglang_capture_is_compared_on_the_schedulers_clock_and_its_reported_cache_hits_are_not_inferred(
        tmp_path: Path) -> None:
    """SGLang's request span is its tokenizer's: TTFT includes tokenizing, dispatch and detokenizing, which the
    replay does not model. The capture compares on the scheduler's clock, so a replay of an engine at the default
    costs reproduces it; and a calibration on request timings takes the cached tokens SGLang reports, inferring no
    hit from a prefill's time."""
    from infertrace.cli.replay import calibrate_from_capture
    from infertrace.replay.compare import trust
    from reference_engine.engine.config import EngineConfig
    from reference_engine.simulate import simulate
    from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
    from reference_engine.telemetry.profiles import TelemetrySpec
    from reference_engine.workload import SyntheticWorkload, synthetic_requests

    requests = synthetic_requests(SyntheticWorkload(rate=4.0, output_mean=80, max_tokens=256), 40.0, seed=5,
                                  model="llama-3-8b")
    simulate(EngineConfig(), requests, OtlpJsonLinesWriter(tmp_path / "sglang.jsonl"), seed=5,
             telemetry=TelemetrySpec("sglang"))
    ingest_paths(tmp_path / "store", [tmp_path / "sglang.jsonl"])
    with Store.open(tmp_path / "store") as store:
        capture = read_capture(store, "llama-3-8b")
        assert capture.cached_tokens_reported and not capture.has_step_spans
        assert any(n.startswith("TTFT and E2E as SGLang's scheduler saw them") for n in capture.notes)
        assert any(r.shared_prefix_id or r.system_prompt_id for r in capture.requests)
        baseline = trust(capture.observed, replay_distribution(capture.requests, capture.deployment))
        assert baseline.trustworthy, baseline.sentence()
        assert set(baseline.errors) == {"ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"}
        calibrated, sentence = calibrate_from_capture(store, capture)
    assert "measured request phases" in sentence and "inferred" not in sentence
    assert [r.shared_prefix_id for r in calibrated.requests] == [r.shared_prefix_id for r in capture.requests]


def test_a_capture_whose_spans_carry_no_prompt_length_is_refused_naming_the_source(tmp_path: Path) -> None:
    """TGI's spans carry no token counts: a replay with made-up prompt lengths would be fitted to nonsense."""
    from reference_engine.engine.config import EngineConfig
    from reference_engine.simulate import simulate
    from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
    from reference_engine.telemetry.profiles import TelemetrySpec
    from reference_engine.workload import SyntheticWorkload, synthetic_requests

    requests = synthetic_requests(SyntheticWorkload(rate=4.0, output_mean=40, max_tokens=128), 10.0, seed=5,
                                  model="llama-3-8b")
    simulate(EngineConfig(), requests, OtlpJsonLinesWriter(tmp_path / "tgi.jsonl"), seed=5,
             telemetry=TelemetrySpec("tgi"))
    ingest_paths(tmp_path / "store", [tmp_path / "tgi.jsonl"])
    result = infertrace("replay", "--store", str(tmp_path / "store"), "--model", "llama-3-8b", "--set", "chunk=512")
    assert result.returncode == 2, result.stdout
    assert (f"{len(requests)} of the {len(requests)} requests of 'llama-3-8b' in that window have no prompt length "
            "in their spans (source: tgi;") in result.stderr


_TGI_FLEET = """
name = "tgi-behind-litellm"
region = "us-east-1"

[[router]]
id = "router-0"
models = ["llama-3-8b"]

[[model]]
name = "llama-3-8b"
hardware = "H100-SXM"

[[tenant]]
name = "acme"
models = ["llama-3-8b"]
rate = 4.0
prompt_mean = 900.0
output_mean = 60.0
max_tokens = 200
system_prompt_fraction = 0.0
assistant_prefill_fraction = 0.0
"""


def _tgi_fleet_store(tmp_path: Path, engine: str, gateway: str) -> Path:
    from reference_engine.telemetry.profiles import TelemetrySpec
    from tests.fleet_traces import fleet_from_toml, simulate_fleet

    path = tmp_path / f"{engine}-{gateway}.jsonl"
    simulate_fleet(fleet_from_toml(_TGI_FLEET), path, 40.0, seed=3, telemetry=TelemetrySpec(engine, gateway))
    ingest_paths(tmp_path / f"{engine}-{gateway}", [path])
    return tmp_path / f"{engine}-{gateway}"


def test_a_tgi_capture_behind_litellm_takes_prompt_lengths_from_the_proxy_and_compares_on_the_batching_tasks_clock(
        tmp_path: Path) -> None:
    """TGI's spans carry no token counts, but LiteLLM's proxy records the engine's usage on its own span in the
    same trace: the prompt lengths are the engine's (the same run traced natively says so), and the capture,
    compared from the queue append on (TGI's HTTP handler validates and tokenises before it, which the replay does
    not model), is reproduced by a replay of an engine at the default costs. (No request shares a system prompt:
    TGI's spans say nothing of prefix-cache hits, which only `--calibrate` infers.)"""
    from infertrace.replay.compare import trust

    tgi = _tgi_fleet_store(tmp_path, "tgi", "litellm")
    native = _tgi_fleet_store(tmp_path, "infertrace", "infertrace")
    lengths = "SELECT input_tokens FROM request_legs ORDER BY arrival_ns"
    with Store.open(tgi) as store, Store.open(native) as truth:
        assert {s for (s,) in store.sql("SELECT DISTINCT source FROM request_legs").fetchall()} == {"tgi"}
        got = [n for (n,) in store.sql(lengths).fetchall()]
        assert None not in got and got == [n for (n,) in truth.sql(lengths).fetchall()]
        capture = read_capture(store, "llama-3-8b")
        assert any(n.startswith("TTFT and E2E as TGI's batching task saw them") for n in capture.notes)
        baseline = trust(capture.observed, replay_distribution(capture.requests, capture.deployment))
    assert baseline.trustworthy, baseline.sentence()
    assert set(baseline.errors) == {"ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"}
