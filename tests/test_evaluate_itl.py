"""The ITL evaluation against a scenario whose ground truth the engine itself recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertrace.cli import app
from infertrace.evaluation.itl import evaluate_itl
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.cost_model import StepCostModel
from reference_engine.engine.executor import SimulatedExecutor
from reference_engine.engine.hardware import hardware
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.engine.models import model
from reference_engine.engine.prompt import Prompt
from reference_engine.engine.sequence import Request
from reference_engine.scenarios.ground_truth import StallRecorder, itl_truth
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.tracer import EngineTracer, engine_resource

T0 = 1_767_225_600 * 10**9


def _scenario(root: Path, name: str, config: EngineConfig, requests: list[Request], family: str,
              negative: list[str], pauses: list[tuple[int, int]] = ()) -> None:  # type: ignore[assignment]
    out = root / name
    out.mkdir(parents=True)
    writer = OtlpJsonLinesWriter(out / "traces.jsonl.gz")
    tracer = EngineTracer(writer, engine_resource(config), seed=3)
    cost = StepCostModel(model(config.model), hardware(config.hardware))
    engine = LLMEngine(config, SimulatedExecutor(cost, pauses))
    recorder = StallRecorder(config.instance_id, engine)
    engine.observers = [recorder, tracer]
    engine.run(requests)
    tracer.close()
    writer.close()
    truth = {"scenario": name, "family": family, "traces": "traces.jsonl.gz", "negative_control": negative,
             "root_cause": {"instances": [config.instance_id]}, "itl": itl_truth([recorder])}
    (out / "ground_truth.json").write_text(json.dumps(truth))


def _requests(prefix: str, n: int, prompt: int, gap_ns: int) -> list[Request]:
    return [Request(f"{prefix}-{i}", T0 + i * gap_ns, Prompt(((f"{prefix}-{i}", prompt),)), 120, 512)
            for i in range(n)]


@pytest.mark.slow
def test_evaluate_scores_a_collision_scenario_and_a_host_pause_control(tmp_path: Path) -> None:
    _scenario(tmp_path, "a-storm", EngineConfig(instance_id="storm-0"), _requests("s", 40, 3000, 150_000_000),
              "prefill_storm", [])
    stall_free = EngineConfig(instance_id="pause-0", policy="decode_first", chunked_prefill=True,
                              max_num_batched_tokens=256)
    _scenario(tmp_path, "b-pauses", stall_free, _requests("p", 20, 200, 100_000_000), "host_pauses", ["itl"],
              pauses=[(T0 + 10**9, 200_000_000), (T0 + 2 * 10**9, 120_000_000)])
    result = evaluate_itl(tmp_path)
    assert result["tp"] > 20 and (result["precision"], result["recall"]) == (1.0, 1.0)
    assert result["false_attribution_rate"] == 0.0 and result["negative_control_spikes"] == 2
    assert result["negative_control_labels"]["host_pause"] == {"stalls": 2, "labelled": 2, "accuracy": 1.0}
    assert result["per_policy"]["prefill_first"]["tp"] == result["tp"]
    assert result["request_only"]["precision"] >= 0.9

    out = CliRunner().invoke(app, ["evaluate", str(tmp_path), "--format", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["itl"]["tp"] == result["tp"]
    missing = CliRunner().invoke(app, ["evaluate", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2
