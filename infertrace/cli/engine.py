"""`infertrace simulate` and `infertrace calibrate`: run the reference engine, fit its cost model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from infertrace.cli.console import err, fail
from infertrace.cli.conventions import trace_destination


def simulate(
    out: Annotated[Path | None, typer.Option(help="OTLP JSON lines file to write (.gz: gzip, .zst: zstd)")] = None,
    otlp_endpoint: Annotated[str | None, typer.Option(
        help="Send spans with the OTLP/HTTP exporter instead, e.g. http://127.0.0.1:4318/v1/traces")] = None,
    fleet: Annotated[Path | None, typer.Option(
        help="Fleet file (TOML, see docs/fleet.md): simulate models, gateway and tenants together; the "
             "single-engine and workload options are then not used")] = None,
    model: Annotated[str | None, typer.Option(
        help="Model spec (see reference_engine/engine/models.py) [default: llama-3-8b; tiny with --executor "
             "real]")] = None,
    hardware: Annotated[str | None, typer.Option(
        help="Hardware spec (see reference_engine/engine/hardware.py) [default: H100-SXM; CPU-host with --executor "
             "real on the CPU]")] = None,
    tensor_parallel: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree")] = 1,
    policy: Annotated[str, typer.Option(help="prefill_first or decode_first")] = "prefill_first",
    max_num_batched_tokens: int = 16384,
    max_num_seqs: int = 256,
    chunked_prefill: Annotated[bool, typer.Option(
        help="Chunked prefill (decode_first turns it on)")] = False,
    prefix_caching: bool = True,
    prefill_microbatch: Annotated[int, typer.Option(help="Prefill micro-batch tokens (0: none)")] = 0,
    offload_experts: Annotated[bool, typer.Option(
        help="Every MoE layer keeps its experts in host memory (llama.cpp's --cpu-moe)")] = False,
    cpu_moe_layers: Annotated[str, typer.Option(
        help="MoE layers whose experts stay in host memory: N (the first N, llama.cpp's --n-cpu-moe) or a "
             "comma-separated list of layer indices; streamed to the GPU per prefill micro-batch or computed on "
             "the host, whichever is faster (docs/cost_model.md)")] = "0",
    cuda_graphs: Annotated[bool, typer.Option(
        help="CUDA graphs (off: every layer pays its kernel launches, vLLM's --enforce-eager)")] = True,
    kv_host_tier_gb: Annotated[float, typer.Option(
        help="Host-memory KV tier behind the GPU, in GB: evicted prefix blocks move there and are copied back on a "
             "hit over the host link (0: none)")] = 0.0,
    kv_remote_tier_gb: Annotated[float, typer.Option(
        help="Remote (pooled) KV tier behind the host tier, in GB (0: none)")] = 0.0,
    kv_reuse_accounting: Annotated[bool, typer.Option(
        help="Prefill spans count prompt tokens evicted before their reuse: what more KV capacity would buy "
             "(on with any tier)")] = False,
    workload: Annotated[str, typer.Option(help="synthetic, azure or mooncake")] = "synthetic",
    workload_file: Annotated[Path | None, typer.Option(help="Trace to replay (azure CSV, mooncake JSONL)")] = None,
    speedup: Annotated[float, typer.Option(help="Replay: compress arrivals by this factor")] = 1.0,
    rate: Annotated[float, typer.Option(help="Synthetic: requests per second")] = 4.0,
    arrival: Annotated[str, typer.Option(help="Synthetic: poisson or gamma")] = "poisson",
    arrival_cv: Annotated[float, typer.Option(help="Synthetic gamma arrivals: CV of gaps")] = 1.0,
    prompt_mean: Annotated[float, typer.Option(help="Synthetic: mean user prompt tokens")] = 1024,
    output_mean: Annotated[float, typer.Option(help="Synthetic: mean output tokens")] = 200,
    max_tokens: Annotated[int, typer.Option(help="Synthetic: output token limit")] = 1024,
    system_prompt_tokens: Annotated[int, typer.Option(help="Synthetic: shared system prompt length")] = 1024,
    system_prompt_fraction: Annotated[float, typer.Option(
        help="Synthetic: share of requests starting with their tenant's system prompt")] = 0.6,
    assistant_prefill_fraction: Annotated[float, typer.Option(
        help="Synthetic: share of requests with an assistant prefill")] = 0.05,
    duration: Annotated[float, typer.Option(help="Seconds of arrivals to simulate")] = 60.0,
    seed: int = 0,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    executor: Annotated[str, typer.Option(
        help="sim: the roofline cost model on a virtual clock; real: a small transformer really prefills and "
             "decodes, with wall-clock step times (docs/real_executor.md)")] = "sim",
    backend: Annotated[str, typer.Option(help="Real executor: numpy, or torch (the torch extra)")] = "numpy",
    device: Annotated[str, typer.Option(help="Real executor: cpu, or cuda with torch")] = "cpu",
    dtype: Annotated[str, typer.Option(help="Real executor: float32, float64; bfloat16/float16 with torch")] = (
        "float32"),
    threads: Annotated[int, typer.Option(help="Real executor: cap BLAS/torch CPU threads (0: as they are)")] = 0,
    temperature: Annotated[float, typer.Option(help="Real executor: sampling temperature (0: greedy)")] = 0.0,
    num_kv_blocks: Annotated[int, typer.Option(
        help="KV blocks (0: from device memory; the real executor allocates 2048 by default)")] = 0,
    cost_params: Annotated[Path | None, typer.Option(
        help="Simulated executor: cost parameters from `infertrace calibrate --out`")] = None,
    telemetry: Annotated[str, typer.Option(
        help="Whose spans the engines emit: infertrace (this project's: step and phase spans), or exactly what "
             "vllm-v1, vllm-v0, sglang or tgi export (docs/sources.md)")] = "infertrace",
    gateway_telemetry: Annotated[str, typer.Option(
        help="Fleets: whose spans the gateway emits: infertrace, litellm (LiteLLM proxy's span names, HTTP "
             "attributes), or none")] = "infertrace",
    instance_ids: Annotated[bool, typer.Option(
        help="Emulated engines: the deployment sets service.instance.id (OTEL_RESOURCE_ATTRIBUTES); real "
             "engines set none by themselves")] = False,
    iteration_logs: Annotated[Path | None, typer.Option(
        help="With --telemetry vllm-v1: write vLLM's --enable-logging-iteration-details lines, one "
             "<instance>.log per engine, into this directory")] = None,
    client_tokens: Annotated[Path | None, typer.Option(
        help="Write each token's arrival time at a streaming client, one JSON line per request "
             "(docs/sources.md)")] = None,
    client_delay_ms: Annotated[float, typer.Option(help="Client token times: network delay")] = 2.0,
    client_jitter_ms: Annotated[float, typer.Option(help="Client token times: jitter per token, up to")] = 1.0,
) -> None:
    """Run the reference engine on a simulated GPU clock (or a real small transformer) and write its traces.
    Without --out or --otlp-endpoint, the OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT environment variable names the
    OTLP/HTTP receiver (headers, timeout and compression from the other OTEL_EXPORTER_OTLP_* variables).

    Example:
      infertrace simulate --duration 60 --rate 4 --seed 1 --out trace.jsonl.gz
      infertrace simulate --fleet examples/fleets/four_models.toml --duration 300 --out fleet.jsonl.gz
      OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 infertrace simulate --duration 60
      infertrace simulate --fleet fleet.toml --telemetry vllm-v1 --gateway-telemetry none --out vllm.jsonl
    """
    from reference_engine import api

    otlp_endpoint = trace_destination(out, otlp_endpoint)

    try:
        spec = api.TelemetrySpec(telemetry, gateway_telemetry, instance_ids, iteration_logs, client_tokens,
                                 client_delay_ms, client_jitter_ms)
        if fleet is not None:
            simulation: api.EngineSimulation | api.FleetSimulation = api.FleetSimulation(
                fleet, duration, seed, out, otlp_endpoint, spec)
            total, label = duration, "simulating fleet"
        else:
            run = api.EngineRun(
                model=model, hardware=hardware, tensor_parallel=tensor_parallel, policy=policy,
                max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                chunked_prefill=chunked_prefill, prefix_caching=prefix_caching,
                prefill_microbatch=prefill_microbatch, offload_experts=offload_experts,
                cpu_moe_layers=_layers(cpu_moe_layers), cuda_graphs=cuda_graphs, kv_host_tier_gb=kv_host_tier_gb,
                kv_remote_tier_gb=kv_remote_tier_gb, kv_reuse_accounting=kv_reuse_accounting,
                num_kv_blocks=num_kv_blocks,
                cost_params=cost_params, executor=executor, backend=backend, device=device, dtype=dtype,
                threads=threads, temperature=temperature, workload=workload, workload_file=workload_file,
                speedup=speedup, synthetic=api.SyntheticWorkload(
                    rate=rate, arrival=arrival, arrival_cv=arrival_cv, prompt_mean=prompt_mean,
                    output_mean=output_mean, max_tokens=max_tokens, system_prompt_tokens=system_prompt_tokens,
                    system_prompt_fraction=system_prompt_fraction,
                    assistant_prefill_fraction=assistant_prefill_fraction))
            if gateway_telemetry != "infertrace":
                raise ValueError("--gateway-telemetry needs --fleet: a single engine has no gateway")
            simulation = api.EngineSimulation(run, duration, seed, out, otlp_endpoint, spec)
            total, label = max(simulation.arrivals_s, 1e-9), "simulating"
    except (ValueError, OSError, ImportError, TypeError) as e:
        raise fail(str(e)) from None
    try:
        summary = _run_with_progress(simulation, label, total, progress)
    except ValueError as e:  # e.g. unknown hardware, or a model that does not fit on it
        raise fail(str(e)) from None
    err.print(summary.paragraph())
    if out is not None:
        err.print(f"{summary.spans} spans written to {out}" if fleet is not None else f"Traces written to {out}")
    if iteration_logs is not None:
        err.print(f"vLLM iteration logs written to {iteration_logs}/")
    if client_tokens is not None:
        err.print(f"Client token times written to {client_tokens}")


def _layers(text: str) -> int | tuple[int, ...]:
    """`--cpu-moe-layers`: a count, or a comma-separated list of layer indices."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--cpu-moe-layers must be a layer count or a comma-separated list of layer indices, "
                         f"got {text!r}") from None
    return values[0] if "," not in text else tuple(values)


def _run_with_progress(simulation, label: str, total: float, progress: bool):  # type: ignore[no-untyped-def]
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not progress:
        return simulation.run()
    columns = (TextColumn(label), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} sim s"),
               TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("sim", total=total)
        return simulation.run(lambda seconds: bar.update(task, completed=min(seconds, total)))


def calibrate(
    csv: Annotated[Path | None, typer.Option(
        help="Measured steps: phase,batch_size,prompt_tokens,context_tokens,measured_ms (docs/real_executor.md); "
             "without it, the real executor is measured here")] = None,
    model: Annotated[str, typer.Option(help="Model spec the times belong to")] = "tiny",
    hardware: Annotated[str, typer.Option(help="Hardware spec the efficiencies are relative to")] = "CPU-host",
    backend: Annotated[str, typer.Option(help="Real executor: numpy or torch")] = "numpy",
    device: Annotated[str, typer.Option(help="Real executor: cpu or cuda")] = "cpu",
    dtype: Annotated[str, typer.Option(help="Real executor: float32, float64, bfloat16, float16")] = "float32",
    threads: Annotated[int, typer.Option(help="Real executor: cap BLAS/torch CPU threads (0: as they are)")] = 0,
    requests: Annotated[int, typer.Option(help="Real executor: requests per policy and run")] = 48,
    per_phase: Annotated[bool, typer.Option(help="Also fit prefill and decode steps separately")] = False,
    seed: int = 0,
    out: Annotated[Path | None, typer.Option(help="Write the fit as JSON (simulate --cost-params reads it)")] = None,
    format: Annotated[str, typer.Option(help="table or json")] = "table",
    tp: Annotated[str, typer.Option(
        "--tp", help="Tensor-parallel degree of the measured instance, or `fit` to pick the degree that explains "
                     "a --csv best (1, 2, 4, 8)")] = "1",
    model_config: Annotated[Path | None, typer.Option(
        help="A Hugging Face config.json: the model's architecture instead of a built-in --model")] = None,
    table: Annotated[Path | None, typer.Option(
        help="A published measurement table (infertrace.published_table/1, with its citation; `lmdeploy-a100`, "
             "`splitwise-a100` and `splitwise-h100` name the bundled ones): fit on half of it, report the held-out "
             "error per phase and TP degree")] = None,
) -> None:
    """Fit the simulated executor's cost model (efficiencies, per-step overhead) to measured step times, and
    report the error per phase. Measuring the real executor fits one run and checks another (held out).

    Example:
      infertrace calibrate --out cost.json
      infertrace calibrate --csv measured_steps.csv --model llama-3-8b --hardware H100-SXM --format json
      infertrace calibrate --csv steps.csv --model-config config.json --hardware H100-SXM --tp fit
      infertrace calibrate --table splitwise-h100
    """
    from reference_engine.api import calibration_report, table_calibration_report

    if format not in ("table", "json"):
        raise fail(f"--format must be table or json, got {format!r}")
    if tp != "fit" and not (tp.isdigit() and int(tp) >= 1):
        raise fail(f"--tp must be a degree ≥ 1 or `fit`, got {tp!r}")
    if tp == "fit" and csv is None:
        raise fail("--tp fit needs --csv (measured steps of an instance whose degree is unknown)")
    try:
        if table is not None:
            report, text = table_calibration_report(table)
        else:
            report, text = calibration_report(csv, model, hardware, backend=backend, device=device, dtype=dtype,
                                              threads=threads, requests=requests, per_phase=per_phase, seed=seed,
                                              on_status=err.print, tensor_parallel=None if tp == "fit" else int(tp),
                                              model_config=model_config)
    except (ValueError, OSError, ImportError) as e:
        raise fail(str(e)) from None
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
    typer.echo(json.dumps(report, indent=2) if format == "json" else text)
