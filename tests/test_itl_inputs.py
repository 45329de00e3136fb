"""ITL attribution on engines that export no step spans, as a vLLM user meets it from the CLI: a client's token
times and vLLM's iteration log ingested into their own relations, and `report` naming culprit prefills."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
import zstandard
from typer.testing import CliRunner

from infertrace.analyzers.itl_iterations import attribute_iterations
from infertrace.cli import app
from infertrace.evaluation.itl import evaluate_itl
from infertrace.store.side_inputs import parse_iteration_log
from infertrace.store.store import Store

T0 = 1_767_225_600 * 10**9  # 2026-01-01 00:00:00 UTC
MS = 10**6


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_ingest_keeps_client_token_times_and_an_iteration_log_in_their_own_relations(tmp_path: Path) -> None:
    tokens = tmp_path / "client.jsonl"
    tokens.write_text(
        json.dumps({"request_id": "r1", "model": "m", "sent_ns": T0, "token_ns": [T0 + 5 * MS, T0 + 9 * MS]}) + "\n"
        + json.dumps({"request_id": "r2", "token_ns": [T0 + 7 * MS]}) + "\n"
        + json.dumps({"request_id": "r3", "token_ns": [T0 + 9 * MS, T0 + 8 * MS]}) + "\n", encoding="utf-8")
    log = tmp_path / "engine-0.log"
    log.write_text("INFO 01-01 00:00:00 [api_server.py:1] Started server process\n"
                   "(EngineCore_DP1 pid=77) INFO 01-01 00:00:00 [core.py:397] Iteration(3): 1 context requests, 2048 "
                   "context tokens, 4 generation requests, 4 generation tokens, iteration elapsed time: 61.50 ms\n"
                   "(EngineCore_DP1 pid=77) INFO 01-01 00:00:01 [core.py:397] Iteration(4): 0 context requests, 0 "
                   "context tokens, 0 generation requests, 0 generation tokens, iteration elapsed time: 0.12 ms "
                   "(dummy)\n", encoding="utf-8")
    store = tmp_path / "store"
    said = _invoke("ingest", "--store", str(store), "--no-progress", "--no-materialize", str(tokens))
    assert "Ingested 2 requests of client token times from 1 files: 2 new" in said
    assert "Skipped 1 lines" in said
    said = _invoke("ingest", "--store", str(store), "--no-progress", "--no-materialize", "--source",
                   "vllm-iteration-log", str(log))
    assert "Ingested 2 iterations of vLLM iteration logs from 1 files: 2 new" in said
    again = _invoke("ingest", "--store", str(store), "--no-progress", "--no-materialize", str(tokens), str(log))
    assert "0 new, 2 already stored" in again and "0 new, 2 already stored" in again.split("client token")[1]
    with Store.open(store) as s:
        assert s.sql("SELECT request_id, token_index, time_ns FROM client_tokens ORDER BY ALL").fetchall() == [
            ("r1", 0, T0 + 5 * MS), ("r1", 1, T0 + 9 * MS), ("r2", 0, T0 + 7 * MS)]
        rows = s.sql("SELECT log, dp_rank, pid, iteration, stamp, context_tokens, generation_requests, elapsed_ns, "
                     "dummy FROM iteration_log ORDER BY line").fetchall()
        assert rows == [("engine-0", 1, 77, 3, "01-01 00:00:00", 2048, 4, 61_500_000, False),
                        ("engine-0", 1, 77, 4, "01-01 00:00:01", 0, 0, 120_000, True)]
        assert s.sql("SELECT count(*) FROM spans").fetchall() == [(0,)]
    quarantined = [json.loads(line) for q in (store / "quarantine").glob("*.jsonl") for line in q.open()]
    assert [(q["line"], q["reason"]) for q in quarantined] == [
        (3, "token_ns decreases (a stream delivers tokens in order)")]


@pytest.mark.parametrize("packed", [".gz", ".zst"])
def test_compressed_token_times_and_iteration_logs_are_told_by_their_content_and_read_as_plain_ones(
        tmp_path: Path, packed: str) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "client.jsonl").write_text(json.dumps({"request_id": "r1", "token_ns": [T0 + 5 * MS, T0 + 9 * MS]})
                                        + "\n", encoding="utf-8")
    (plain / "engine-1.log").write_text(
        "(EngineCore_DP0 pid=7) INFO 01-01 00:00:00 [core.py:397] Iteration(3): 1 context requests, 512 context "
        "tokens, 2 generation requests, 2 generation tokens, iteration elapsed time: 21.00 ms\n", encoding="utf-8")
    pack = gzip.compress if packed == ".gz" else zstandard.ZstdCompressor().compress
    logs = tmp_path / "logs"
    logs.mkdir()
    tokens = tmp_path / f"client.jsonl{packed}"
    tokens.write_bytes(pack((plain / "client.jsonl").read_bytes()))
    (logs / f"engine-1.log{packed}").write_bytes(pack((plain / "engine-1.log").read_bytes()))
    said = _invoke("ingest", "--store", str(tmp_path / "store"), "--no-progress", "--no-materialize", str(tokens))
    assert "Ingested 1 requests of client token times from 1 files: 1 new" in said  # told by content (auto)
    said = _invoke("ingest", "--store", str(tmp_path / "store"), "--no-progress", "--no-materialize", "--source",
                   "vllm-iteration-log", str(logs))
    assert "Ingested 1 iterations of vLLM iteration logs from 1 files: 1 new" in said  # found in the directory
    with Store.open(tmp_path / "store") as s:
        assert s.sql("SELECT request_id, time_ns FROM client_tokens ORDER BY ALL").fetchall() == [
            ("r1", T0 + 5 * MS), ("r1", T0 + 9 * MS)]
        assert s.sql("SELECT log, context_tokens, elapsed_ns FROM iteration_log").fetchall() == [
            ("engine-1", 512, 21_000_000)]  # the instance: the name without .log and the compression suffix


def _line(end_ns: int, index: int, ctx: int, ctx_tokens: int, gen: int, elapsed_ns: int, hours: int = 0) -> str:
    stamp = datetime.fromtimestamp(end_ns // 10**9 + hours * 3600, UTC).strftime("%m-%d %H:%M:%S")
    return (f"(EngineCore_DP0 pid=9) INFO {stamp} [core.py:397] Iteration({index}): {ctx} context requests, "
            f"{ctx_tokens} context tokens, {gen} generation requests, {gen} generation tokens, iteration elapsed "
            f"time: {elapsed_ns / 1e6:.2f} ms")


def test_an_iteration_log_names_the_prefill_only_iteration_that_stalled_a_decode_and_places_it_in_time() -> None:
    # "d" decodes in 10 ms iterations; "p" (2,000 prompt tokens) is prefilled alone in a 40 ms iteration ending at
    # 2.3 s, while d waits (prefill-first). The log's stamps are whole seconds, on a clock two hours ahead.
    prefill_end = T0 + 2_300 * MS
    lines, t, k = [], T0 + 100 * MS, 0
    while t < T0 + 4_000 * MS:
        if t == prefill_end - 40 * MS:
            t = prefill_end
            lines.append(_line(t, k, 1, 2000, 0, 40 * MS - 250_000, hours=2))
        else:
            t += 10 * MS
            lines.append(_line(t, k, 0, 0, 1, 10 * MS - 250_000, hours=2))
        k += 1
    log = parse_iteration_log(iter(lines), "e0").to_pandas()
    requests = pd.DataFrame({"request_id": ["d", "p"], "instance": ["e0", "e0"], "tenant": ["t", "t"],
                             "scheduled_ns": [T0 + 50 * MS, prefill_end - 40 * MS],
                             "first_token_ns": [T0 + 100 * MS, prefill_end], "finish_ns": [T0 + 4_000 * MS,
                                                                                            prefill_end + 20 * MS],
                             "input_tokens": [100, 2000], "cached_tokens": [None, None]})
    result = attribute_iterations(log, requests)
    (stall,) = result.stalls
    assert (stall.context_tokens, stall.generation_requests) == (2000, 0)  # prefill-only: d waited for it
    assert abs(stall.end_ns - prefill_end) <= 1 * MS
    assert stall.excess_ns == 40 * MS - 250_000
    assert [(c.request_id, c.confidence) for c in stall.culprits] == [("p", 1.0)]
    (placed,) = result.logs
    assert placed.instance == "e0" and abs(placed.offset_ns + 2 * 3600 * 10**9) < 1_000 * MS


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 s of vLLM V1 telemetry: spans, a client's token times and the iteration log."""
    root = tmp_path_factory.mktemp("vllm")
    _invoke("simulate", "--telemetry", "vllm-v1", "--instance-ids", "--rate", "6", "--prompt-mean", "1500",
            "--output-mean", "40", "--duration", "20", "--seed", "3", "--no-progress", "--out",
            str(root / "spans.jsonl.gz"), "--client-tokens", str(root / "client.jsonl"), "--iteration-logs",
            str(root / "logs"))
    return root


@pytest.mark.slow
def test_report_on_a_vllm_v1_store_names_culprits_with_the_best_method_its_inputs_allow(vllm_run: Path,
                                                                                          tmp_path: Path) -> None:
    spans, tokens, logs = vllm_run / "spans.jsonl.gz", vllm_run / "client.jsonl", vllm_run / "logs"
    methods = {"tokens": "request spans + client token times", "log": "request spans + iteration log",
               "both": "request spans + client token times + iteration log"}
    for name, expected in methods.items():
        store = tmp_path / name
        _invoke("ingest", "--store", str(store), "--no-progress", "--no-materialize", str(spans))
        if name in ("tokens", "both"):
            _invoke("ingest", "--store", str(store), "--no-progress", "--no-materialize", str(tokens))
        if name in ("log", "both"):
            _invoke("ingest", "--store", str(store), "--no-progress", "--no-materialize", "--source",
                    "vllm-iteration-log", str(logs))
        doc = json.loads(_invoke("report", "--store", str(store), "--format", "json", "--fail-on", "never"))
        itl = doc["sections"]["itl"]
        analysis = next(a for a in doc["coverage"]["analyses"] if a["key"] == "itl")
        assert analysis["supported"], analysis
        assert itl["method"] == expected
        assert itl["stalls"] > 0 and itl["top_culprits"]
        assert all(0 < c["confidence"] <= 1 for c in itl["top_culprits"])
        assert any(f["id"] == "itl:stalls" and itl["top_culprits"][0]["request_id"] in f["title"]
                   for f in doc["findings"])
        text = _invoke("report", "--store", str(store), "--fail-on", "never")
        assert f"Method: {expected}" in text


def test_evaluate_scores_each_input_combination_of_a_vllm_bank(tmp_path: Path) -> None:
    bank = tmp_path / "bank"
    _invoke("scenarios", "generate", "--family", "code_completion", "--count", "1", "--duration", "60", "--seed",
            "2", "--telemetry", "vllm-v1", "--instance-ids", "--client-tokens", "--client-jitter-ms", "0-5",
            "--client-delay-ms", "0-5", "--iteration-logs", "--no-progress", "--out", str(bank))
    result = evaluate_itl(bank)
    assert result["scenarios"] == 1 and result["request_only"]["scenarios_run"] == 0  # no token spans in vLLM's
    for key in ("tokens", "iterations", "all"):
        section = result["inputs"][key]
        assert section["scenarios_run"] == 1 and section["tp"] + section["fn"] > 0, key
    assert result["iteration_timing"]["stalls"] > 0
    baseline = result["baseline"]  # the naive overlap rule, scored the same way beside the methods
    assert baseline["scenarios_run"] == 1 and baseline["tp"] + baseline["fn"] == result["inputs"]["tokens"]["tp"] + \
        result["inputs"]["tokens"]["fn"]
    out = _invoke("evaluate", str(bank), "--section", "itl")
    for title in ("spans + client tokens", "spans + iteration log", "spans + tokens + iteration log",
                  "baseline: prefill overlaps gap"):
        assert title in out
    assert "code_completion/" in out


def test_the_dashboards_itl_page_shows_the_culprits_of_a_vllm_store_with_the_method_named(
        vllm_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_dashboard import app, frame

    store = tmp_path / "store"
    _invoke("ingest", "--store", str(store), "--no-progress", "--no-materialize", str(vllm_run / "spans.jsonl.gz"),
            str(vllm_run / "client.jsonl"))
    at = app(store, monkeypatch, "views/itl_spikes.py")
    assert any("Method: request spans + client token times" in i.value for i in at.info)
    culprits = frame(at, "confidence")
    assert len(culprits) > 0 and culprits["confidence"].between(0, 1).all()
