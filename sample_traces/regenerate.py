"""Regenerates every canonical incident in sample_traces/ deterministically (fixed seeds): traces, ground
truth, fleet file and README per incident. Run from anywhere:

    python sample_traces/regenerate.py            # all incidents, in place
    python sample_traces/regenerate.py --out DIR  # somewhere else (the byte-for-byte test does this)
    python sample_traces/regenerate.py --only prefill_storm
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from reference_engine.fleet.config import FleetSpec, fleet_to_toml, parse_fleet  # noqa: E402
from reference_engine.scenarios.bank import run_scenario  # noqa: E402
from reference_engine.scenarios.families import make_scenario  # noqa: E402

GATEWAY = """
[[auth]]
id = "auth-0"

[[rate_limiter]]
id = "ratelimit-0"
requests_per_s = 8.0
burst = 16.0
"""

THREE_MODELS = GATEWAY + """
[[router]]
id = "router-0"
models = ["llama-3-8b", "qwen-2.5-1.5b"]

[[router]]
id = "router-1"
models = ["mixtral-8x7b"]

[[model]]
name = "llama-3-8b"

[[model]]
name = "qwen-2.5-1.5b"

[[model]]
name = "mixtral-8x7b"
engine = { tensor_parallel = 2 }

[[tenant]]
name = "tenant-a"
rate = 1.5
prompt_mean = 800.0
output_mean = 150.0
system_prompt_fraction = 0.8

[[tenant]]
name = "tenant-b"
rate = 1.5
prompt_mean = 800.0
output_mean = 150.0
system_prompt_fraction = 0.8
"""

AZURE = GATEWAY + """
[[router]]
id = "router-0"
models = ["llama-3-8b"]

[[router]]
id = "router-1"
models = ["qwen-2.5-1.5b"]

[[model]]
name = "llama-3-8b"

[[model]]
name = "qwen-2.5-1.5b"

[[tenant]]
name = "azure-conv"
models = ["llama-3-8b"]
workload = "azure"
path = "../shared/workloads/azure_conv_2023.csv"

[[tenant]]
name = "tenant-a"
models = ["qwen-2.5-1.5b"]
rate = 2.0
prompt_mean = 800.0
output_mean = 150.0
"""

DISAGGREGATED = GATEWAY + """
[[router]]
id = "router-0"

[[model]]
name = "llama-3-8b"

[[tenant]]
name = "tenant-a"
rate = 2.5
prompt_mean = 2000.0
output_mean = 150.0
"""

AZURE_CITATION = ("The llama-3-8b traffic replays the first minutes of the Azure LLM inference trace (conversation "
                  "service, 2023), from Azure/AzurePublicDataset @ b469a113, `data/AzureLLMInferenceTrace_conv.csv` "
                  "(the Splitwise ISCA'24 trace), licensed CC-BY-4.0: arrival times and token counts only.")


@dataclass(frozen=True)
class Sample:
    name: str
    family: str
    seed: int
    duration_s: float
    fleet: str
    story: str
    look_for: str
    citation: str = ""


SAMPLES = (
    Sample("prefill_storm", "prefill_storm", 3, 180.0, THREE_MODELS,
           "A tenant starts sending 6k–12k-token prompts to a prefill-first model.",
           "engine_step spans on the storm's engine whose `infertrace.step.prefill.request_ids` hold a surge request "
           "take tens of ms; every request decoding there waits for them (ITL spikes). The ground truth lists each "
           "stalled step with its culprits and victims."),
    Sample("rate_limiter_flapping", "rate_limiter_flapping", 1, 180.0, THREE_MODELS,
           "The shared rate limiter flaps between its configured limit and a small fraction of it.",
           "rate_limit spans answer 429 for all three models at once, only inside the window; the engines' step "
           "times stay as they were."),
    Sample("engine_regression", "engine_regression", 2, 180.0, THREE_MODELS,
           "One model's engines become slower at every step (a kernel or driver regression).",
           "Only that model's engine_step durations (for the same batch sizes) and TTFT/E2E move: a single-model "
           "negative control for shared-component root-cause analysis."),
    Sample("router_degradation_azure", "router_degradation", 7, 180.0, AZURE,
           "A router adds over a second to every request it routes (and fails some with 503), under replayed "
           "production arrivals.",
           "route spans of the faulty router (and the TTFT of the model behind it) jump inside the window; the "
           "other router's route spans do not.", AZURE_CITATION),
    Sample("kv_transfer_congestion", "kv_transfer_congestion", 3, 150.0, DISAGGREGATED,
           "The link that carries KV caches from the prefill workers to the decode workers loses bandwidth.",
           "kv_transfer spans (bytes = 2 · layers · kv_heads · head_dim · dtype_bytes per prompt token) take far "
           "longer inside the window, and TTFT with them; the decode workers' ITL stays flat."),
    Sample("cache_busting", "cache_busting", 4, 180.0, THREE_MODELS,
           "A tenant starts putting a fresh timestamp before its system prompt.",
           "`gen_ai.usage.cache_read.input_tokens` of that tenant's requests falls to 0 inside the window, though "
           "their `infertrace.request.system_prompt.id` is unchanged; other tenants keep their hit rate."),
    Sample("host_pauses", "host_pauses", 7, 150.0, THREE_MODELS,
           "One engine's host stops now and then (garbage collection, swapping).",
           "engine_step spans with `infertrace.step.pause_ns` hold the ITL spikes of that engine: an ITL negative "
           "control, its spikes are not caused by prefills (its chunks are small)."),
)


def _fleet(sample: Sample) -> FleetSpec:
    return parse_fleet(tomllib.loads(f'name = "{sample.name}"\n' + sample.fleet), ROOT)


def _readme(sample: Sample, truth: dict) -> str:  # type: ignore[type-arg]
    start, end = truth["start_ns"], truth["end_ns"]
    window = truth["window"]
    when = (f"{(window['start_ns'] - start) / 1e9:.1f} s to {(window['end_ns'] - start) / 1e9:.1f} s after the start"
            if window else "the whole run")
    fault = truth["fault"]
    fault_text = (f"`{fault['kind']}` on `{fault['target']}` with {json.dumps(fault['params'])}" if fault
                  else "an engine configuration (see details in ground_truth.json)")
    root = truth["root_cause"]
    cause = ", ".join(f"`{i}`" for i in root.get("instances", [])) or f"tenant `{root.get('tenant')}`"
    lines = [
        f"# {sample.name}", "",
        sample.story, "",
        f"- family: `{truth['family']}`; tasks: {', '.join(truth['tasks'])}"
        + (f"; negative control for: {', '.join(truth['negative_control'])}" if truth["negative_control"] else ""),
        f"- fault: {fault_text}, {when}",
        f"- root cause: {root['kind']} {cause}; affected models: {', '.join(truth['affected']['models'])}; "
        f"tenants: {', '.join(truth['affected']['tenants'])}",
        f"- {truth['summary']['requests']} requests over {(end - start) / 1e9:.0f} simulated s, "
        f"{truth['summary']['spans']} spans; outcomes {json.dumps(truth['summary']['statuses'])}",
        "", f"What to look for: {sample.look_for}", "",
        "Files: `traces.jsonl.gz` (OTLP JSON lines, as the OpenTelemetry Collector's file exporter writes them), "
        "`ground_truth.json` (kept apart from the traces; schema in docs/fleet.md), `fleet.toml` (the fleet and "
        "its fault: `infertrace simulate --fleet fleet.toml` reruns it without the ground truth).", "",
        f"Regenerate: `python sample_traces/regenerate.py --only {sample.name}` (seed {sample.seed}).",
    ]
    if sample.citation:
        lines += ["", f"Source: {sample.citation}"]
    return "\n".join(lines) + "\n"


def regenerate(out: Path, only: set[str] | None = None) -> list[str]:
    written = []
    for sample in SAMPLES:
        if only and sample.name not in only:
            continue
        scenario = make_scenario(sample.family, sample.seed, sample.name, sample.duration_s, _fleet(sample))
        truth = run_scenario(scenario, out / sample.name)
        # Workload paths relative to the incident's home in sample_traces/, wherever this run wrote it.
        (out / sample.name / "fleet.toml").write_text(fleet_to_toml(scenario.fleet, HERE / sample.name),
                                                      encoding="utf-8")
        (out / sample.name / "README.md").write_text(_readme(sample, truth), encoding="utf-8")
        written.append(sample.name)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write the incidents into")
    parser.add_argument("--only", action="append", help="only this incident (repeatable)")
    args = parser.parse_args()
    names = {s.name for s in SAMPLES}
    unknown = set(args.only or ()) - names
    if unknown:
        parser.error(f"unknown incident(s) {sorted(unknown)}; known: {', '.join(sorted(names))}")
    for name in regenerate(args.out, set(args.only) if args.only else None):
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
