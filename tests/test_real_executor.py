"""The real executor computes what a transformer without any cache computes, whatever the engine does to the
batch: cached decode, chunked prefill, prefix-cache hits, preemption and recompute, batched decodes of
different lengths, and the numpy and torch backends.

Tolerances: in float64 every logit matches the dense recompute to 1e-9 (observed ≈ 1e-14: only the order of
floating-point sums differs); in float32 to 1e-3 absolute on logits of magnitude ≈ 1-5 (observed ≈ 1e-5).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from infertrace.cli import app
from reference_engine.compute.kv_cache import PagedKVCache
from reference_engine.compute.ops import NumpyOps
from reference_engine.compute.real_executor import RealExecutor
from reference_engine.compute.transformer import Transformer, sample
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.engine.models import model
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request, Sequence

SPEC = model("tiny")
TOL = {"float64": 1e-9, "float32": 1e-3}
_MODELS: dict[tuple[str, str], Transformer] = {}


def shared_model(dtype: str = "float64", backend: str = "numpy") -> Transformer:
    key = (dtype, backend)
    if key not in _MODELS:
        _MODELS[key] = Transformer(SPEC, seed=7, backend=backend, dtype=dtype)
    return _MODELS[key]


def serve(requests: list[Request], *, dtype: str = "float64", backend: str = "numpy", num_kv_blocks: int = 256,
          **config: object) -> tuple[RealExecutor, list[Sequence]]:
    cfg = EngineConfig(model="tiny", hardware="CPU-host", num_kv_blocks=num_kv_blocks, **config)  # type: ignore[arg-type]
    executor = RealExecutor(SPEC, num_kv_blocks, cfg.block_size, model=shared_model(dtype, backend),
                            keep_logits=True, record_steps=True)
    if backend != "torch":
        return executor, LLMEngine(cfg, executor).run(requests)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a second thread only waits on a shared CPU
    try:
        return executor, LLMEngine(cfg, executor).run(requests)
    finally:
        torch.set_num_threads(threads)


def request(rid: str, segments: tuple[tuple[str, int], ...], output: int, arrival_ns: int = 0) -> Request:
    return Request(rid, arrival_ns, Prompt(segments), output, output)


def assert_matches_recompute(executor: RealExecutor, req: Request, tol: float) -> None:
    """Every sampled position's logits equal a dense recompute of the whole sequence, and greedy tokens are
    their argmax."""
    outputs = executor.outputs[req.request_id]
    assert len(outputs) == req.output_tokens
    tokens = np.concatenate([req.prompt.token_ids(SPEC.vocab_size), outputs])
    reference = executor.model.reference_logits(tokens)
    prompt = req.prompt.num_tokens
    got = np.stack(executor.logits[req.request_id])
    np.testing.assert_allclose(got, reference[prompt - 1:prompt - 1 + len(outputs)], rtol=0, atol=tol)
    assert outputs == reference[prompt - 1:prompt - 1 + len(outputs)].argmax(-1).tolist()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_batched_cached_decode_of_different_lengths_equals_recompute_without_cache(dtype: str) -> None:
    requests = [request(f"r{i}", ((f"p{i}", 5 + 23 * i),), 9 + i) for i in range(4)]
    executor, ended = serve(requests, dtype=dtype)
    assert len(ended) == 4
    assert max(s.num_decodes for s in executor.measured) == 4  # the four decoded in one batch
    for req in requests:
        assert_matches_recompute(executor, req, TOL[dtype])


def test_chunked_prefill_equals_one_shot_prefill() -> None:
    requests = [request("long", (("long", 150),), 6), request("short", (("short", 20),), 12)]
    one_shot, _ = serve(requests)
    chunked, ended = serve(requests, policy="decode_first", chunked_prefill=True, max_num_batched_tokens=32,
                           max_num_seqs=4)
    assert max(s.num_prefill_chunks for s in ended) >= 5
    assert any(s.chunks and s.num_decodes for s in chunked.measured)  # chunks shared steps with decodes
    for req in requests:
        assert chunked.outputs[req.request_id] == one_shot.outputs[req.request_id]
        np.testing.assert_allclose(np.stack(chunked.logits[req.request_id]),
                                   np.stack(one_shot.logits[req.request_id]), rtol=0, atol=TOL["float64"])
        assert_matches_recompute(chunked, req, TOL["float64"])


def test_prefix_cache_hit_reuses_cached_kv_and_equals_a_miss() -> None:
    first = request("first", (("system", 64), ("user-1", 9)), 4)
    second = request("second", (("system", 64), ("user-2", 21)), 7, arrival_ns=10**12)  # after the first ended
    hit, ended = serve([first, second])
    miss, _ = serve([first, second], enable_prefix_caching=False)
    second_seq = next(s for s in ended if s.request_id == "second")
    assert second_seq.num_cached_tokens == 64
    prefill_chunks = [s.chunks for s in hit.measured if s.chunks]
    assert prefill_chunks[-1] == ((21, 64),)  # only the 21 new tokens were computed, over 64 cached
    assert [s.chunks for s in miss.measured if s.chunks][-1] == ((85, 0),)
    assert hit.outputs["second"] == miss.outputs["second"]
    np.testing.assert_allclose(np.stack(hit.logits["second"]), np.stack(miss.logits["second"]), rtol=0,
                               atol=TOL["float64"])
    assert_matches_recompute(hit, second, TOL["float64"])


@pytest.mark.slow
def test_preemption_frees_blocks_and_recompute_restores_the_same_tokens() -> None:
    requests = [request(f"r{i}", ((f"p{i}", 30),), 40) for i in range(4)]
    roomy, _ = serve(requests, num_kv_blocks=64)
    tight, ended = serve(requests, num_kv_blocks=11)  # 4 × 70 tokens need 20 blocks of 16
    assert sum(s.preemptions for s in ended) > 0
    recomputed = [step for step in tight.measured for n, c in step.chunks if n + c > 30]
    assert recomputed, "a preempted sequence recomputes its prompt and generated tokens"
    for req in requests:
        assert tight.outputs[req.request_id] == roomy.outputs[req.request_id]
        assert_matches_recompute(tight, req, TOL["float64"])


def test_numpy_and_torch_cpu_backends_agree() -> None:
    pytest.importorskip("torch")
    requests = [request(f"r{i}", (("shared", 40), (f"p{i}", 7 + 31 * i)), 10) for i in range(3)]
    requests.append(request("late", (("shared", 40), ("late", 50)), 8, arrival_ns=10**12))
    kwargs = {"policy": "decode_first", "chunked_prefill": True, "max_num_batched_tokens": 48, "max_num_seqs": 8}
    with_numpy, _ = serve(requests, dtype="float32", **kwargs)  # type: ignore[arg-type]
    with_torch, _ = serve(requests, dtype="float32", backend="torch", **kwargs)  # type: ignore[arg-type]
    for req in requests:
        assert with_torch.outputs[req.request_id] == with_numpy.outputs[req.request_id]
        np.testing.assert_allclose(np.stack(with_torch.logits[req.request_id]),
                                   np.stack(with_numpy.logits[req.request_id]), rtol=0, atol=TOL["float32"])
    assert [s.chunks for s in with_torch.measured] == [s.chunks for s in with_numpy.measured]


def test_torch_backend_matches_recompute_in_float64() -> None:
    pytest.importorskip("torch")
    requests = [request(f"r{i}", ((f"p{i}", 12 + 40 * i),), 6) for i in range(3)]
    executor, _ = serve(requests, backend="torch")
    for req in requests:
        assert_matches_recompute(executor, req, TOL["float64"])


def test_a_decode_run_stops_after_the_first_step_ending_at_the_deadline() -> None:
    cfg = EngineConfig(model="tiny", hardware="CPU-host", num_kv_blocks=64)
    executor = RealExecutor(SPEC, 64, 16, model=shared_model())
    engine = LLMEngine(cfg, executor)
    engine.add_request(request("r", (("p", 10),), 30))
    engine.step()  # the prefill
    batch = engine.scheduler.schedule()
    assert batch.max_steps == 29 and not batch.prefills
    durations = executor.execute(batch, engine.now_ns, engine.now_ns + 1)
    assert len(durations) == 1 and durations[0] > 0
    engine.scheduler.postprocess(batch, 1, engine.now_ns + int(durations[0]))
    batch = engine.scheduler.schedule()
    assert batch.max_steps == 28
    durations = executor.execute(batch, engine.now_ns, None)
    assert len(durations) == 28 and (durations > 0).all()
    engine.scheduler.postprocess(batch, 28, engine.now_ns + int(durations.sum()))
    tokens = np.concatenate([Prompt((("p", 10),)).token_ids(SPEC.vocab_size), executor.outputs["r"]])
    assert executor.outputs["r"] == shared_model().reference_logits(tokens)[9:-1].argmax(-1).tolist()


def test_an_engine_run_with_later_arrivals_serves_every_token() -> None:
    requests = [request(f"r{i}", ((f"p{i}", 20 + i),), 15, arrival_ns=i * 3_000_000) for i in range(5)]
    executor, ended = serve(requests)
    assert sorted(s.request_id for s in ended) == [r.request_id for r in requests]
    for req in requests:
        assert_matches_recompute(executor, req, TOL["float64"])


def test_kv_slots_follow_the_block_table() -> None:
    kv = PagedKVCache(NumpyOps(), 1, 8, 4, 1, 2)
    assert kv.slots([5, 2], 2, 7).tolist() == [22, 23, 8, 9, 10]
    with pytest.raises(IndexError):
        kv.slots([5, 2], 0, 9)


def test_temperature_sampling_follows_the_softmax_and_zero_is_greedy() -> None:
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[1.0, 3.0, 1e-9]] * 4000))
    tokens = sample(logits, 1.0, rng)
    assert abs((tokens == 1).mean() - 0.75) < 0.03 and not (tokens == 2).any()
    assert sample(logits[:3], 0.0, rng).tolist() == [1, 1, 1]


def test_sampling_with_temperature_is_reproducible_from_the_seed() -> None:
    requests = [request("r", (("p", 16),), 20)]

    def run(seed: int) -> list[int]:
        cfg = EngineConfig(model="tiny", hardware="CPU-host", num_kv_blocks=16)
        executor = RealExecutor(SPEC, 16, 16, model=shared_model(), seed=seed, temperature=1.0)
        LLMEngine(cfg, executor).run(requests)
        return executor.outputs["r"]

    greedy, _ = serve(requests)
    assert run(1) == run(1) != greedy.outputs["r"]


def test_simulate_with_the_real_executor_writes_the_same_spans(tmp_path: Path) -> None:
    trace = tmp_path / "real.jsonl"
    result = CliRunner().invoke(app, [
        "simulate", "--executor", "real", "--threads", "1", "--duration", "1", "--rate", "4", "--prompt-mean", "40",
        "--output-mean", "6", "--system-prompt-tokens", "32", "--max-num-seqs", "8", "--seed", "1",
        "--out", str(trace), "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    resource = {a["key"]: a["value"] for a in lines[0]["resourceSpans"][0]["resource"]["attributes"]}
    assert resource["infertrace.engine.executor"] == {"stringValue": "real"}
    assert resource["infertrace.engine.model"] == {"stringValue": "tiny"}
    names = {s["name"] for line in lines for rs in line["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]}
    assert {"engine_step", "llm_request"} <= names


def test_simulate_rejects_an_unknown_executor() -> None:
    result = CliRunner().invoke(app, ["simulate", "--executor", "gpu", "--duration", "1", "--out", "unused.jsonl"])
    assert result.exit_code == 2 and "sim or real" in result.output
