"""The report as one JSON-ready document (schema `infertrace.report/2`, `schema.json`, docs/report.md), built
from the analyzers' results. Every renderer (table, markdown, html, json) renders this document; nothing
here computes a statistic: numbers are copied from analyzer results, converted to milliseconds and rounded.

    doc = build_report(store, ReportOptions(since_ns=..., model="llama-3-8b"))
    exit_code = 1 if severity_at_least(doc["severity"], "warning") else 0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from infertrace.analyzers.anomalies import METRICS
from infertrace.analyzers.slo import DEFAULT_TARGETS, UNCHECKED, SloSummary, SloTarget, slo_summary
from infertrace.report.recommendations import recommend

if TYPE_CHECKING:
    from infertrace.analyzers.itl import ItlAnalysis
    from infertrace.analyzers.itl_iterations import IterationAttribution
    from infertrace.analyzers.itl_requests import RequestOnlyAttribution
    from infertrace.analyzers.prefix_cache import PrefixCacheAnalysis
    from infertrace.analyzers.rca import RcaReport
    from infertrace.analyzers.roofline import RooflineAnalysis
    from infertrace.analyzers.ttft import TtftAnalysis
    from infertrace.sources.capabilities import StoreCoverage
    from infertrace.store.store import Store

SCHEMA_ID = "infertrace.report/2"
SEVERITIES = ("ok", "info", "warning", "critical")
SECTIONS = ("slo", "incidents", "itl", "ttft", "prefix_cache", "prefill_throughput")
@dataclass(frozen=True)
class ReportOptions:
    since_ns: int | None = None
    until_ns: int | None = None
    model: str | None = None
    tenant: str | None = None
    targets: tuple[SloTarget, ...] = DEFAULT_TARGETS
    critical_ratio: float = 2.0
    top: int = 5  # rows per list (culprits, stalls, causes)
    sections: tuple[str, ...] = field(default=SECTIONS)


def severity_at_least(severity: str, level: str) -> bool:
    return SEVERITIES.index(severity) >= SEVERITIES.index(level)


def iso(ns: int | None) -> str | None:
    """UTC ISO 8601 with nanoseconds, e.g. 2026-01-01T00:00:30.123456789Z."""
    if ns is None:
        return None
    seconds, rest = divmod(int(ns), 10**9)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{rest:09d}Z"


def ms(ns: float | None, digits: int = 3) -> float | None:
    return None if ns is None else round(float(ns) / 1e6, digits)


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


# ------------------------------------------------------------------------------------------ sections
def slo_section(summary: SloSummary) -> dict[str, Any]:
    def pct(p: Any) -> dict[str, Any]:
        return {"count": p.count, "p50": _r(p.p50_ms, 3), "p95": _r(p.p95_ms, 3), "p99": _r(p.p99_ms, 3)}

    return {
        "status": "ok",
        "first_arrival": iso(summary.start_ns),
        "last_finish": iso(summary.end_ns),
        "critical_ratio": summary.critical_ratio,
        "targets": [{"key": t.key, "metric": t.metric, "quantile": t.quantile, "threshold": t.threshold}
                    for t in summary.targets],
        "models": [{
            "model": m.model,
            "severity": m.severity,
            "gateway_requests": m.gateway_requests,
            "engine_requests": m.engine_requests,
            "errors": m.errors,
            "rejected_429": m.rejected,
            "error_rate": _r(m.error_rate, 6),
            "rejected_rate": _r(m.rejected_rate, 6),
            "ttft_ms": pct(m.ttft),
            "itl_ms": pct(m.itl),
            "e2e_ms": pct(m.e2e),
            "checks": [{"key": c.target.key, "threshold": c.target.threshold,
                        "observed": _r(c.observed, 6), "severity": c.severity} for c in m.checks],
            # targets the store holds nothing to check against for this model, and why: never read as met
            "unchecked": [{"key": c.target.key, "why": UNCHECKED[c.target.metric]} for c in m.unchecked],
        } for m in summary.models],
    }


def _overlaps(start: int, end: int, options: ReportOptions) -> bool:
    return ((options.until_ns is None or start < options.until_ns)
            and (options.since_ns is None or end >= options.since_ns))


def incidents_section(rca: RcaReport, options: ReportOptions) -> dict[str, Any]:
    out = []
    for d in rca.diagnoses:
        inc = d.incident
        if not _overlaps(inc.onset_ns, inc.end_ns, options):
            continue
        if options.model is not None and options.model not in inc.models:
            continue
        top_lift = d.commonality.top() if d.commonality is not None else None
        out.append({
            "id": inc.id,
            "onset": iso(inc.onset_ns),
            "end": iso(inc.end_ns),
            "models": list(inc.models),
            "tenants": list(inc.tenants),
            "severity_score": _r(inc.severity, 3),
            "summary": inc.sentence(),
            "requests_in_window": d.requests,
            "anomalous_requests": d.anomalous_requests,
            "explained": d.explained,
            "anomalies": [{"model": a.key, "onset": iso(a.onset_ns), "end": iso(a.end_ns), "metric": a.metric,
                           "peak_score": _r(a.peak_score, 3),
                           "shifts": [{"metric": s.metric, "baseline": _r(s.baseline, 4),
                                       "observed": _r(s.observed, 4), "score": _r(s.score, 3),
                                       "phrase": s.phrase()} for s in a.shifts]}
                          for a in inc.anomalies],
            "causes": [{
                "rank": c.rank,
                "id": c.candidate.id,
                "kind": c.candidate.kind,
                "shared": c.candidate.shared,
                "models_served": list(c.candidate.models),
                "score": _r(c.score, 4),
                "ochiai": _r(c.ochiai, 4),
                "e_f": c.e_f, "n_f": c.n_f, "e_p": c.e_p,
                "own_anomaly": {"signal": c.own.signal, "what": c.own.what, "score": _r(c.own.score, 4),
                                "share_before": _r(c.own.share_before, 4),
                                "share_during": _r(c.own.share_during, 4)},
                "sentence": c.sentence(),
                "evidence": list(c.evidence()),
            } for c in d.causes[:options.top]],
            "commonality": None if top_lift is None else top_lift.sentence(),
        })
    anomalies = rca.anomalies
    models = [m for m in anomalies.models() if options.model in (None, m)]
    unchecked = [{"metric": u.metric, "what": u.what(), "models": [m for m in u.models if m in models], "why": u.why}
                 for u in anomalies.unchecked]
    return {"status": "ok", "incidents": out, "models": models,
            "checked": [{"metric": m, "what": METRICS[m][2]} for m in anomalies.checked(models)],
            "unchecked": [u for u in unchecked if u["models"]]}


def itl_section(itl: ItlAnalysis, options: ReportOptions, tenants: dict[str, str | None]) -> dict[str, Any]:
    """ITL spikes attributed to prefills. Engines are the analyzer's whole-store summaries; stalls and
    culprits are those in the window, on the model's engines, and (with a tenant filter) with a culprit or
    victim of that tenant."""
    def selected(s: Any) -> bool:
        if not _overlaps(s.start_ns, s.end_ns, options):
            return False
        if options.model is not None and s.model != options.model:
            return False
        if options.tenant is not None:
            people = [c.tenant for c in s.culprits] + [tenants.get(v) for v in s.victims]
            return options.tenant in people
        return True

    stalls = [s for s in itl.stalls if selected(s)]
    in_window = {(c.request_id, s.instance) for s in stalls for c in s.culprits}
    culprits = [c for c in itl.culprits if (c.request_id, c.instance) in in_window]
    worst = sorted(stalls, key=lambda s: (-s.added_ns, s.end_ns, s.instance))[:options.top]
    engines = [e for e in itl.engines if options.model is None or e.model == options.model]
    return {
        "status": "ok",
        "stall_ratio": itl.params.stall_ratio,
        "min_excess_ms": ms(itl.params.min_excess_ns),
        "engines": [{
            "instance": e.instance, "model": e.model, "policy": e.policy, "tokens": e.tokens,
            "itl_p50_ms": ms(e.itl_p50_ns), "itl_p99_ms": ms(e.itl_p99_ns),
            "decode_step_p50_ms": ms(e.decode_step_p50_ns), "stalls": dict(sorted(e.stalls.items())),
            "unexplained_spikes": e.unexplained_spikes,
            "prefill_share_of_p99": _r(e.prefill_share_of_p99, 4),
            "itl_p99_without_prefill_ms": ms(e.itl_p99_without_prefill_ns),
            "chunk_budget_tokens": e.chunk_budget_tokens,
            "itl_p99_with_chunk_budget_ms": ms(e.itl_p99_with_chunk_budget_ns),
        } for e in engines],
        "stalls": len(stalls),
        "stalls_by_cause": {cause: sum(cause in s.causes for s in stalls) for cause in ("prefill", "recompute",
                                                                                         "host_pause")},
        "top_culprits": [{
            "request_id": c.request_id, "tenant": c.tenant, "instance": c.instance,
            "prompt_tokens": c.prompt_tokens, "cached_tokens": c.cached_tokens, "chunk_tokens": c.chunk_tokens,
            "stalls": c.stalls, "victims": c.victims, "stall_ms": ms(c.stall_ns),
            "victim_stall_ms": ms(c.victim_stall_ns), "recompute": c.recompute,
        } for c in culprits[:options.top]],
        "worst_stalls": [{
            "instance": s.instance, "model": s.model, "step_index": s.step_index, "end": iso(s.end_ns),
            "duration_ms": ms(s.duration_ns), "decode_only_ms": ms(s.decode_only_ns), "added_ms": ms(s.added_ns),
            "causes": list(s.causes), "culprits": [c.request_id for c in s.culprits], "victims": len(s.victims),
        } for s in worst],
    }


REQUEST_METHODS = {"client_tokens": "request spans + client token times", "tokens": "request spans + token spans",
                   "joined": "request spans + client token times + iteration log"}


def itl_request_section(attr: RequestOnlyAttribution, token_source: str, models: dict[str, str | None],
                        options: ReportOptions, tenants: dict[str, str | None]) -> dict[str, Any]:
    """ITL stalls named by the request-only method (no step spans): windows on each instance, the prefills that
    overlapped them with a confidence each, and the windows no prefill explains."""
    def selected(s: Any) -> bool:
        if not _overlaps(s.start_ns, s.end_ns, options):
            return False
        if options.model is not None and models.get(s.instance) != options.model:
            return False
        if options.tenant is not None:
            return options.tenant in [c.tenant for c in s.culprits] + [tenants.get(v) for v in s.victims]
        return True

    stalls = [s for s in attr.stalls if selected(s)]
    culprits: dict[tuple[str, str], dict[str, Any]] = {}
    for s in stalls:
        for c in s.culprits:
            entry = culprits.setdefault((c.request_id, s.instance), {
                "request_id": c.request_id, "tenant": c.tenant, "instance": s.instance,
                "uncached_tokens": c.uncached_tokens, "stalls": 0, "victims": set(), "victim_excess_ns": 0,
                "confidence": 0.0})
            entry["stalls"] += 1
            entry["victims"] |= set(s.victims)
            entry["victim_excess_ns"] += s.excess_ns * len(s.victims)
            entry["confidence"] = max(entry["confidence"], c.confidence)
    top = sorted(culprits.values(), key=lambda c: (-c["victim_excess_ns"], c["request_id"]))[:options.top]
    worst = sorted(stalls, key=lambda s: (-s.excess_ns, s.end_ns, s.instance))[:options.top]
    instances = sorted({s.instance for s in stalls} | set(attr.decode_baseline_ns))
    return {
        "status": "ok",
        "method": REQUEST_METHODS[token_source],
        "clock_offset_ms": ms(attr.clock_offset_ns) if attr.clock.startswith("client") else None,
        "timing_noise_ms": ms(attr.timing_noise_ns),
        "tolerance_ms": ms(attr.tolerance_ns),
        "stall_ratio": attr.params.stall_ratio,
        "min_excess_ms": ms(attr.params.min_excess_ns),
        "requests_with_token_times": attr.requests_with_token_times,
        "engines": [{
            "instance": i, "model": models.get(i), "decode_baseline_ms": ms(attr.decode_baseline_ns.get(i)),
            "stalls_with_culprit": sum(1 for s in stalls if s.instance == i and s.culprits),
            "unexplained": sum(1 for s in stalls if s.instance == i and not s.culprits),
        } for i in instances if options.model is None or models.get(i) == options.model],
        "stalls": sum(1 for s in stalls if s.culprits),
        "unexplained": sum(1 for s in stalls if not s.culprits),
        "top_culprits": [{
            "request_id": c["request_id"], "tenant": c["tenant"], "instance": c["instance"],
            "uncached_tokens": c["uncached_tokens"], "stalls": c["stalls"], "victims": len(c["victims"]),
            "victim_excess_ms": ms(c["victim_excess_ns"]), "confidence": _r(c["confidence"], 3),
        } for c in top],
        "worst_stalls": [{
            "instance": s.instance, "start": iso(s.start_ns), "end": iso(s.end_ns),
            "window_ms": ms(s.end_ns - s.start_ns), "excess_ms": ms(s.excess_ns), "victims": len(s.victims),
            "culprits": [{"request_id": c.request_id, "confidence": _r(c.confidence, 3)} for c in s.culprits],
        } for s in worst],
        "notes": list(attr.notes),
    }


def itl_iteration_section(attr: IterationAttribution, options: ReportOptions) -> dict[str, Any]:
    """ITL stalls named from vLLM's iteration log alone (no step spans, no token times): the stalled iterations,
    placed on the spans' clock, and the requests whose prefill was in them."""
    stalls = [s for s in attr.stalls if _overlaps(s.end_ns - s.elapsed_ns, s.end_ns, options)]
    worst = sorted(stalls, key=lambda s: (-s.excess_ns, s.end_ns))[:options.top]
    culprits: dict[str, dict[str, Any]] = {}
    for s in stalls:
        for c in s.culprits:
            entry = culprits.setdefault(c.request_id, {"request_id": c.request_id, "tenant": c.tenant,
                                                       "instance": s.instance, "uncached_tokens": c.uncached_tokens,
                                                       "stalls": 0, "victims": 0, "victim_excess_ns": 0,
                                                       "confidence": 0.0})
            entry["stalls"] += 1
            entry["victims"] = max(entry["victims"], s.generation_requests)
            entry["victim_excess_ns"] += s.excess_ns * max(s.generation_requests, 1)
            entry["confidence"] = max(entry["confidence"], c.confidence)
    top = sorted(culprits.values(), key=lambda c: (-c["victim_excess_ns"], c["request_id"]))[:options.top]
    return {
        "status": "ok",
        "method": "request spans + iteration log",
        "clock_offset_ms": None, "timing_noise_ms": None, "tolerance_ms": None,
        "stall_ratio": attr.params.stall_ratio,
        "min_excess_ms": ms(attr.params.min_excess_ns),
        "requests_with_token_times": 0,
        "engines": [{"instance": lg.instance or lg.log, "model": None, "decode_baseline_ms": None,
                     "stalls_with_culprit": sum(1 for s in stalls if s.log == lg.log and s.culprits),
                     "unexplained": sum(1 for s in stalls if s.log == lg.log and not s.culprits)}
                    for lg in attr.logs],
        "stalls": sum(1 for s in stalls if s.culprits),
        "unexplained": sum(1 for s in stalls if not s.culprits),
        "top_culprits": [{**{k: v for k, v in c.items() if k != "victim_excess_ns"},
                          "victim_excess_ms": ms(c["victim_excess_ns"]), "confidence": _r(c["confidence"], 3)}
                         for c in top],
        "worst_stalls": [{
            "instance": s.instance, "start": iso(s.end_ns - s.elapsed_ns), "end": iso(s.end_ns),
            "window_ms": ms(s.elapsed_ns), "excess_ms": ms(s.excess_ns), "victims": s.generation_requests,
            "culprits": [{"request_id": c.request_id, "confidence": _r(c.confidence, 3)} for c in s.culprits],
        } for s in worst],
        "notes": list(attr.notes) + [f"log {lg.log}: placed on {lg.instance} by {lg.matched} of "
                                     f"{lg.prefill_iterations} prefill iterations, offset {ms(lg.offset_ns)} ms"
                                     for lg in attr.logs if lg.offset_ns is not None],
    }


def ttft_section(ttft: TtftAnalysis, options: ReportOptions) -> dict[str, Any]:
    """The TTFT analyzer's decomposition per model and prefill fit per engine (whole store; model filter)."""
    def keep(model: str | None) -> bool:
        return options.model is None or model == options.model

    return {
        "status": "ok",
        "models": [{"model": m.model, "requests": m.requests, "ttft_p50_ms": ms(m.ttft_p50_ns),
                    "ttft_p99_ms": ms(m.ttft_p99_ns), "shares": {k: _r(v, 4) for k, v in m.shares.items()},
                    "dominant": m.dominant} for m in ttft.models if keep(m.model)],
        "prefill_fits": [{"instance": f.instance, "model": f.model, "requests": f.requests,
                          "intercept_ms": ms(f.intercept_ns), "us_per_token": _r(f.ns_per_token / 1e3, 4),
                          "ns_per_attention_pair": _r(f.ns_per_attention_pair, 6),
                          "tokens_per_s": _r(f.tokens_per_s, 1),
                          "median_relative_error": _r(f.median_relative_error, 4)}
                         for f in ttft.fits if keep(f.model)],
        "disaggregated": [{"model": d.model, "requests": d.requests, "unmatched": d.unmatched,
                           "kv_transfer_p50_ms": ms(d.kv_transfer_p50_ns),
                           "kv_transfer_p99_ms": ms(d.kv_transfer_p99_ns),
                           "kv_share_of_ttft": d.kv_share_of_ttft, "decode_queue_p50_ms": ms(d.decode_queue_p50_ns),
                           "first_decode_p50_ms": ms(d.first_decode_p50_ns), "links": list(d.links)}
                          for d in ttft.disaggregation.models if keep(d.model)],
        "gpu_prefill_host": [{"model": g.model, "instances": list(g.instances), "hardware": g.hardware,
                              "requests": g.requests, "prompts": g.prompts, "ttft_p50_ms": ms(g.ttft_p50_ns),
                              "prefill_p50_ms": ms(g.prefill_p50_ns), "gpu_hardware": g.gpu_hardware,
                              "link_gb_s": g.link_gb_s, "link_latency_ms": g.link_latency_ms,
                              "step_budget_tokens": g.step_budget_tokens,
                              "predicted_ttft_p50_ms": ms(g.predicted_ttft_p50_ns),
                              "predicted_prefill_p50_ms": ms(g.predicted_prefill_p50_ns),
                              "predicted_wait_ms": ms(g.predicted_wait_ns), "gpu_utilization": g.gpu_utilization,
                              "kv_transfer_p50_ms": ms(g.kv_transfer_p50_ns), "decode_step_ms": ms(g.decode_step_ns),
                              "prefill_saved_p50_ms": ms(g.prefill_saved_p50_ns)}
                             for g in ttft.disaggregation.gpu_prefill if keep(g.model)],
        "not_estimated": list(ttft.disaggregation.not_estimated),
    }


def prefix_cache_section(cache: PrefixCacheAnalysis, options: ReportOptions) -> dict[str, Any]:
    """The prefix-cache analyzer's hit rates, cache busting and billing (whole store; tenant filter on the
    busting list and the tenant groups)."""
    def groups(items: tuple[Any, ...], tenant_keyed: bool = False) -> list[dict[str, Any]]:
        return [{"key": g.key, "requests": g.requests, "input_tokens": g.input_tokens,
                 "cached_tokens": g.cached_tokens, "hit_rate": _r(g.hit_rate, 4)} for g in items
                if not tenant_keyed or options.tenant is None or g.key == options.tenant]

    b = cache.billing
    tiers: dict[str, Any] = {}
    if cache.by_tier:  # only engines with a KV tier or reuse accounting say where their hits came from
        tiers["kv_tiers"] = [{
            "instance": t.instance, "model": t.model, "requests": t.requests, "input_tokens": t.input_tokens,
            "hit_rate": _r(t.hit_rate, 4), "gpu_hit_rate": _r(t.device_hit_rate, 4),
            "host_hit_rate": _r(t.host_hit_rate, 4), "remote_hit_rate": _r(t.remote_hit_rate, 4),
            "gpu_blocks": t.gpu_blocks, "host_tier_blocks": t.host_tier_blocks,
            "remote_tier_blocks": t.remote_tier_blocks, "copy_s": _r(t.load_s, 4), "evicted_tokens": t.evicted_tokens,
            "more_capacity": [{"extra_blocks": c.extra_blocks, "extra_gb": _r(c.extra_gb, 3),
                               "hit_rate": _r(c.hit_rate, 4)} for c in cache.capacity if c.instance == t.instance],
        } for t in cache.by_tier]
        tiers["kv_tiers_not_analysed"] = list(cache.tiers_not_analysed)
    return {
        "status": "ok",
        "block_size": cache.block_size,
        "by_tenant": groups(cache.by_tenant, tenant_keyed=True),
        "by_model": groups(cache.by_model),
        "by_system_prompt": groups(cache.by_system_prompt),
        "busting": [{"tenant": x.tenant, "system_prompt_id": x.system_prompt_id,
                     "system_prompt_tokens": x.system_prompt_tokens, "start": iso(x.start_ns), "end": iso(x.end_ns),
                     "requests": x.requests, "full_hits": x.full_hits, "full_hit_rate": _r(x.full_hit_rate, 4),
                     "other_tenants_full_hit_rate": _r(x.other_tenants_full_hit_rate, 4),
                     "lost_cached_tokens": x.lost_cached_tokens, "lost_savings": _r(x.lost_savings, 4)}
                    for x in cache.busting if options.tenant is None or x.tenant == options.tenant],
        "busting_unchecked": cache.busting_unchecked,
        "uncounted": [{"model": m, "requests": n} for m, n in cache.uncounted],
        "billing": {"input_tokens": b.input_tokens, "cached_tokens": b.cached_tokens,
                    "output_tokens": b.output_tokens, "cost": _r(b.cost, 4),
                    "cost_without_cache": _r(b.cost_without_cache, 4), "savings": _r(b.savings, 4)},
        **tiers,
    }


def prefill_throughput_section(roofline: RooflineAnalysis, options: ReportOptions) -> dict[str, Any]:
    """The roofline analyzer's measured prefill throughput per engine against the hardware's roofline."""
    return {
        "status": "ok",
        "engines": [{"instance": e.instance, "model": e.model, "hardware": e.hardware,
                     "tensor_parallel": e.tensor_parallel, "microbatch_tokens": e.microbatch_tokens,
                     "steps": e.steps, "median_step_tokens": e.median_step_tokens,
                     "measured_tokens_per_s": _r(e.measured_tokens_per_s, 1),
                     "predicted_tokens_per_s": _r(e.predicted_tokens_per_s, 1),
                     "unbatched_tokens_per_s": _r(e.unbatched_tokens_per_s, 1), "ridge_tokens": e.ridge_tokens,
                     "diagnosis": e.diagnosis, "recommended_microbatch_tokens": e.recommended_microbatch_tokens,
                     "fix_tokens_per_s": _r(e.fix_tokens_per_s, 1), "evidence": e.evidence}
                    for e in roofline.engines if options.model is None or e.model == options.model],
    }


# ------------------------------------------------------------------------------------------ findings
def findings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """What the report flags, with the severity the analyzers gave it: SLO checks (warning/critical by the
    SLO analyzer's breach ratio), incidents (critical: the anomaly detector already scored them above its
    threshold), cache busting and a memory-bound prefill micro-batch (warning: the analyzers detected a
    misconfiguration), ITL stalls (info: evidence for the SLO findings, not an alarm by themselves)."""
    out: list[dict[str, Any]] = []
    sections = doc["sections"]
    slo = sections.get("slo", {})
    for m in slo.get("models", []):
        for c in m["checks"]:
            if c["severity"] not in ("ok", "unknown"):
                out.append({"id": f"slo:{m['model']}:{c['key']}", "severity": c["severity"], "section": "slo",
                            "title": f"{m['model']}: {c['key']} {c['observed']} exceeds the SLO of {c['threshold']}",
                            "evidence": {"observed": c["observed"], "threshold": c["threshold"]}})
    for inc in sections.get("incidents", {}).get("incidents", []):
        top = inc["causes"][0] if inc["explained"] else None
        title = inc["summary"] + (f" Most likely cause: {top['id']} ({top['kind']})." if top else
                                  " No traced component, engine or tenant's load explains it.")
        evidence: dict[str, Any] = {"models": len(inc["models"]), "severity_score": inc["severity_score"]}
        if top:
            evidence.update(cause=top["id"], score=top["score"], ochiai=top["ochiai"])
        out.append({"id": f"incident:{inc['id']}", "severity": "critical", "section": "incidents", "title": title,
                    "evidence": evidence})
    itl = sections.get("itl", {})
    if itl.get("status") == "ok" and "method" in itl and itl["stalls"]:
        top = itl["top_culprits"][0] if itl["top_culprits"] else None
        title = f"{itl['stalls']} stall windows with a culprit prefill ({itl['method']})"
        evidence = {"stalls": itl["stalls"], "unexplained": itl["unexplained"]}
        if top:
            tokens = ("prompt length unknown" if top["uncached_tokens"] is None else
                      f"{top['uncached_tokens']} uncached prompt tokens")
            title += (f"; worst culprit {top['request_id']} ({top['tenant']}, {tokens}, confidence "
                      f"{top['confidence']}) stalled {top['victims']} requests by {top['victim_excess_ms']} ms in "
                      "total")
            evidence.update(culprit=top["request_id"], victims=top["victims"], confidence=top["confidence"])
        out.append({"id": "itl:stalls", "severity": "info", "section": "itl", "title": title, "evidence": evidence})
    elif itl.get("status") == "ok" and itl["stalls"]:
        top = itl["top_culprits"][0] if itl["top_culprits"] else None
        title = f"{itl['stalls']} engine steps stalled decoding requests"
        evidence = {"stalls": itl["stalls"], **{f"stalls_{k}": v for k, v in itl["stalls_by_cause"].items()}}
        if top:
            title += (f"; worst culprit {top['request_id']} ({top['tenant']}, {top['chunk_tokens']} prompt tokens) "
                      f"stalled {top['victims']} requests by {top['victim_stall_ms']} ms in total")
            evidence.update(culprit=top["request_id"], victims=top["victims"], victim_stall_ms=top["victim_stall_ms"])
        out.append({"id": "itl:stalls", "severity": "info", "section": "itl", "title": title, "evidence": evidence})
    for x in sections.get("prefix_cache", {}).get("busting", []):
        out.append({"id": f"cache_busting:{x['tenant']}:{x['system_prompt_id']}", "severity": "warning",
                    "section": "prefix_cache",
                    "title": f"Tenant {x['tenant']} busts the prefix cache on {x['system_prompt_id']}: "
                             f"{x['full_hit_rate']:.0%} of {x['requests']} requests hit its whole blocks, against "
                             f"{_pct(x['other_tenants_full_hit_rate'])} for other tenants",
                    "evidence": {"full_hit_rate": x["full_hit_rate"], "requests": x["requests"],
                                 "lost_cached_tokens": x["lost_cached_tokens"], "lost_savings": x["lost_savings"]}})
    for e in sections.get("prefill_throughput", {}).get("engines", []):
        if e["diagnosis"] == "microbatch_memory_bound":
            out.append({"id": f"roofline:{e['instance']}", "severity": "warning", "section": "prefill_throughput",
                        "title": f"{e['instance']} prefills in micro-batches of {e['microbatch_tokens']} tokens, "
                                 f"below the ridge of {e['ridge_tokens']}: memory-bound ({e['evidence']})",
                        "evidence": {"microbatch_tokens": e["microbatch_tokens"], "ridge_tokens": e["ridge_tokens"],
                                     "measured_tokens_per_s": e["measured_tokens_per_s"]}})
    return out


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def check_selection(store: Store, options: ReportOptions) -> str | None:
    """Why `--model`/`--tenant` select nothing (naming the known values and the closest ones), or None."""
    import difflib

    from infertrace.analyzers import query_text

    known: dict[str, list[str]] = {"model": [], "tenant": []}
    for what, value in store.sql(query_text("selection_values")).fetchall():
        known[what].append(str(value))
    for what, wanted in (("model", options.model), ("tenant", options.tenant)):
        if wanted is None or wanted in known[what]:
            continue
        values = known[what]
        close = difflib.get_close_matches(wanted, values, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        listed = ", ".join(values[:20]) + (f" (and {len(values) - 20} more)" if len(values) > 20 else "")
        return (f"--{what} {wanted!r} matches no request in the store.{hint} Known {what}s: "
                f"{listed or 'none (no span names one)'}.")
    return None


def coverage_section(coverage: StoreCoverage) -> dict[str, Any]:
    """What the store holds and which analyses it supports (infertrace.sources.capabilities)."""
    q = coverage.quarantine
    return {
        "sources": dict(coverage.sources),
        "gateway_requests": coverage.entry_requests,
        "gateway_requests_without_model": coverage.entries_without_model,
        "gateway_requests_model_from_client": coverage.entries_model_from_client,
        "gateway_requests_without_engine": coverage.entries_without_engine,
        "client_calls": coverage.client_calls,
        "component_calls": coverage.component_calls,
        "step_spans": coverage.step_spans,
        "summary": coverage.sentences(),
        "analyses": [{"key": a.key, "title": a.title, "supported": a.supported, "detail": a.detail}
                     for a in coverage.analyses],
        "quarantine": {"records": q.records, "reasons": [{"reason": r, "count": n} for r, n in q.reasons]},
        "stored_with_changes": coverage.stored_with_changes,
        "unreadable_segments": coverage.unreadable_segments,
        "clock_offsets": [{"model": f.model, "instances": list(f.instances), "offset_ms": round(f.offset_ns / 1e6, 3),
                           "at_least": f.at_least, "requests": f.requests, "sentence": f.sentence()}
                          for f in coverage.clock_offsets],
        "instances": [{"instance": p.instance, "processes": p.processes, "step_spans": p.step_spans,
                       "overlapping": p.overlapping, "repeated": p.repeated, "missing_steps": p.missing_steps,
                       "unseen_requests": p.unseen_requests,
                       "sentence": p.sentence()} for p in coverage.instance_problems],
        "environments": dict(coverage.environments),
        "aliases": [{"gateway_name": alias, "model": model, "requests": n} for alias, model, n in coverage.aliases],
        "propagation": [{"model": f.model, "instances": list(f.instances), "gateway_alone": f.gateway_alone,
                         "gateway_requests": f.gateway_requests, "engine_alone": f.engine_alone,
                         "engine_requests": f.engine_requests, "sentence": f.sentence()}
                        for f in coverage.propagation],
    }


def _unavailable(coverage: StoreCoverage, key: str) -> dict[str, Any] | None:
    """The section as unavailable, with the reason, when the store cannot support its analysis."""
    analysis = coverage.analysis(key)
    return None if analysis.supported else {"status": "unavailable", "reason": analysis.detail.rstrip(".")}


# ------------------------------------------------------------------------------------------ building
def build_report(store: Store, options: ReportOptions | None = None, *, rca: RcaReport | None = None,
                 itl: ItlAnalysis | None = None, ttft: TtftAnalysis | None = None,
                 cache: PrefixCacheAnalysis | None = None, roofline: RooflineAnalysis | None = None,
                 coverage: StoreCoverage | None = None, slo: SloSummary | None = None) -> dict[str, Any]:
    """The report document for the store. Analyzer results may be passed in when already computed (tests,
    the dashboard, materialised results); otherwise the analyzers run here. `slo` must be the summary for
    the options' window, model, tenant and targets. An analysis the store cannot support (infertrace.sources.
    capabilities: no step spans for ITL attribution, no cached-token counts for the prefix cache) is reported
    unavailable with the reason, never as an empty result."""
    from infertrace.analyzers.itl_requests import attribute_store_requests, token_source
    from infertrace.sources.capabilities import store_coverage

    o = options or ReportOptions()
    coverage = coverage or store_coverage(store)
    sections: dict[str, Any] = {}
    if "slo" in o.sections:
        sections["slo"] = slo_section(slo or slo_summary(
            store, since_ns=o.since_ns, until_ns=o.until_ns, model=o.model, tenant=o.tenant, targets=o.targets,
            critical_ratio=o.critical_ratio))
    if "incidents" in o.sections:
        if rca is None:
            from infertrace.analyzers.rca import analyze_incidents

            rca = analyze_incidents(store)
        sections["incidents"] = incidents_section(rca, o)
    if "itl" in o.sections and (unavailable := _unavailable(coverage, "itl")) is not None:
        sections["itl"] = unavailable
    elif "itl" in o.sections and not coverage.step_spans and (source := token_source(store)) is not None:
        # without step spans, the best method the store's inputs allow (measured: BENCHMARKS.md, ITL inputs)
        attr = attribute_store_requests(store, tokens=source)
        if source == "client_tokens" and coverage.iteration_lines:
            from infertrace.analyzers.itl_iterations import attribute_store_iterations, join_iterations

            attr, source = join_iterations(attr, attribute_store_iterations(store)), "joined"
        models = dict(store.sql("SELECT instance, any_value(model) FROM request_legs GROUP BY instance").fetchall())
        tenants = dict(store.sql("SELECT request_id, tenant FROM requests").fetchall()) if o.tenant else {}
        sections["itl"] = itl_request_section(attr, source, models, o, tenants)
    elif "itl" in o.sections and not coverage.step_spans and coverage.iteration_lines:
        from infertrace.analyzers.itl_iterations import attribute_store_iterations

        sections["itl"] = itl_iteration_section(attribute_store_iterations(store), o)
    elif "itl" in o.sections:
        if itl is None:
            from infertrace.analyzers.itl import analyze_itl

            itl = analyze_itl(store)
        tenants = dict(store.sql("SELECT request_id, tenant FROM requests").fetchall()) if o.tenant else {}
        sections["itl"] = itl_section(itl, o, tenants)
    if "ttft" in o.sections:
        from infertrace.analyzers.ttft import analyze_ttft

        sections["ttft"] = ttft_section(ttft or analyze_ttft(store), o)
    if "prefix_cache" in o.sections and (unavailable := _unavailable(coverage, "prefix_cache")) is not None:
        sections["prefix_cache"] = unavailable
    elif "prefix_cache" in o.sections:
        from infertrace.analyzers.prefix_cache import analyze_prefix_cache

        sections["prefix_cache"] = prefix_cache_section(cache or analyze_prefix_cache(store), o)
    if "prefill_throughput" in o.sections and (unavailable := _unavailable(coverage, "prefill_throughput")):
        sections["prefill_throughput"] = unavailable
    elif "prefill_throughput" in o.sections:
        from infertrace.analyzers.roofline import analyze_prefill_roofline

        sections["prefill_throughput"] = prefill_throughput_section(roofline or analyze_prefill_roofline(store), o)
    extent = store.sql("SELECT min(start_ns), max(end_ns), count(*) FROM spans").fetchall()[0]
    doc: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "store": {"segments": len(store.segments), "spans": int(extent[2]), "first_span": iso(extent[0]),
                  "last_span": iso(extent[1])},
        "selection": {"since": iso(o.since_ns), "until": iso(o.until_ns), "model": o.model, "tenant": o.tenant},
        "coverage": coverage_section(coverage),
        "sections": sections,
    }
    if (window_s := getattr(store, "window_s", None)) is not None:  # what an analysis window left out
        doc["store"]["analysis_window_s"] = window_s
        doc["store"]["segments_left_out"] = store.segments_left_out()
    doc["findings"] = findings(doc)
    doc["severity"] = max((f["severity"] for f in doc["findings"]), key=SEVERITIES.index, default="ok")
    from infertrace.replay.saved import load_whatifs

    doc["recommendations"] = recommend(doc, load_whatifs(store.root))
    return doc
