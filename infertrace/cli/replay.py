"""`infertrace replay`: replay a captured window of one model's traffic under its captured config and under
variants of it (`--set key=value`), on the reference engine's simulated clock."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from infertrace.cli.analysis import STORE_HELP
from infertrace.cli.console import err, fail
from infertrace.evaluation import Evaluator
from infertrace.replay.capture import (
    Capture,
    Distribution,
    LoggedSteps,
    ReplayRequest,
    measured_iterations,
    measured_phase_times,
    measured_steps,
)
from infertrace.replay.compare import Variant, WhatIf
from infertrace.replay.deployment import KNOBS, Deployment
from infertrace.store.clickhouse.connection import is_clickhouse_url
from infertrace.store.store import Store

# Fewer steps of an iteration log than this are not fitted (the request timings are).
MIN_LOGGED_STEPS = 50


def replay_distribution(requests: tuple[ReplayRequest, ...], deployment: Deployment, seed: int = 0) -> Distribution:
    """Replays the requests on the deployment (reference_engine.api.replay); what they saw."""
    from reference_engine.api import replay as engine_replay

    return run_distribution(engine_replay(list(requests), deployment, seed))


def run_distribution(run: Any) -> Distribution:
    """What the requests of a replay (reference_engine.replay.ReplayRun) saw."""
    return Distribution.from_arrays(run.ttft_ns, run.itl_percentile_ns, run.e2e_ns, run.output_tokens,
                                    run.last_finish_ns - run.first_arrival_ns,
                                    (run.kv_mean, run.kv_peak) if run.steps else None, run.preemptions, run.rejected)


def run_variant(name: str, requests: tuple[ReplayRequest, ...], deployment: Deployment, seed: int = 0,
                untrustworthy: str | None = None) -> Variant:
    start = time.perf_counter()
    predicted = replay_distribution(requests, deployment, seed)
    return Variant(name, deployment.as_dict(), deployment.label(), predicted, time.perf_counter() - start,
                   untrustworthy)


def calibrate_from_capture(store: Store, capture: Capture) -> tuple[Capture, str]:
    """The capture with its deployment's cost model fitted to the engines' own measured steps (their step spans;
    without them, vLLM's iteration log where the store holds one, placed on the spans' clock), or, where the store
    holds neither (vLLM's, SGLang's request spans alone), to each request's measured prefill and decode times; where
    the spans report no cached tokens, prefix-cache hits are taken from the prompt tokens the iteration log shows
    each request's steps computing, else inferred from the requests' prefill times under the fit; and a sentence
    with the fit's error (without step spans, the replay's against the measured requests).
    Raises ValueError when the store holds too few of either."""
    from reference_engine.api import fit_cost_params, fit_cost_params_from_requests

    d = capture.deployment
    if capture.has_step_spans:
        steps = measured_steps(store, capture.model, capture.since_ns, capture.until_ns)
        cost, errors = fit_cost_params(steps, d.model, d.hardware, d.tensor_parallel, d.prefill_microbatch)
        what = f"{len(steps)} measured steps"
    else:
        measured = measured_phase_times(store, capture.model, capture.since_ns, capture.until_ns)
        logged = measured_iterations(store, capture.model, capture.since_ns, capture.until_ns)
        if len(logged.steps) >= MIN_LOGGED_STEPS:
            capture, cost, errors, passes, what = _fit_logged(capture, logged, measured)
        else:
            cost, errors, phases, prefixes, passes = fit_cost_params_from_requests(
                list(capture.requests), d, measured, infer_prefixes=not capture.cached_tokens_reported)
            what = (f"{phases} measured request phases (no step spans: each request's prefill and decode time, its "
                    "steps rebuilt by replaying the capture)")
            if prefixes:
                groups = len({prefix for prefix, _ in prefixes.values()})
                what += (f"; {len(prefixes)} requests are replayed sharing {groups} prefixes inferred from prefills "
                         "faster than their whole prompt, each with the earlier request that computed it where there "
                         "is one (the spans carry no cached-token count)")
                capture = _with_prefixes(capture, prefixes)
            if logged.steps:
                what += (f"; the iteration log's {len(logged.steps)} placed steps are too few to fit "
                         f"(< {MIN_LOGGED_STEPS})")
        if logged.unplaced:
            what += (f"; {logged.unplaced} iteration log(s) that may be its engines' could not be placed on the "
                     "spans' clock (named after no engine of the store, or no prefill and first token to place them "
                     "by) and are not used")
        capture = replace(capture, linear_passes=passes)
        if passes[0] == 0:
            what += (f"; no pass was compute-bound (at most {passes[1]} tokens): the times bound the compute "
                     f"efficiency from below only (≥ {passes[2]:.2f}), the datasheet's prior sets it")
    sentence = (f"cost model fitted to {what} of {d.model}: median error "
                + ", ".join(f"{phase} {e:.1%}" for phase, e in errors.items()))
    calibrated = replace(capture, deployment=replace(d, cost=cost), notes=(*capture.notes, sentence))
    return calibrated, sentence


def _with_prefixes(capture: Capture, prefixes: dict[str, tuple[str, int]]) -> Capture:
    return replace(capture, requests=tuple(
        replace(r, shared_prefix_id=prefixes[r.request_id][0], shared_prefix_tokens=prefixes[r.request_id][1])
        if r.request_id in prefixes else r for r in capture.requests))


def _fit_logged(capture: Capture, logged: LoggedSteps, measured: dict[str, tuple[int | None, int | None]]
                ) -> tuple[Capture, dict[str, float], dict[str, float], tuple[int, int, float], str]:
    """The cost model fitted to the steps of vLLM's iteration log, the prefix-cache hits its prompt steps measured
    (unless the spans report cached tokens), and the replay's error against the requests' measured times under
    them: (capture with those hits, cost, errors, linear passes, what the sentence says)."""
    from reference_engine.api import fit_cost_params, fit_cost_params_from_requests, measured_prefixes

    d = capture.deployment
    cost, log_errors = fit_cost_params(logged.steps, d.model, d.hardware, d.tensor_parallel, d.prefill_microbatch,
                                       estimated=True)
    what = (f"{len(logged.steps)} steps of vLLM's iteration log (no step spans: the log placed on the spans' clock, "
            "each step's decode context and prompt chunks estimated from the request spans; median error "
            + ", ".join(f"{phase} {e:.1%}" for phase, e in log_errors.items()) + ")")
    reported = capture.cached_tokens_reported
    known = {} if reported else measured_prefixes(list(capture.requests), logged.computed)
    _, errors, phases, prefixes, passes = fit_cost_params_from_requests(list(capture.requests), d, measured,
                                                                        infer_prefixes=not reported, fitted=cost,
                                                                        known=known, resolved=logged.computed)
    if prefixes:
        capture = _with_prefixes(capture, prefixes)
        inferred = len(prefixes) - len(known)
        what += (f"; {len(prefixes)} requests are replayed sharing {len({p for p, _ in prefixes.values()})} prefixes, "
                 "the requests that computed them included (the spans carry no cached-token count): "
                 f"{len(known)} as the prompt tokens the log shows their steps computing measured them (of the "
                 f"{len(logged.computed)} requests it shows prefilled in steps of their own), {inferred} inferred "
                 "from prefills faster than their whole prompt")
    what += (f"; checked against {phases} measured request phases (each request's prefill and decode time, its "
             "steps rebuilt by replaying the capture)")
    return capture, cost, errors, passes, what


def what_if(capture: Capture, variants: list[tuple[str, Deployment]], calibrated: bool, seed: int = 0) -> WhatIf:
    """The baseline replay and each variant's, compared with the capture."""
    from infertrace.replay.compare import build, compute_floor_variant, variant_caveat

    def caveat(d: Deployment) -> str | None:
        said = variant_caveat(capture, d, calibrated)
        if said is None or not calibrated or (floor := compute_floor_variant(capture, d)) is None:
            return said
        low = replay_distribution(capture.requests, floor, seed)
        return (f"{said}. At that floor (the slowest the capture allows) it predicts TTFT p99 "
                f"{low.ttft_p99_ms or float('nan'):.1f} ms, ITL p99 {low.itl_p99_ms or float('nan'):.1f} ms")

    baseline = run_variant("baseline", capture.requests, capture.deployment, seed)
    return build(capture, baseline, [run_variant(n, capture.requests, d, seed, caveat(d)) for n, d in variants],
                 calibrated)


def _cost_params(path: Path) -> dict[str, float]:
    data = json.loads(path.read_text(encoding="utf-8"))
    params = data.get("params", data)
    if not isinstance(params, dict):
        raise ValueError(f"{path}: expected calibrate's JSON (a params object)")
    return {k: v for k, v in params.items() if v is not None}


def replay(
    store: Annotated[str, typer.Option(help=STORE_HELP)],
    model: Annotated[str | None, typer.Option(help="The model whose traffic to replay (default: the store's only "
                                                    "model)")] = None,
    since: Annotated[str | None, typer.Option(
        help="Window start: ISO 8601 (UTC), epoch s or ns, or back from now: -15m, 2h, 1d")] = None,
    until: Annotated[str | None, typer.Option(help="Window end (exclusive), same forms")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="A variant: KEY=VALUE[,KEY=VALUE...] (repeatable; one variant each). Keys: "
                      + "; ".join(f"{k}: {v}" for k, v in KNOBS.items()))] = None,
    captured: Annotated[list[str] | None, typer.Option(
        help="KEY=VALUE: the captured config where the spans do not say it (or say it wrong), same keys")] = None,
    cost_params: Annotated[Path | None, typer.Option(
        help="Calibrated cost model (infertrace calibrate --out) for every replay")] = None,
    calibrate: Annotated[bool, typer.Option(
        help="Fit the cost model to the captured engines' own step spans (without them: vLLM's iteration log, "
             "ingested beside the spans, else each request's measured prefill and decode time) before "
             "replaying")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the result as JSON to this file")] = None,
    save: Annotated[bool, typer.Option(
        help="Keep the result in the store (<store>/whatif/) for the dashboard's What if page and the report's "
             "recommendations")] = True,
    seed: int = 0,
) -> None:
    """Replay a captured window of one model's traffic: first under the captured config (the baseline, checked
    against the capture: TTFT and ITL p50/p99 within 5%, else the replay says it is not trustworthy and by how
    much), then under each --set variant; prints a table (TTFT, ITL, E2E p50/p99, throughput, KV use,
    preemptions) per variant.

    Example:
      infertrace replay --store store/ --model llama-3-8b --set chunk=512 --set policy=decode_first,chunk=2048
      infertrace replay --store store/ --model llama-3-8b --set replicas=2 --set tp=2 --set pd=1:1 --json w.json
    """
    from infertrace.cli.conventions import parse_when
    from infertrace.replay.capture import read_capture
    from infertrace.replay.compare import render_text
    from infertrace.replay.deployment import apply_settings, parse_setting, variant_name

    try:
        since_ns = parse_when(since) if since is not None else None
        until_ns = parse_when(until) if until is not None else None
        variant_settings = [[parse_setting(p) for p in text.split(",")] for text in set_ or ()]
        captured_settings = [parse_setting(p) for p in captured or ()]
        cost = _cost_params(cost_params) if cost_params is not None else {}
    except (ValueError, OSError) as e:
        raise fail(str(e)) from None
    if since_ns is not None and until_ns is not None and since_ns >= until_ns:
        raise fail(f"--since {since} is not before --until {until}")
    from infertrace.results.relations import open_reader

    try:
        with open_reader(store, since_ns, until_ns) as opened:
            if not opened.segments:
                raise fail(f"--store {store}: the store holds no spans (ingest traces first)")
            if model is None:
                models = [m for (m,) in opened.sql("SELECT DISTINCT model FROM requests WHERE model IS NOT NULL "
                                                   "ORDER BY 1").fetchall()]
                if not models:
                    raise fail(f"--store {store}: no engine request span names a model: there is no traffic to "
                               "replay (infertrace report says what the store holds)")
                if len(models) != 1:
                    raise fail(f"--model is needed: the store holds {len(models)} models ({', '.join(models)})")
                model = models[0]
            with err.status(f"Reading {model}'s traffic from {store} …"):
                capture = read_capture(opened, model, since_ns, until_ns)
            if calibrate:
                if cost:
                    raise fail("give either --calibrate or --cost-params, not both")
                capture = replace(capture, deployment=apply_settings(capture.deployment, captured_settings))
                with err.status(f"Fitting the cost model to {model}'s measured steps …"):
                    capture, sentence = calibrate_from_capture(opened, capture)
                err.print(sentence)
    except (OSError, ValueError) as e:  # no such directory; a bad URL; ClickHouse unreachable or failing
        raise fail(f"--store {store}: {e}") from None
    try:
        base = capture.deployment if calibrate else apply_settings(capture.deployment, captured_settings)
        if cost:
            base = replace(base, cost=cost)
        capture = replace(capture, deployment=base)
        variants: list[tuple[str, Deployment]] = [(variant_name(s), apply_settings(base, s))
                                                   for s in variant_settings]
    except (ValueError, TypeError) as e:
        raise fail(str(e)) from None
    try:
        with err.status(f"Replaying {len(capture.requests)} requests × {1 + len(variants)} configs …"):
            result = what_if(capture, variants, calibrated=bool(cost) or calibrate, seed=seed)
    except ValueError as e:
        hint = ("" if capture.config_source == "spans" else
                f" (the spans of {model} carry no engine configuration: say the captured one with --captured, "
                "e.g. --captured tensor_parallel=2 --captured hardware=H100-SXM)")
        raise fail(f"{e}{hint}") from None
    print(render_text(result), end="")
    if save and is_clickhouse_url(store):
        err.print("note: the result is not kept: --store is ClickHouse (use --json, or `ingest --from` a local store)")
    elif save:
        from infertrace.replay.saved import save_whatif

        try:
            err.print(f"kept in {save_whatif(Path(store), result.to_json())}")
        except OSError as e:
            err.print(f"note: the result could not be kept in the store ({e})")
    if json_out is not None:
        try:
            json_out.write_text(json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8")
        except OSError as e:
            raise fail(f"--json {json_out}: {e}") from None


def whatif_section() -> tuple[Evaluator, Callable[[dict[str, Any]], str]]:
    """`infertrace evaluate`'s whatif section: the evaluator with the reference engine as its replayer."""
    from infertrace.evaluation.whatif import evaluate_whatif, render_whatif

    return (lambda bank, pool: evaluate_whatif(bank, replay_distribution, calibrate_from_capture, pool)), render_whatif
