"""`infertrace scenarios generate` and `infertrace evaluate`: a bank of incidents with ground truth, and the
analyzers' scores on it."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from infertrace.cli.console import check_choice, err, fail

scenarios_app = typer.Typer(no_args_is_help=True, help="Incident scenarios: traces plus ground truth.")


@scenarios_app.command("generate")
def scenarios_generate(
    out: Annotated[Path, typer.Option(help="Directory to write one sub-directory per scenario into")],
    seed: Annotated[int, typer.Option(help="Seed of the whole bank")] = 0,
    count: Annotated[int, typer.Option(help="Scenarios to generate (cycling through the families)")] = 50,
    duration: Annotated[float, typer.Option(help="Simulated seconds of traffic per scenario")] = 600.0,
    family: Annotated[list[str] | None, typer.Option(
        help="Only these families (repeatable); default: the twelve of the default bank, not the root-cause "
             "families on large fleets (slow_ramp, partial_failure, backpressure, retry_storm, engine_noise, "
             "overlapping, load), which run only when named")] = None,
    jobs: Annotated[int, typer.Option(help="Scenarios simulated in parallel (processes)")] = 1,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    telemetry: Annotated[str, typer.Option(
        help="Whose spans the engines emit: infertrace, vllm-v1, vllm-v0, sglang or tgi")] = "infertrace",
    gateway_telemetry: Annotated[str, typer.Option(
        help="Whose spans the gateway emits: infertrace, litellm or none")] = "infertrace",
    instance_ids: Annotated[bool, typer.Option(
        help="Emulated engines: the deployment sets service.instance.id (OTEL_RESOURCE_ATTRIBUTES)")] = False,
    client_tokens: Annotated[bool, typer.Option(
        help="Also write a streaming client's token times per scenario (client_tokens.jsonl)")] = False,
    client_delay_ms: Annotated[str, typer.Option(
        help="Client token times: network delay, ms, or a range A-B drawn per scenario")] = "2",
    client_jitter_ms: Annotated[str, typer.Option(
        help="Client token times: jitter per token up to this, ms, or a range A-B drawn per scenario")] = "1",
    iteration_logs: Annotated[bool, typer.Option(
        help="With --telemetry vllm-v1: also write vLLM's iteration logs per scenario (iteration_logs/)")] = False,
) -> None:
    """Draw random topologies, fault families, onsets, durations and magnitudes; write each scenario's traces
    (traces.jsonl.gz), fleet file and ground truth (ground_truth.json), and an index.json.

    Example:
      infertrace scenarios generate --seed 0 --count 20 --jobs 2 --out bank/
      infertrace scenarios generate --family code_completion --family conversation --telemetry vllm-v1 \
        --instance-ids --client-tokens --client-jitter-ms 0-5 --client-delay-ms 0-5 --iteration-logs --out itl-bank/
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from reference_engine.api import ALL_FAMILIES, FAMILIES, SideFiles, TelemetrySpec, bank, generate

    try:
        spec = TelemetrySpec(telemetry, gateway_telemetry, instance_ids,
                             iteration_logs=Path("iteration_logs") if iteration_logs else None)
        side = SideFiles(client_tokens, _ms_range("--client-delay-ms", client_delay_ms),
                         _ms_range("--client-jitter-ms", client_jitter_ms), iteration_logs)
    except ValueError as e:
        raise fail(str(e)) from None
    if count < 1:
        raise fail(f"--count must be ≥ 1, got {count}")
    if duration < 60:
        raise fail(f"--duration must be ≥ 60 simulated seconds (a baseline, then a fault), got {duration}")
    if jobs < 1:
        raise fail(f"--jobs must be ≥ 1, got {jobs}")
    unknown = sorted(set(family or ()) - set(ALL_FAMILIES))
    if unknown:
        raise fail(f"--family: unknown {unknown}; known: {', '.join(ALL_FAMILIES)}")
    if out.exists() and not out.is_dir():
        raise fail(f"--out {out} exists and is not a directory")
    scenarios = bank(seed, count, duration, tuple(family or FAMILIES))
    columns = (TextColumn("scenarios"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=err, transient=True, disable=not progress) as bar:
            task = bar.add_task("scenarios", total=len(scenarios))
            truths = generate(scenarios, out, jobs, lambda: bar.advance(task),
                              None if spec.is_native else replace(spec, iteration_logs=None), side)
    except OSError as e:
        raise fail(f"--out {out}: {e}") from None
    families = {t["family"] for t in truths}
    err.print(f"{len(truths)} scenarios ({len(families)} families) written to {out}; index in {out / 'index.json'}")


def _ms_range(option: str, text: str) -> tuple[float, float]:
    """'2' → (2, 2); '0-5' → (0, 5)."""
    try:
        lo, _, hi = text.partition("-")
        low, high = float(lo), float(hi or lo)
    except ValueError:
        raise ValueError(f"{option} must be milliseconds or a range A-B, got {text!r}") from None
    if not 0 <= low <= high:
        raise ValueError(f"{option} must be 0 ≤ A ≤ B, got {text!r}")
    return low, high


@scenarios_app.command("whatif")
def scenarios_whatif(
    out: Annotated[Path, typer.Option(help="Directory to write one sub-directory per scenario into")],
    seed: Annotated[int, typer.Option(help="Seed of the whole bank")] = 0,
    count: Annotated[int, typer.Option(help="Scenarios to generate (cycling through the knobs)")] = 24,
    duration: Annotated[float, typer.Option(help="Simulated seconds of traffic per scenario")] = 180.0,
    jobs: Annotated[int, typer.Option(help="Scenarios simulated in parallel (processes)")] = 1,
    hidden_cost: Annotated[bool, typer.Option(
        help="The engines run with cost parameters of their own that the spans do not carry: replays must "
             "calibrate on the capture's steps")] = False,
    telemetry: Annotated[str, typer.Option(
        help="Whose telemetry the captures export: infertrace (step spans) or a real engine's, e.g. vllm-v1 (request "
             "spans only; replays calibrate on request timings)")] = "infertrace",
    iteration_logs: Annotated[bool, typer.Option(
        help="With --telemetry vllm-v1: also write vLLM's iteration log per engine of the capture "
             "(capture/iteration_logs/, each named after its engine's service.instance.id), which replays "
             "calibrate on")] = False,
) -> None:
    """What-if validation scenarios: one model's traffic (with a prefill storm) served under config A
    (capture/) and, on the same requests, under config B, A with one knob changed (actual/): chunk budget,
    policy, TP, prefill micro-batch, replicas, P/D split, max_num_seqs, prefix caching. Score replays of A's
    capture under B with `infertrace evaluate DIR --section whatif`.

    Example:
      infertrace scenarios whatif --seed 0 --count 24 --duration 180 --jobs 2 --out whatif-bank/
      infertrace scenarios whatif --seed 2 --count 24 --hidden-cost --telemetry vllm-v1 --out vllm-bank/
    """
    from reference_engine.api import WHATIF_KNOBS, generate_whatif

    if count < 1 or duration < 30 or jobs < 1:
        raise fail(f"need --count ≥ 1, --duration ≥ 30 and --jobs ≥ 1; got {count}, {duration}, {jobs}")
    if out.exists() and not out.is_dir():
        raise fail(f"--out {out} exists and is not a directory")
    with err.status(f"Simulating {count} scenarios, twice each …"):
        try:
            names = generate_whatif(seed, count, duration, out, jobs, hidden_cost, telemetry, iteration_logs)
        except ValueError as e:
            raise fail(str(e)) from None
    err.print(f"{len(names)} what-if scenarios ({', '.join(WHATIF_KNOBS)}) written to {out}")


def evaluate(
    bank: Annotated[Path, typer.Argument(help="Scenario bank directory (infertrace scenarios generate --out)")],
    fmt: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    section: Annotated[list[str] | None, typer.Option(help="Only these sections (repeatable); default: all")] = None,
    backend: Annotated[str, typer.Option(
        help="local (each scenario's store) or chdb (its spans written to ClickHouse's otel_traces in "
             "<bank>/clickhouse, as the Collector's exporter writes them, and analysed there)")] = "local",
    jobs: Annotated[int, typer.Option(
        help="Scenarios scored in parallel (processes); the same scores in the same order as one at a time. "
             "--backend chdb scores one at a time")] = 1,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Score the analyzers against the bank's ground truth, one section per analysis (infertrace.evaluation).
    Each scenario's traces are ingested into <scenario>/store the first time.

    Example:
      infertrace evaluate bank/ --format json
      infertrace evaluate rca-large/ --section rca --jobs 2
      infertrace evaluate bank/ --backend chdb --section itl --section rca
    """
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from infertrace.cli.replay import whatif_section
    from infertrace.evaluation import EVALUATORS, ScenarioPool

    evaluators = {**EVALUATORS, "whatif": whatif_section()}
    check_choice("--format", fmt, ("table", "json"))
    unknown = sorted(set(section or ()) - set(evaluators))
    if unknown:
        raise fail(f"--section: unknown {unknown}; known: {', '.join(evaluators)}")
    check_choice("--backend", backend, ("local", "chdb"))
    if jobs < 1:
        raise fail(f"--jobs must be ≥ 1, got {jobs}")
    if jobs > 1 and backend == "chdb":
        raise fail(f"--jobs {jobs} with --backend chdb: chdb's data directory ({bank / 'clickhouse'}) can be open in "
                   "one process only, so its scenarios are scored one at a time; give --jobs 1")
    from infertrace.evaluation import clickhouse_backend

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        results = {}
        with (clickhouse_backend(bank / "clickhouse") if backend == "chdb" else contextlib.nullcontext(),
              Progress(*columns, console=err, transient=True, disable=not progress) as bar):
            for name, (run, _) in evaluators.items():
                if not section or name in section:
                    task = bar.add_task(f"{name} scenarios", total=None)
                    pool = ScenarioPool(jobs, lambda done, total, task=task: bar.update(task, completed=done,
                                                                                        total=total))
                    results[name] = run(bank, pool)
    except FileNotFoundError as e:
        raise fail(str(e)) from None
    if fmt == "json":
        print(json.dumps(results, indent=1))
    else:
        print("\n\n".join(evaluators[name][1](result) for name, result in results.items()))
