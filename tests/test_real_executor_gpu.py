"""The torch backend on CUDA computes what numpy computes on the CPU (run by benchmarks/gpu_check.sh)."""

from __future__ import annotations

import numpy as np
import pytest

from reference_engine.compute.real_executor import RealExecutor
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.engine.models import model
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request

pytestmark = pytest.mark.gpu
SPEC = model("tiny")


def serve(backend: str, device: str, dtype: str) -> RealExecutor:
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    requests = [Request(f"r{i}", 0, Prompt((("shared", 40), (f"p{i}", 9 + 37 * i))), 12, 12) for i in range(4)]
    requests.append(Request("late", 10**12, Prompt((("shared", 40), ("late", 30))), 6, 6))
    cfg = EngineConfig(model="tiny", hardware="CPU-host", num_kv_blocks=128, policy="decode_first",
                       chunked_prefill=True, max_num_batched_tokens=48, max_num_seqs=8)
    executor = RealExecutor(SPEC, 128, 16, backend=backend, device=device, dtype=dtype, seed=3, keep_logits=True)
    LLMEngine(cfg, executor).run(requests)
    return executor


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-9), ("float32", 2e-3)])
def test_torch_on_cuda_agrees_with_numpy_on_the_cpu(dtype: str, tol: float) -> None:
    cuda, cpu = serve("torch", "cuda", dtype), serve("numpy", "cpu", dtype)
    assert cuda.outputs == cpu.outputs
    for rid, rows in cpu.logits.items():
        np.testing.assert_allclose(np.stack(cuda.logits[rid]), np.stack(rows), rtol=0, atol=tol)


def test_cached_decode_on_cuda_equals_recompute_without_cache() -> None:
    executor = serve("torch", "cuda", "float32")
    for rid, outputs in executor.outputs.items():
        prompt = (Prompt((("shared", 40), ("late", 30))) if rid == "late"
                  else Prompt((("shared", 40), (rid.replace("r", "p"), 9 + 37 * int(rid[1:])))))
        tokens = np.concatenate([prompt.token_ids(SPEC.vocab_size), outputs])
        reference = executor.model.reference_logits(tokens)[prompt.num_tokens - 1:-1]
        np.testing.assert_allclose(np.stack(executor.logits[rid]), reference, rtol=0, atol=2e-3)
