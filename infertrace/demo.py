"""`infertrace demo`: a canonical multi-model incident, end to end.

Three models behind one gateway (shared auth and rate limiter; router-0 in front of llama-3-8b and
qwen-2.5-1.5b, router-1 in front of mixtral-8x7b). Five minutes of traffic; partway through, router-0 starts
adding latency (and may answer 503), so two models degrade together while mixtral stays normal. Meanwhile
llama-3-8b runs prefill-first without chunking, and a tenant sending long prompts stalls its decodes: ITL
spikes with named culprit prefills. The demo simulates it with the reference engine, writes the traces
(OTLP JSON lines) and the ground truth, ingests them into a store, and prints the report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEMO_FLEET = """
name = "demo"
region = "us-east-1"

[[auth]]
id = "auth-0"
latency_ms = 2.0

[[rate_limiter]]
id = "ratelimit-0"
latency_ms = 0.5
requests_per_s = 60.0
burst = 120.0

[[router]]
id = "router-0"
policy = "least_loaded"
models = ["llama-3-8b", "qwen-2.5-1.5b"]

[[router]]
id = "router-1"
policy = "prefix_aware"
models = ["mixtral-8x7b"]

[[model]]
name = "llama-3-8b"
hardware = "H100-SXM"
[model.engine]
policy = "prefill_first"
chunked_prefill = false

[[model]]
name = "qwen-2.5-1.5b"
hardware = "H100-SXM"
[model.engine]
policy = "decode_first"
chunked_prefill = true
max_num_batched_tokens = 512

[[model]]
name = "mixtral-8x7b"
hardware = "H100-SXM"
engine = { tensor_parallel = 2 }

[[tenant]]
name = "acme"
models = { "llama-3-8b" = 2, "qwen-2.5-1.5b" = 1, "mixtral-8x7b" = 1 }
rate = 3.0
prompt_mean = 1024.0
output_mean = 200.0
system_prompt_tokens = 1024
system_prompt_fraction = 0.7

[[tenant]]
name = "globex"
models = { "llama-3-8b" = 1, "mixtral-8x7b" = 1 }
rate = 1.0
prompt_mean = 4096.0
output_mean = 150.0

[[tenant]]
name = "initech"
models = ["qwen-2.5-1.5b", "mixtral-8x7b"]
rate = 1.5
prompt_mean = 768.0
output_mean = 250.0
system_prompt_tokens = 2048
system_prompt_fraction = 0.9
"""

DEMO_SEED = 7
DEMO_DURATION_S = 300.0


@dataclass(frozen=True)
class DemoRun:
    store: Path
    scenario_dir: Path
    truth: dict[str, Any]


def demo_scenario(seed: int = DEMO_SEED, duration_s: float = DEMO_DURATION_S) -> Any:
    from reference_engine.api import scenario_on_fleet

    return scenario_on_fleet(DEMO_FLEET, "router_degradation", seed, "demo-router-degradation", duration_s)


def run_demo(out: Path, seed: int = DEMO_SEED, duration_s: float = DEMO_DURATION_S) -> DemoRun:
    """Simulate the demo incident into `out/scenario/` (traces, fleet file, ground truth) and ingest the
    traces into the store `out/`. An existing store at `out` is reused: re-ingesting adds nothing."""
    from infertrace.store.ingest import ingest_paths
    from reference_engine.api import TRACES_FILE, TRUTH_FILE, run_scenario

    scenario_dir = out / "scenario"
    truth_path = scenario_dir / TRUTH_FILE
    if not (truth_path.exists() and (scenario_dir / TRACES_FILE).exists()):
        run_scenario(demo_scenario(seed, duration_s), scenario_dir)
    truth = json.loads(truth_path.read_text(encoding="utf-8"))
    ingest_paths(out, [scenario_dir / TRACES_FILE])
    return DemoRun(out, scenario_dir, truth)


def injected(truth: dict[str, Any]) -> str:
    """One paragraph on what the demo injected (from the ground truth), to compare with the report."""
    fault = truth["fault"]
    window = truth["window"]
    seconds = (window["end_ns"] - window["start_ns"]) / 1e9
    start = (window["start_ns"] - truth["start_ns"]) / 1e9
    params = ", ".join(f"{k}={v}" for k, v in fault["params"].items())
    return (f"Injected: {fault['kind']} on {fault['target']} ({params}) from {start:.0f} s for {seconds:.0f} s; "
            f"it serves {', '.join(truth['root_cause']['models'])}. {truth['summary']['requests']} requests, "
            f"{truth['summary']['spans']} spans.")
