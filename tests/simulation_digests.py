"""Digests of what the simulator produces for fixed seeds, to pin that speed work changes nothing simulated.

- One engine: the SHA-256 of the OTLP JSON lines file itself, byte for byte.
- A fleet: the SHA-256 of its per-request results, read back from its trace: every span's name, resource
  instance, times, status and attributes (but not its trace and span ids), with each `engine_step` span
  expanded into its steps (index, start, duration, prefill chunks, decoding requests, running and waiting
  counts, preemptions, pauses). A fleet's engine may group the same steps into fewer spans when it knows that
  nothing can join its batch sooner; that regrouping (and the span ids drawn for it) is all this leaves out.

The recorded digests live in tests/simulation_digests.json. `python -m tests.simulation_digests` prints every
case's digest and whether it matches; `python -m tests.simulation_digests --record [CASE ...]` computes them (all
cases, or the ones named) and writes them there: the one command to run after a change that means to alter what
is simulated (say so in its commit message).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infertrace import semconv as sc
from reference_engine.engine.config import EngineConfig
from reference_engine.engine.cost_model import StepCostModel
from reference_engine.engine.executor import SimulatedExecutor
from reference_engine.engine.hardware import hardware
from reference_engine.engine.models import model
from reference_engine.fleet.config import parse_fleet
from reference_engine.fleet.fleet import Fleet
from reference_engine.fleet.workload import fleet_requests
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.workload import SyntheticWorkload, azure_requests, mooncake_requests, synthetic_requests

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT.parent / "shared" / "workloads"
AZURE = WORKLOADS / "azure_conv_2023.csv"
MOONCAKE = WORKLOADS / "mooncake_synthetic.jsonl"
T0 = 1_767_225_600 * 10**9


# ------------------------------------------------------------------------------------------ one engine
def _engine_digest(tmp: Path, config: EngineConfig, requests: list[Any], seed: int,
                   pauses: list[tuple[int, int]] = ()) -> str:  # type: ignore[assignment]
    path = tmp / f"{config.instance_id}-{seed}.jsonl"
    executor = None
    if pauses:
        cost = StepCostModel(model(config.model), hardware(config.hardware), tensor_parallel=config.tensor_parallel,
                             prefill_microbatch=config.prefill_microbatch, params=config.cost)
        executor = SimulatedExecutor(cost, pauses)
    simulate(config, requests, OtlpJsonLinesWriter(path), seed=seed, executor=executor)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def azure_five_minutes(tmp: Path) -> str:
    """The benchmark's engine (Llama-3-8B, H100, prefill-first, 16384-token budget) on the trace's first 300 s."""
    return _engine_digest(tmp, EngineConfig(), azure_requests(AZURE, 300), seed=0)


def synthetic_decode_first_preempting(tmp: Path) -> str:
    """Shared system prompts, assistant prefills, chunked decode-first, KV small enough to preempt."""
    workload = SyntheticWorkload(rate=6.0, prompt_mean=800.0, output_mean=300.0, system_prompt_fraction=0.7,
                                 assistant_prefill_fraction=0.2)
    config = EngineConfig(policy="decode_first", chunked_prefill=True, max_num_batched_tokens=512,
                          num_kv_blocks=1200, instance_id="decode-first")
    return _engine_digest(tmp, config, synthetic_requests(workload, 120.0, seed=3, start_ns=T0), seed=3)


def synthetic_prefill_first_rejecting(tmp: Path) -> str:
    """Unchunked prefill-first with a small budget and KV: rejections, preemptions, prefix hits."""
    workload = SyntheticWorkload(rate=5.0, prompt_mean=1500.0, prompt_sigma=1.0, output_mean=250.0,
                                 system_prompt_tokens=700, system_prompt_fraction=0.8)
    config = EngineConfig(max_num_batched_tokens=4096, num_kv_blocks=900, max_num_seqs=48,
                          instance_id="prefill-first")
    return _engine_digest(tmp, config, synthetic_requests(workload, 120.0, seed=5, start_ns=T0), seed=5)


def synthetic_tp4_microbatch_no_prefix_cache(tmp: Path) -> str:
    config = EngineConfig(model="llama-3-70b", tensor_parallel=4, prefill_microbatch=512, enable_prefix_caching=False,
                          instance_id="tp4")
    workload = SyntheticWorkload(rate=3.0, system_prompt_fraction=0.9)
    return _engine_digest(tmp, config, synthetic_requests(workload, 90.0, seed=7, start_ns=T0), seed=7)


def synthetic_host_pauses(tmp: Path) -> str:
    pauses = [(T0 + k * 3_000_000_000 + 17_000_000, 150_000_000) for k in range(30)]
    return _engine_digest(tmp, EngineConfig(instance_id="paused"),
                          synthetic_requests(SyntheticWorkload(rate=4.0), 90.0, seed=11, start_ns=T0), seed=11,
                          pauses=pauses)


def mooncake_shared_prefixes(tmp: Path) -> str:
    """Real prefix sharing (512-token hash blocks) on an engine whose KV fills up."""
    config = EngineConfig(num_kv_blocks=6000, instance_id="mooncake")
    return _engine_digest(tmp, config, mooncake_requests(MOONCAKE, 300, speedup=2.0, start_ns=T0), seed=2)


# ----------------------------------------------------------------------------------------------- fleets
def _steps(span: dict[str, Any], attrs: dict[str, Any]) -> list[tuple[Any, ...]]:
    durations = attrs[sc.STEP_DURATIONS_NS]
    decodes = tuple(attrs[sc.STEP_DECODE_REQUEST_IDS])
    prefills = tuple(zip(attrs.get(sc.STEP_PREFILL_REQUEST_IDS, []), attrs.get(sc.STEP_PREFILL_CHUNK_TOKENS, []),
                         attrs.get(sc.STEP_PREFILL_COMPUTED_TOKENS, []), attrs.get(sc.STEP_PREFILL_SAMPLES_TOKEN, []),
                         strict=True))
    out = []
    t = int(span["startTimeUnixNano"])
    for k, d in enumerate(durations):
        out.append((attrs[sc.STEP_INDEX] + k, t, d, prefills, decodes,
                    attrs[sc.STEP_DECODE_CONTEXT_TOKENS] + k * len(decodes), attrs[sc.STEP_RUNNING],
                    attrs[sc.STEP_WAITING], tuple(attrs.get(sc.STEP_PREEMPTED_REQUEST_IDS, [])) if k == 0 else (),
                    attrs.get(sc.STEP_PAUSE_NS, 0) if k == len(durations) - 1 else 0))
        t += d
    return out


def _value(v: dict[str, Any]) -> Any:
    (kind, x), = v.items()
    if kind == "intValue":
        return int(x)
    if kind == "arrayValue":
        return tuple(_value(e) for e in x.get("values", []))
    return x


def fleet_results(path: Path) -> list[tuple[Any, ...]]:
    """Every span of the trace without its ids, engine steps one record per step, in a canonical order."""
    records: list[tuple[Any, ...]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            for rs in json.loads(line)["resourceSpans"]:
                resource = {kv["key"]: _value(kv["value"]) for kv in rs["resource"]["attributes"]}
                instance = resource[sc.SERVICE_INSTANCE_ID]
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        attrs = {kv["key"]: _value(kv["value"]) for kv in s["attributes"]}
                        if s["name"] == sc.SPAN_STEP:
                            records += [("step", instance, *step) for step in _steps(s, attrs)]
                            continue
                        events = tuple((e["name"], e["timeUnixNano"], tuple(sorted(
                            (kv["key"], _value(kv["value"])) for kv in e.get("attributes", []))))
                            for e in s.get("events", []))
                        records.append(("span", instance, s["name"], s["kind"], s["startTimeUnixNano"],
                                        s["endTimeUnixNano"], tuple(sorted(attrs.items())), events,
                                        tuple(sorted(s["status"].items()))))
    records.sort(key=repr)
    return records


def _fleet_digest(tmp: Path, text: str, duration_s: float, seed: int, base: Path = ROOT) -> str:
    spec = parse_fleet(tomllib.loads(text), base)
    path = tmp / f"{spec.name}-{seed}.jsonl"
    writer = OtlpJsonLinesWriter(path)
    summary = Fleet(spec, writer, seed).run(fleet_requests(spec, duration_s, seed))
    writer.close()
    digest = hashlib.sha256(repr(fleet_results(path)).encode())
    digest.update(repr((summary.requests, sorted(summary.statuses.items()), summary.per_model,
                        summary.output_tokens, summary.start_ns, summary.end_ns)).encode())
    return digest.hexdigest()


def replica_fleet(replicas: int, policy: str, tenants: str) -> str:
    """One model on `replicas` H100s behind one router."""
    return f"""
name = "replicas-{replicas}-{policy}"
[[router]]
id = "router-0"
policy = "{policy}"
[[model]]
name = "llama-3-8b"
replicas = {replicas}
hardware = "H100-SXM"
{tenants}"""


SYNTHETIC_TENANT = """
[[tenant]]
name = "acme"
rate = 14.0
prompt_mean = 1200.0
output_mean = 220.0
system_prompt_fraction = 0.5
"""


def azure_tenants(n: int) -> str:
    """n tenants each replaying the Azure conversation trace from its own point: n times the trace's load."""
    return "".join(f"""
[[tenant]]
name = "azure-{k}"
workload = "azure"
path = "{AZURE}"
offset_s = {k * 3600 / n}
""" for k in range(n))


def round_robin_synthetic(tmp: Path) -> str:
    return _fleet_digest(tmp, replica_fleet(4, "round_robin", SYNTHETIC_TENANT), 60.0, seed=1)


def least_loaded_synthetic(tmp: Path) -> str:
    return _fleet_digest(tmp, replica_fleet(4, "least_loaded", SYNTHETIC_TENANT), 60.0, seed=2)


def round_robin_azure_4x(tmp: Path) -> str:
    """The fleet benchmark's shape: four replicas at four times the Azure conversation load."""
    return _fleet_digest(tmp, replica_fleet(4, "round_robin", azure_tenants(4)), 60.0, seed=0)


def least_loaded_azure_4x(tmp: Path) -> str:
    return _fleet_digest(tmp, replica_fleet(4, "least_loaded", azure_tenants(4)), 60.0, seed=0)


def two_models_example(tmp: Path) -> str:
    """Prefix-aware and least-loaded routers, auth, a rate limiter, a denied tenant."""
    return _fleet_digest(tmp, (ROOT / "examples" / "fleets" / "two_models.toml").read_text(), 120.0, seed=4,
                         base=ROOT / "examples" / "fleets")


def disaggregated_example(tmp: Path) -> str:
    """Prefill and decode workers over a link, a global queue."""
    return _fleet_digest(tmp, (ROOT / "examples" / "fleets" / "disaggregated.toml").read_text(), 60.0, seed=6,
                         base=ROOT / "examples" / "fleets")


ENGINE_CASES: dict[str, Callable[[Path], str]] = {f.__name__: f for f in (
    azure_five_minutes, synthetic_decode_first_preempting, synthetic_prefill_first_rejecting,
    synthetic_tp4_microbatch_no_prefix_cache, synthetic_host_pauses, mooncake_shared_prefixes)}
FLEET_CASES: dict[str, Callable[[Path], str]] = {f.__name__: f for f in (
    round_robin_synthetic, least_loaded_synthetic, round_robin_azure_4x, least_loaded_azure_4x, two_models_example,
    disaggregated_example)}
NEEDS_WORKLOADS = {"azure_five_minutes", "mooncake_shared_prefixes", "round_robin_azure_4x", "least_loaded_azure_4x"}


RECORDED_PATH = Path(__file__).with_name("simulation_digests.json")


def recorded() -> dict[str, str]:
    """The digests the tests hold the simulator to."""
    return json.loads(RECORDED_PATH.read_text())


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile
    import time

    cases = {**ENGINE_CASES, **FLEET_CASES}
    parser = argparse.ArgumentParser(prog="python -m tests.simulation_digests", description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help=f"write the digests to {RECORDED_PATH.name}")
    parser.add_argument("cases", nargs="*", metavar="CASE", help="only these cases (default: all): " + ", ".join(cases))
    args = parser.parse_args(argv)
    if unknown := [name for name in args.cases if name not in cases]:
        parser.error(f"no such case: {', '.join(unknown)}")
    if any(name in NEEDS_WORKLOADS for name in args.cases or cases) and not (AZURE.is_file() and MOONCAKE.is_file()):
        parser.error(f"{WORKLOADS} is not beside this clone: the Azure and Mooncake cases cannot run")
    digests, changed = recorded(), 0
    with tempfile.TemporaryDirectory() as d:
        for name in args.cases or cases:
            start = time.perf_counter()
            digest = cases[name](Path(d))
            same = digest == digests.get(name)
            changed += not same
            print(f"{name}: {digest} {'same' if same else 'CHANGED'} ({time.perf_counter() - start:.1f} s)", flush=True)
            digests[name] = digest
    if args.record:
        RECORDED_PATH.write_text(json.dumps(digests, indent=1) + "\n")
        print(f"{changed} changed digest(s) written to {RECORDED_PATH}")
    return 1 if changed and not args.record else 0


if __name__ == "__main__":
    raise SystemExit(main())
