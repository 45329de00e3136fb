"""The `infertrace` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Why did LLM inference latency go wrong? Simulate, ingest, analyse, report.")
err = Console(stderr=True)


@app.callback()
def _root() -> None:
    """Why did LLM inference latency go wrong? Simulate, ingest, analyse, report."""


def fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}")
    return typer.Exit(2)


@app.command()
def simulate(
    out: Annotated[Path | None, typer.Option(help="OTLP JSON lines file to write (.gz: gzip)")] = None,
    otlp_endpoint: Annotated[str | None, typer.Option(
        help="Send spans with the OTLP/HTTP exporter instead, e.g. http://127.0.0.1:4318/v1/traces")] = None,
    fleet: Annotated[Path | None, typer.Option(
        help="Fleet file (TOML, see docs/fleet.md): simulate models, gateway and tenants together; the "
             "single-engine and workload options are then not used")] = None,
    model: Annotated[str | None, typer.Option(
        help="Model spec (see reference_engine.models) [default: llama-3-8b; tiny with --executor real]")] = None,
    hardware: Annotated[str | None, typer.Option(
        help="Hardware spec (see reference_engine.hardware) [default: H100-SXM; CPU-host with --executor real "
             "on the CPU]")] = None,
    tensor_parallel: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree")] = 1,
    policy: Annotated[str, typer.Option(help="prefill_first or decode_first")] = "prefill_first",
    max_num_batched_tokens: int = 16384,
    max_num_seqs: int = 256,
    chunked_prefill: Annotated[bool, typer.Option(
        help="Chunked prefill (decode_first turns it on)")] = False,
    prefix_caching: bool = True,
    prefill_microbatch: Annotated[int, typer.Option(help="Prefill micro-batch tokens (0: none)")] = 0,
    offload_experts: Annotated[bool, typer.Option(help="MoE experts run on the host CPU")] = False,
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
) -> None:
    """Run the reference engine on a simulated GPU clock (or a real small transformer) and write its traces."""
    if fleet is not None:
        return _simulate_fleet(fleet, duration, seed, out, otlp_endpoint, progress)
    import functools

    from reference_engine.config import EngineConfig
    from reference_engine.cost_model import CostParams
    from reference_engine.simulate import WorkloadSpec, open_sink
    from reference_engine.simulate import simulate as run
    from reference_engine.workload import SyntheticWorkload

    if executor not in ("sim", "real"):
        raise fail(f"--executor must be sim or real, got {executor!r}")
    real = executor == "real"
    model = model or ("tiny" if real else "llama-3-8b")
    if hardware is None:
        hardware = "H100-SXM" if not real else "CPU-host" if device == "cpu" else _cuda_hardware_name()
    try:
        cost = CostParams()
        if cost_params is not None:
            from reference_engine.calibration import load_cost_params

            cost = load_cost_params(cost_params)
        config = EngineConfig(
            model=model, hardware=hardware, tensor_parallel=tensor_parallel, policy=policy,
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            chunked_prefill=chunked_prefill or policy == "decode_first", enable_prefix_caching=prefix_caching,
            prefill_microbatch=prefill_microbatch, offload_experts=offload_experts,
            num_kv_blocks=num_kv_blocks or (2048 if real else 0), cost=cost)
        if real:
            from reference_engine.real_executor import real_executor_for

            run = functools.partial(run, executor=real_executor_for(
                config, backend=backend, device=device, dtype=dtype, seed=seed, temperature=temperature,
                threads=threads))
        synthetic = SyntheticWorkload(
            rate=rate, arrival=arrival, arrival_cv=arrival_cv, prompt_mean=prompt_mean, output_mean=output_mean,
            max_tokens=max_tokens, system_prompt_tokens=system_prompt_tokens,
            system_prompt_fraction=system_prompt_fraction, assistant_prefill_fraction=assistant_prefill_fraction)
        spec = WorkloadSpec(workload, workload_file, synthetic, speedup)
        requests = spec.requests(duration, seed, model)
        sink = open_sink(out, otlp_endpoint)
    except (ValueError, OSError, ImportError, TypeError) as e:
        raise fail(str(e)) from None
    if not requests:
        raise fail("the workload produced no requests in that duration")
    try:
        summary = _run_with_progress(run, config, requests, sink, seed, progress)
    except ValueError as e:  # e.g. unknown hardware, or a model that does not fit on it
        raise fail(str(e)) from None
    err.print(summary.paragraph())
    if out is not None:
        err.print(f"Traces written to {out}")


def _simulate_fleet(path: Path, duration: float, seed: int, out: Path | None, otlp_endpoint: str | None,
                    progress: bool) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from reference_engine.fleet import Fleet
    from reference_engine.fleet_config import load_fleet
    from reference_engine.fleet_workload import fleet_requests
    from reference_engine.simulate import open_sink

    if duration <= 0:
        raise fail(f"--duration must be > 0 seconds, got {duration}")
    try:
        spec = load_fleet(path)
        requests = fleet_requests(spec, duration, seed)
        sink = open_sink(out, otlp_endpoint)
    except (ValueError, OSError) as e:
        raise fail(str(e)) from None
    if not requests:
        raise fail(f"{path}: the tenants sent no requests in {duration} s")
    start = requests[0].arrival_ns
    try:
        if not progress:
            summary = Fleet(spec, sink, seed).run(requests)
        else:
            columns = (TextColumn("simulating fleet"), BarColumn(),
                       TextColumn("{task.completed:.0f}/{task.total:.0f} sim s"), TimeElapsedColumn())
            with Progress(*columns, console=err, transient=True) as bar:
                task = bar.add_task("sim", total=duration)
                summary = Fleet(spec, sink, seed).run(
                    requests, lambda now: bar.update(task, completed=min((now - start) / 1e9, duration)))
    finally:
        if sink is not None:
            sink.close()
    err.print(summary.paragraph())
    if out is not None:
        err.print(f"{summary.spans} spans written to {out}")


@app.command()
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
) -> None:
    """Fit the simulated executor's cost model (efficiencies, per-step overhead) to measured step times, and
    report the error per phase. Measuring the real executor fits one run and checks another (held out)."""
    import dataclasses
    import json

    from reference_engine.calibration import calibrate as fit
    from reference_engine.calibration import evaluate, measure_calibration_run, steps_from_csv
    from reference_engine.hardware import hardware as hardware_spec
    from reference_engine.models import model as model_spec

    if format not in ("table", "json"):
        raise fail(f"--format must be table or json, got {format!r}")
    try:
        spec, hw = model_spec(model), hardware_spec(hardware)
        held_out = None
        if csv is not None:
            steps = steps_from_csv(csv)
        else:
            from reference_engine.real_executor import RealExecutor

            executor = RealExecutor(spec, 2048, 16, backend=backend, device=device, dtype=dtype, seed=seed,
                                    threads=threads)
            err.print(f"measuring {model} on the real executor ({backend}, {device}, {dtype}): 2 runs × 2 "
                      f"policies × {requests} requests")
            steps = measure_calibration_run(executor, model, hardware, seed, requests)
            held_out = measure_calibration_run(executor, model, hardware, seed + 1, requests)
        result = fit(steps, spec, hw)
        phases = [fit(steps, spec, hw, phase) for phase in ("prefill", "decode")] if per_phase else []
    except (ValueError, OSError, ImportError) as e:
        raise fail(str(e)) from None
    report = json.loads(result.to_json())
    if held_out is not None:
        errors, median = evaluate(held_out, spec, hw, result.params)
        report["held_out"] = {"median_error": median, "phases": [dataclasses.asdict(e) for e in errors]}
    if phases:
        report["per_phase"] = {p.phases[0].phase: json.loads(p.to_json()) for p in phases if p.phases}
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
    if format == "json":
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(result.table())
    if held_out is not None:
        typer.echo("  held-out run: " + ", ".join(
            f"{e['phase']} median error {e['median_error']:.1%} ({e['steps']} steps)"
            for e in report["held_out"]["phases"]) + f"; all {report['held_out']['median_error']:.1%}")
    for p in phases:
        typer.echo(f"fitted to {p.phases[0].phase} steps alone: {p.table().splitlines()[1].strip()}; "
                   f"median error {p.median_error:.1%}")


def _cuda_hardware_name() -> str:
    """The hardware spec matching the CUDA device (e.g. H200 for "NVIDIA H200"), else the device's own name."""
    try:
        import torch

        name = torch.cuda.get_device_name()
    except (ImportError, RuntimeError, AssertionError):
        return "cuda"
    from reference_engine.hardware import HARDWARE

    return next((key for key in HARDWARE if key.split("-")[0] in name), name)


def _run_with_progress(run, config, requests, sink, seed, progress):  # type: ignore[no-untyped-def]
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not progress:
        return run(config, requests, sink, seed)
    start, end = requests[0].arrival_ns, max(r.arrival_ns for r in requests)
    columns = (TextColumn("simulating"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} sim s"),
               TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("sim", total=max((end - start) / 1e9, 1e-9))
        return run(config, requests, sink, seed,
                   lambda _ended, now: bar.update(task, completed=min((now - start) / 1e9, (end - start) / 1e9)))


@app.command()
def ingest(
    paths: Annotated[list[str], typer.Argument(help="OTLP JSON lines files (.jsonl, .jsonl.gz), directories, globs")],
    store: Annotated[Path, typer.Option(help="Store directory (created if missing)")],
    strict: Annotated[bool, typer.Option(help="Exit 1 if any line or span was skipped")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Ingest OTLP JSON lines (as the OpenTelemetry Collector's file exporter writes them) into a store.
    Re-ingesting the same data adds nothing; bad lines and spans are kept in the store's quarantine."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from infertrace.store.ingest import expand_paths, ingest_paths

    try:
        files = expand_paths(list(paths))
        total = sum(f.stat().st_size for f in files)
        if progress:
            columns = (TextColumn("ingesting"), BarColumn(), DownloadColumn(), TimeElapsedColumn())
            with Progress(*columns, console=err, transient=True) as bar:
                task = bar.add_task("ingest", total=total)
                summary = ingest_paths(store, list(files), on_progress=lambda n: bar.advance(task, n))
        else:
            summary = ingest_paths(store, list(files))
    except OSError as e:
        raise fail(str(e)) from None
    err.print(summary.paragraph())
    if strict and summary.skipped:
        raise typer.Exit(1)


@app.command()
def collect(
    store: Annotated[Path, typer.Option(help="Store directory (created if missing)")],
    listen: Annotated[str, typer.Option(help="HOST:PORT to listen on (port 0: any free port)")] = "127.0.0.1:4318",
    token: Annotated[str | None, typer.Option(
        envvar="INFERTRACE_COLLECT_TOKEN", help="Require `Authorization: Bearer TOKEN` (401 without it)")] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body, after decompression (413 above)")] = (
        32 * 1024 * 1024),
    queue_size: Annotated[int, typer.Option(help="Requests accepted at once; more get 503 + Retry-After")] = 16,
) -> None:
    """Receive OTLP/HTTP traces (POST /v1/traces, protobuf or JSON, gzip) into a store. A request is answered
    200 only after its spans are durably stored."""
    from infertrace.store.collector import Collector, parse_listen

    try:
        host, port = parse_listen(listen)
        collector = Collector(store, host, port, token=token, max_body_bytes=max_body_bytes, queue_size=queue_size)
    except (OSError, ValueError) as e:
        raise fail(str(e)) from None
    print(f"infertrace collect: listening on http://{collector.address}/v1/traces, store {store}", flush=True)
    try:
        collector.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        collector.shutdown()


scenarios_app = typer.Typer(no_args_is_help=True, help="Incident scenarios: traces plus ground truth.")
app.add_typer(scenarios_app, name="scenarios")


@scenarios_app.command("generate")
def scenarios_generate(
    out: Annotated[Path, typer.Option(help="Directory to write one sub-directory per scenario into")],
    seed: Annotated[int, typer.Option(help="Seed of the whole bank")] = 0,
    count: Annotated[int, typer.Option(help="Scenarios to generate (cycling through the families)")] = 50,
    duration: Annotated[float, typer.Option(help="Simulated seconds of traffic per scenario")] = 600.0,
    family: Annotated[list[str] | None, typer.Option(
        help="Only these families (repeatable); default: all of them")] = None,
    jobs: Annotated[int, typer.Option(help="Scenarios simulated in parallel (processes)")] = 1,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Draw random topologies, fault families, onsets, durations and magnitudes; write each scenario's traces
    (traces.jsonl.gz), fleet file and ground truth (ground_truth.json), and an index.json."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from reference_engine.scenarios import FAMILIES, bank, generate

    if count < 1:
        raise fail(f"--count must be ≥ 1, got {count}")
    if duration < 60:
        raise fail(f"--duration must be ≥ 60 simulated seconds (a baseline, then a fault), got {duration}")
    if jobs < 1:
        raise fail(f"--jobs must be ≥ 1, got {jobs}")
    unknown = sorted(set(family or ()) - set(FAMILIES))
    if unknown:
        raise fail(f"--family: unknown {unknown}; known: {', '.join(FAMILIES)}")
    if out.exists() and not out.is_dir():
        raise fail(f"--out {out} exists and is not a directory")
    scenarios = bank(seed, count, duration, tuple(family or FAMILIES))
    columns = (TextColumn("scenarios"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=err, transient=True, disable=not progress) as bar:
            task = bar.add_task("scenarios", total=len(scenarios))
            truths = generate(scenarios, out, jobs, lambda: bar.advance(task))
    except OSError as e:
        raise fail(f"--out {out}: {e}") from None
    families = {t["family"] for t in truths}
    err.print(f"{len(truths)} scenarios ({len(families)} families) written to {out}; index in {out / 'index.json'}")


@app.command()
def query(
    name: Annotated[str | None, typer.Argument(help="Runbook query name (see --list)")] = None,
    store: Annotated[Path | None, typer.Option(help="Store directory")] = None,
    param: Annotated[list[str] | None, typer.Option(help="KEY=VALUE (repeatable)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, csv or json")] = "table",
    list_: Annotated[bool, typer.Option("--list", help="List the runbook queries and exit")] = False,
    show_sql: Annotated[bool, typer.Option("--sql", help="Print the query's SQL instead of running it")] = False,
) -> None:
    """Run a named runbook query (RUNBOOK.md) on a store; parameters are bound, never formatted into SQL."""
    from infertrace.runbook import RunbookError, get_query, load_queries, run_query
    from infertrace.runbook.runner import FORMATS, format_frame

    if list_:
        for q in load_queries().values():
            params = " ".join(p.name if p.required else f"[{p.name}]" for p in q.parameters)
            print(f"{q.name:34} {q.title}" + (f"  ({params})" if params else ""))
        return
    if name is None:
        raise fail("give a query NAME, or --list to see them")
    if fmt not in FORMATS:
        raise fail(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    values: dict[str, str] = {}
    for item in param or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--param {item!r}: expected KEY=VALUE")
        values[key.strip()] = value
    try:
        q = get_query(name)
        if show_sql:
            print(q.sql)
            return
        if store is None:
            raise fail("--store DIR is required to run a query")
        from infertrace.store.store import Store

        with Store.open(store) as opened:
            frame = run_query(opened, q, values)
    except RunbookError as e:
        raise fail(str(e)) from None
    except OSError as e:
        raise fail(f"--store {store}: {e}") from None
    print(format_frame(frame, fmt))


@app.command()
def evaluate(
    bank: Annotated[Path, typer.Argument(help="Scenario bank directory (infertrace scenarios generate --out)")],
    fmt: Annotated[str, typer.Option("--format", help="table or json")] = "table",
    section: Annotated[list[str] | None, typer.Option(help="Only these sections (repeatable); default: all")] = None,
) -> None:
    """Score the analyzers against the bank's ground truth, one section per analysis (infertrace.evaluation).
    Each scenario's traces are ingested into <scenario>/store the first time."""
    import json

    from infertrace.evaluation import EVALUATORS

    if fmt not in ("table", "json"):
        raise fail(f"--format must be table or json, got {fmt!r}")
    unknown = sorted(set(section or ()) - set(EVALUATORS))
    if unknown:
        raise fail(f"--section: unknown {unknown}; known: {', '.join(EVALUATORS)}")
    try:
        results = {name: run(bank) for name, (run, _) in EVALUATORS.items() if not section or name in section}
    except FileNotFoundError as e:
        raise fail(str(e)) from None
    if fmt == "json":
        print(json.dumps(results, indent=1))
    else:
        print("\n\n".join(EVALUATORS[name][1](result) for name, result in results.items()))


@app.command()
def report(
    store: Annotated[Path, typer.Option(help="Store directory")],
    since: Annotated[str | None, typer.Option(help="Window start: ISO 8601 (UTC), epoch s or ns")] = None,
    until: Annotated[str | None, typer.Option(help="Window end (exclusive)")] = None,
    model: Annotated[str | None, typer.Option(help="Only this model")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, markdown, json or html")] = "table",
    fail_on: Annotated[str, typer.Option(
        help="Exit 1 when a finding is at least this severe: info, warning, critical, or never")] = "critical",
    slo: Annotated[list[str] | None, typer.Option(
        help="SLO target KEY=VALUE (repeatable): ttft|itl|e2e_p50|p95|p99_ms, error_rate, rejected_rate")] = None,
    section: Annotated[list[str] | None, typer.Option(help="Only these sections (repeatable)")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the report to this file instead of stdout")] = None,
) -> None:
    """The anomaly report over a store: SLO summary, incidents with ranked causes, ITL spike culprits,
    recommendations. Exit 0: nothing at or above --fail-on; 1: findings at or above it; 2: usage or I/O error."""
    from infertrace.analyzers.slo import parse_target, with_targets
    from infertrace.report import FORMATS, SEVERITIES, ReportOptions, build_report, render, severity_at_least
    from infertrace.report.model import SECTIONS
    from infertrace.runbook import parse_time_ns

    if fmt not in FORMATS:
        raise fail(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fail_on not in (*SEVERITIES[1:], "never"):
        raise fail(f"--fail-on must be info, warning, critical or never, got {fail_on!r}")
    unknown = sorted(set(section or ()) - set(SECTIONS))
    if unknown:
        raise fail(f"--section: unknown {unknown}; known: {', '.join(SECTIONS)}")
    try:
        targets = with_targets([parse_target(t) for t in slo or ()])
        since_ns = parse_time_ns(since) if since is not None else None
        until_ns = parse_time_ns(until) if until is not None else None
    except ValueError as e:
        raise fail(str(e)) from None
    if since_ns is not None and until_ns is not None and since_ns >= until_ns:
        raise fail(f"--since {since} is not before --until {until}")
    options = ReportOptions(since_ns=since_ns, until_ns=until_ns, model=model, tenant=tenant, targets=targets,
                            sections=tuple(section) if section else SECTIONS)
    from infertrace.store.store import Store

    try:
        with Store.open(store) as opened:
            if not opened.segments:
                raise fail(f"--store {store}: the store holds no spans (ingest traces first)")
            doc = build_report(opened, options)
    except FileNotFoundError as e:
        raise fail(f"--store {store}: {e}") from None
    text = render(doc, fmt)
    if out is None:
        print(text, end="")
    else:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as e:
            raise fail(f"--out {out}: {e}") from None
    if fail_on != "never" and severity_at_least(doc["severity"], fail_on):
        raise typer.Exit(1)


@app.command()
def dashboard(
    store: Annotated[Path, typer.Option(help="Store directory")],
    port: Annotated[int, typer.Option(help="Port to serve on")] = 8501,
    address: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
) -> None:
    """Serve the Streamlit dashboard on a store (fleet overview, ITL spikes, incidents, prefix cache, runbook)."""
    import os
    import sys

    app_path = Path(__file__).resolve().parent.parent / "dashboards" / "app.py"
    if not app_path.is_file():
        raise fail(f"{app_path}: the dashboard app is missing (run from a clone of the repository)")
    if not store.is_dir():
        raise fail(f"--store {store}: no such store directory")
    command = [sys.executable, "-m", "streamlit", "run", str(app_path), "--server.headless", "true",
               "--server.address", address, "--server.port", str(port), "--browser.gatherUsageStats", "false",
               "--", "--store", str(store.resolve())]
    print(f"infertrace dashboard: http://{address}:{port}/ on store {store}", flush=True)
    # Become the Streamlit server (same process id), so a signal to this command stops the server.
    try:
        os.execv(sys.executable, command)
    except OSError as e:
        raise fail(f"cannot start streamlit with {sys.executable}: {e}") from None


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Store directory to create (the scenario goes into OUT/scenario)")] = (
        Path("demo-store")),
    fmt: Annotated[str, typer.Option("--format", help="Report format: table, markdown, json or html")] = "table",
    seed: Annotated[int, typer.Option(help="Seed of the incident's onset, length and magnitude")] = 7,
    duration: Annotated[float, typer.Option(help="Simulated seconds of traffic")] = 300.0,
) -> None:
    """Simulate a canonical multi-model incident (a shared router degrading two of three models, prefill
    collisions on one), ingest it, print the report, and say how to open the dashboard on that store."""
    from infertrace.demo import injected, run_demo
    from infertrace.report import FORMATS, build_report, render
    from infertrace.store.store import Store

    if fmt not in FORMATS:
        raise fail(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if duration < 60:
        raise fail(f"--duration must be ≥ 60 simulated seconds (a baseline, then the incident), got {duration}")
    if out.exists() and not out.is_dir():
        raise fail(f"--out {out} exists and is not a directory")
    err.print(f"Simulating the demo incident ({duration:.0f} s of a three-model fleet) into {out} …",
              soft_wrap=True, markup=False)
    try:
        run = run_demo(out, seed, duration)
    except OSError as e:
        raise fail(f"--out {out}: {e}") from None
    err.print(injected(run.truth), soft_wrap=True, markup=False)
    with Store.open(out) as store:
        print(render(build_report(store), fmt), end="")
    err.print(f"\nOpen the dashboard on this store:\n  infertrace dashboard --store {out}\n"
              f"then browse http://127.0.0.1:8501/ (ITL spikes, incidents, runbook). Ask the runbook:\n"
              f"  infertrace query --store {out} worst_itl_gaps --param top=5", soft_wrap=True, markup=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
