"""The report document laid out as blocks (headings, paragraphs, tables) that every text format renders the
same way. Layout chooses columns and wording; the numbers are the document's, unchanged."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from infertrace.report.recommendations import unevaluated
from infertrace.store.store import window_phrase


@dataclass(frozen=True)
class Heading:
    text: str
    level: int  # 1: report, 2: section


@dataclass(frozen=True)
class Paragraph:
    text: str
    severity: str | None = None  # shown as a marker/colour when set


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    severities: tuple[str | None, ...] = ()  # per row, for colouring


Block = Heading | Paragraph | Table

TITLES = {
    "slo": "Fleet SLO summary",
    "incidents": "Incidents and ranked causes",
    "itl": "ITL spikes and their culprit prefills",
    "ttft": "TTFT decomposition",
    "prefix_cache": "Prefix cache and billing",
    "prefill_throughput": "Prefill throughput against the roofline",
}


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"
    if isinstance(value, list | tuple):
        return ", ".join(cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {cell(v)}" for k, v in value.items())
    return str(value)


def _selection(doc: dict[str, Any]) -> str:
    sel = doc["selection"]
    parts = [f"{k} {v}" for k, v in sel.items() if v is not None]
    store = doc["store"]
    scope = f"store of {store['spans']} spans in {store['segments']} segments, {store['first_span']} to " \
            f"{store['last_span']}"
    if store.get("analysis_window_s") is not None:
        scope += (f" (an analysis window: {window_phrase(store['analysis_window_s'])}; "
                  f"{store['segments_left_out']} older segments left out)")
    return f"{scope}; selection: {', '.join(parts) if parts else 'everything'}."


def slo_source(gateway_requests: Mapping[str, int], apart: Collection[str]) -> str:
    """Where the SLO summary's TTFT and E2E run from, given each model's requests the gateway answered and the
    models whose engines' traces are apart from the gateway's (coverage.propagation)."""
    through = sum(1 for model, n in gateway_requests.items() if n and model not in apart)
    return ("from the gateway to the first/last token" if through == len(gateway_requests) else
            "from the engine's request span to the first/last token (no gateway entry span)" if not through
            else "from the gateway to the first/last token where its entry spans are in the store, else from the "
                 "engine's request span")


def _slo(section: dict[str, Any], apart: set[str]) -> list[Block]:
    """`apart`: models whose engines' traces are apart from the gateway's (coverage.propagation)."""
    targets = ", ".join(f"{t['key']} ≤ {cell(t['threshold'])}" for t in section["targets"])
    source = slo_source({m["model"]: m["gateway_requests"] for m in section["models"]}, apart)
    blocks: list[Block] = [Paragraph(f"Targets: {targets}; critical at {cell(section['critical_ratio'])}× a "
                                     f"target. TTFT and E2E {source}.")]
    rows, sev = [], []
    for m in section["models"]:
        rows.append((m["model"], m["severity"], m["gateway_requests"], m["engine_requests"],
                     m["ttft_ms"]["p50"], m["ttft_ms"]["p95"], m["ttft_ms"]["p99"],
                     m["itl_ms"]["p50"], m["itl_ms"]["p95"], m["itl_ms"]["p99"],
                     m["e2e_ms"]["p50"], m["e2e_ms"]["p99"], m["error_rate"], m["rejected_rate"]))
        sev.append(m["severity"])
    blocks.append(Table(("model", "slo", "gateway req", "engine req", "ttft p50 ms", "ttft p95 ms", "ttft p99 ms",
                         "itl p50 ms", "itl p95 ms", "itl p99 ms", "e2e p50 ms", "e2e p99 ms", "error rate",
                         "429 rate"), tuple(rows), tuple(sev)))
    # a target with nothing to check it against is said so, per reason, so that "ok" is not read as met
    unchecked: dict[str, dict[str, list[str]]] = {}  # why -> key -> models
    for m in section["models"]:
        for u in m.get("unchecked", ()):
            unchecked.setdefault(u["why"], {}).setdefault(u["key"], []).append(m["model"])
    everyone = len(section["models"])

    def which(models: list[str]) -> str:
        return "every model" if len(models) == everyone else ", ".join(models)

    said = ["; ".join(f"{key} ({which(models)})" for key, models in keys.items()) + f": {why}"
            for why, keys in unchecked.items()]
    if said:
        blocks.append(Paragraph("Not checked, for lack of data (the slo column is the worst of the checks made): "
                                + ". ".join(said) + "."))
    return blocks


def unchecked_sentence(unchecked: list[dict[str, Any]], models: int) -> str:
    """The metrics detection could not score, per reason ('' when it scored every one)."""
    def which(names: list[str]) -> str:
        return "every model" if len(names) >= models else ", ".join(names)

    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # the same reason for the same models: one sentence
    for u in unchecked:
        grouped.setdefault((u["why"], tuple(u["models"])), []).append(u["what"])
    return " ".join(f"Not checked: {', '.join(whats)} ({which(list(names))}): {why}."
                    for (why, names), whats in grouped.items())


def no_incident_sentence(checked: list[dict[str, Any]]) -> str:
    """"No incident", saying which metrics that covers: only those scored."""
    if not checked:
        return "No incident found, but no metric could be scored: nothing here says the fleet was healthy."
    names = [c["what"] for c in checked]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return f"No incident: no model's {listed} departed from its own baseline."


def _incidents(section: dict[str, Any]) -> list[Block]:
    caveat = unchecked_sentence(section["unchecked"], len(section["models"]))
    if not section["incidents"]:
        return [Paragraph(no_incident_sentence(section["checked"]))] + ([Paragraph(caveat, "warning")] if caveat
                                                                          else [])
    blocks: list[Block] = []
    for inc in section["incidents"]:
        blocks.append(Paragraph(inc["summary"], "critical"))
        for a in inc["anomalies"]:
            blocks.append(Paragraph(f"{a['model']}: " + "; ".join(s["phrase"] for s in a["shifts"])))
        rows = tuple((c["rank"], c["id"], c["kind"], c["score"], c["ochiai"], c["own_anomaly"]["score"],
                      c["own_anomaly"]["what"], f"{c['e_f']}/{c['e_f'] + c['n_f']}", c["e_p"])
                     for c in inc["causes"])
        blocks.append(Table(("rank", "candidate", "kind", "score", "ochiai", "own anomaly", "signal",
                             "anomalous covered", "normal through"), rows))
        if inc["explained"]:
            blocks.append(Paragraph("Evidence for #1: " + " ".join(inc["causes"][0]["evidence"])))
        else:
            blocks.append(Paragraph("Unexplained: no traced component, engine or tenant's load accounts for this "
                                    "incident's troubled requests (every score is 0); the candidates are listed "
                                    "by what passed through them, not as causes.", "warning"))
        if inc["commonality"]:
            blocks.append(Paragraph(inc["commonality"]))
    if caveat:
        blocks.append(Paragraph(caveat, "warning"))
    return blocks


def _itl_windows(section: dict[str, Any]) -> list[Block]:
    clock = ""
    if section["clock_offset_ms"] is not None:
        clock = (f" Client clock: {cell(section['clock_offset_ms'])} ms behind the spans, timing noise "
                 f"{cell(section['timing_noise_ms'])} ms (estimated from the data).")
    blocks: list[Block] = [Paragraph(
        f"Method: {section['method']} (no engine step spans). {section['stalls']} stall windows with a culprit "
        f"prefill, {section['unexplained']} without one (a host pause, a preemption's recompute, or another cause "
        f"these inputs cannot see).{clock}")]
    blocks.append(Table(("engine", "model", "decode step ms", "stalls with culprit", "unexplained"),
                        tuple((e["instance"], e["model"], e["decode_baseline_ms"], e["stalls_with_culprit"],
                               e["unexplained"]) for e in section["engines"])))
    if section["top_culprits"]:
        blocks.append(Paragraph("Top culprit prefills (by delay handed to decoding requests):"))
        blocks.append(Table(
            ("culprit request", "tenant", "engine", "uncached tokens", "stalls", "victims", "victim ms total",
             "confidence"),
            tuple((c["request_id"], c["tenant"], c["instance"],
                   "unknown" if c["uncached_tokens"] is None else c["uncached_tokens"], c["stalls"], c["victims"],
                   c["victim_excess_ms"], c["confidence"]) for c in section["top_culprits"])))
    blocks += [Paragraph(note) for note in section["notes"]]
    return blocks


def _itl(section: dict[str, Any]) -> list[Block]:
    if "method" in section:
        return _itl_windows(section)
    by_cause = ", ".join(f"{k} {v}" for k, v in section["stalls_by_cause"].items())
    blocks: list[Block] = [Paragraph(
        f"{section['stalls']} stalled steps in the selection ({by_cause}). A step stalls its decoding requests "
        f"when it adds at least {cell(section['stall_ratio'])}× their decode-only step and at least "
        f"{cell(section['min_excess_ms'])} ms.")]
    blocks.append(Table(
        ("engine", "model", "policy", "itl p50 ms", "itl p99 ms", "decode step ms", "prefill stalls",
         "prefill share of p99", "p99 w/o prefill ms", "p99 with budget ms", "budget tokens"),
        tuple((e["instance"], e["model"], e["policy"], e["itl_p50_ms"], e["itl_p99_ms"], e["decode_step_p50_ms"],
               e["stalls"].get("prefill", 0), e["prefill_share_of_p99"], e["itl_p99_without_prefill_ms"],
               e["itl_p99_with_chunk_budget_ms"], e["chunk_budget_tokens"]) for e in section["engines"])))
    if section["top_culprits"]:
        blocks.append(Paragraph("Top culprit prefills (by delay handed to decoding requests):"))
        blocks.append(Table(
            ("culprit request", "tenant", "engine", "prompt tokens", "cached", "stalls", "victims", "engine ms added",
             "victim ms total"),
            tuple((c["request_id"], c["tenant"], c["instance"], c["prompt_tokens"], c["cached_tokens"], c["stalls"],
                   c["victims"], c["stall_ms"], c["victim_stall_ms"]) for c in section["top_culprits"])))
    if section["worst_stalls"]:
        blocks.append(Paragraph("Worst stalls:"))
        blocks.append(Table(
            ("end", "engine", "step", "duration ms", "decode-only ms", "added ms", "causes", "culprits", "victims"),
            tuple((s["end"], s["instance"], s["step_index"], s["duration_ms"], s["decode_only_ms"], s["added_ms"],
                   s["causes"], s["culprits"], s["victims"]) for s in section["worst_stalls"])))
    return blocks


_UNMEASURED = (  # a TTFT component no request of a model measured, and why
    (("gateway",), "gateway: no gateway span"),
    (("queue",), "queue: no engine queue time"),
    (("prefill_compute", "prefill_wait"), "prefill_compute, prefill_wait: no step spans, the whole prefill is then "
                                          "under prefill"),
    (("kv_transfer", "decode_queue", "first_decode"), "kv_transfer, decode_queue, first_decode: no disaggregated "
                                                      "request's two legs"),
)


def _ttft(section: dict[str, Any]) -> list[Block]:
    models = section["models"]
    unsplit = any(m["shares"].get("prefill") is not None for m in models)
    components = ("gateway", "queue", *(("prefill",) if unsplit else ()), "prefill_compute", "prefill_wait",
                  "kv_transfer", "decode_queue", "first_decode")
    gateway = [m for m in models if m["shares"].get("gateway") is not None]
    source = ("from the gateway" if len(gateway) == len(models) else
              "from the engine's arrival: no gateway span" if not gateway else
              "from the gateway where its spans are in the store, else from the engine's arrival")
    missing = {c for m in models for c, v in m["shares"].items() if v is None}
    why = [text for columns, text in _UNMEASURED if missing & set(columns)]
    unmeasured = f"; '-': not measured ({'; '.join(why)})" if why else ""
    blocks: list[Block] = [Paragraph(f"Share of summed TTFT per component, and the dominant one (TTFT {source}"
                                     f"{unmeasured}).")]
    blocks.append(Table(("model", "requests", "ttft p50 ms", "ttft p99 ms", *components, "dominant"),
                        tuple((m["model"], m["requests"], m["ttft_p50_ms"], m["ttft_p99_ms"],
                               *(m["shares"].get(c) for c in components), m["dominant"]) for m in models)))
    blocks.append(Paragraph("Prefill compute time fitted per engine: t ≈ a + b·n + q·(n·c + n²/2) over uncached "
                            "tokens n and cached tokens c."))
    if section["prefill_fits"]:
        blocks.append(Table(("engine", "model", "requests", "a ms", "b µs/token", "q ns/pair", "tokens/s",
                             "median rel. error"),
                            tuple((f["instance"], f["model"], f["requests"], f["intercept_ms"], f["us_per_token"],
                                   f["ns_per_attention_pair"], f["tokens_per_s"], f["median_relative_error"])
                                  for f in section["prefill_fits"])))
    else:
        blocks.append(Paragraph("No engine fitted: a fit needs each request's own prefill compute time, from step "
                                "spans, on 4 or more requests without preemption."
                                if unsplit else
                                "No engine fitted: none had 4 or more requests without preemption."))
    if section["disaggregated"]:
        blocks.append(Paragraph("Disaggregated models (each request once, its prefill and decode legs joined; "
                                "unmatched legs are kept and counted): the KV transfer and its share of the client "
                                "TTFT, the decode worker's queue and first decode."))
        blocks.append(Table(("model", "requests", "unmatched", "kv p50 ms", "kv p99 ms", "kv share of ttft",
                             "decode queue p50 ms", "first decode p50 ms", "links"),
                            tuple((d["model"], d["requests"],
                                   ", ".join(f"{n} {why}" for why, n in d["unmatched"].items()) or "0",
                                   d["kv_transfer_p50_ms"], d["kv_transfer_p99_ms"], d["kv_share_of_ttft"],
                                   d["decode_queue_p50_ms"], d["first_decode_p50_ms"], ", ".join(d["links"]))
                                  for d in section["disaggregated"])))
    if section["gpu_prefill_host"]:
        blocks.append(Paragraph("Models on CPU-only hosts, and the TTFT predicted with one GPU prefill host in front "
                                "of their engines (prefill there, KV over the link, decode on the CPU host)."))
        blocks.append(Table(("engines", "model", "requests", "ttft p50 ms", "prefill p50 ms", "gpu", "link GB/s",
                             "predicted ttft p50 ms", "predicted prefill p50 ms", "predicted wait p50 ms",
                             "gpu utilization"),
                            tuple((", ".join(g["instances"]), g["model"], g["requests"], g["ttft_p50_ms"],
                                   g["prefill_p50_ms"], g["gpu_hardware"], g["link_gb_s"], g["predicted_ttft_p50_ms"],
                                   g["predicted_prefill_p50_ms"], g["predicted_wait_ms"], g["gpu_utilization"])
                                  for g in section["gpu_prefill_host"])))
    for why in section["not_estimated"]:
        blocks.append(Paragraph(f"Not estimated: {why}."))
    return blocks


def _prefix_cache(section: dict[str, Any]) -> list[Block]:
    def table(title: str, key: str, groups: list[dict[str, Any]]) -> list[Block]:
        return [Paragraph(title), Table((key, "requests", "input tokens", "cached tokens", "hit rate"),
                                        tuple((g["key"], g["requests"], g["input_tokens"], g["cached_tokens"],
                                               g["hit_rate"]) for g in groups))]

    b = section["billing"]
    blocks: list[Block] = [Paragraph(
        f"Billing: {b['input_tokens']} input tokens of which {b['cached_tokens']} from the cache, "
        f"{b['output_tokens']} output tokens; cost ${cell(b['cost'])} with cache discounts against "
        f"${cell(b['cost_without_cache'])} without: saved ${cell(b['savings'])}.")]
    if section["uncounted"]:
        blocks.append(Paragraph(
            "Without a cached-token count (their spans give none): " + ", ".join(
                f"{u['requests']} requests of {u['model']}" for u in section["uncounted"])
            + ". They are left out of the hit rates and cache busting, and billed as uncached.", "warning"))
    blocks += table("Hit rate by tenant", "tenant", section["by_tenant"])
    blocks += table("Hit rate by model", "model", section["by_model"])
    if section["by_system_prompt"]:
        blocks += table("Hit rate by system prompt", "system prompt", section["by_system_prompt"])
    else:
        blocks.append(Paragraph("Hit rate by system prompt: no request names a system prompt."))
    if section["busting_unchecked"]:
        blocks.append(Paragraph(f"Cache busting not checked: {section['busting_unchecked']}.", "warning"))
    elif section["busting"]:
        blocks.append(Paragraph("Cache busting:", "warning"))
        blocks.append(Table(("tenant", "system prompt", "prompt tokens", "start", "end", "requests", "full-hit rate",
                             "others' full-hit rate", "lost cached tokens", "lost savings $"),
                            tuple((x["tenant"], x["system_prompt_id"], x["system_prompt_tokens"], x["start"], x["end"],
                                   x["requests"], x["full_hit_rate"], x["other_tenants_full_hit_rate"],
                                   x["lost_cached_tokens"], x["lost_savings"]) for x in section["busting"])))
    else:
        blocks.append(Paragraph("No cache busting detected."))
    if "kv_tiers" in section:
        blocks.append(Paragraph("Hit rate by KV tier (where each request's cached prefix was found when it was "
                                "first scheduled):"))
        blocks.append(Table(("engine", "model", "requests", "hit rate", "GPU", "host tier", "remote tier",
                             "host tier blocks", "remote tier blocks", "copy s", "evicted tokens recomputed"),
                            tuple((t["instance"], t["model"], t["requests"], t["hit_rate"], t["gpu_hit_rate"],
                                   t["host_hit_rate"], t["remote_hit_rate"], t["host_tier_blocks"],
                                   t["remote_tier_blocks"], t["copy_s"], t["evicted_tokens"])
                                  for t in section["kv_tiers"])))
        blocks.append(Paragraph("What more KV capacity would buy (an LRU estimate from the evicted prompt tokens):"))
        blocks.append(Table(("engine", "extra blocks", "extra GB", "hit rate"),
                            tuple((t["instance"], "unbounded" if c["extra_blocks"] is None else c["extra_blocks"],
                                   c["extra_gb"], c["hit_rate"]) for t in section["kv_tiers"]
                                  for c in t["more_capacity"])))
        blocks += [Paragraph(note, "warning") for note in section["kv_tiers_not_analysed"]]
    return blocks


def _prefill_throughput(section: dict[str, Any]) -> list[Block]:
    return [Table(("engine", "model", "hardware", "tp", "micro-batch", "median step tokens", "measured tok/s",
                   "predicted tok/s", "ridge tokens", "diagnosis", "recommended micro-batch", "tok/s with it"),
                  tuple((e["instance"], e["model"], e["hardware"], e["tensor_parallel"], e["microbatch_tokens"],
                         e["median_step_tokens"], e["measured_tokens_per_s"], e["predicted_tokens_per_s"],
                         e["ridge_tokens"], e["diagnosis"], e["recommended_microbatch_tokens"],
                         e["fix_tokens_per_s"]) for e in section["engines"]))]


RENDERERS = {"incidents": _incidents, "itl": _itl, "ttft": _ttft, "prefix_cache": _prefix_cache,
             "prefill_throughput": _prefill_throughput}


def _coverage(coverage: dict[str, Any]) -> list[Block]:
    blocks: list[Block] = [Heading("What this store can answer", 2)]
    blocks += [Paragraph(line) for line in coverage["summary"]]
    blocks += [Paragraph(f"{a['title']}: {'yes' if a['supported'] else 'NO'}. {a['detail']}")
               for a in coverage["analyses"]]
    return blocks


def _not_checked(doc: dict[str, Any]) -> list[str]:
    """What the document could not check, briefly: analyses the store cannot run, SLO targets with nothing to
    observe them, detection metrics it could not score (the sections and "What this store can answer" say why)."""
    out = [a["title"] for a in doc.get("coverage", {}).get("analyses", ()) if not a["supported"]]
    sections = doc["sections"]
    slo = sorted({u["key"] for m in sections.get("slo", {}).get("models", ()) for u in m.get("unchecked", ())})
    if slo:
        out.append("SLO targets " + ", ".join(slo))
    detection = list(dict.fromkeys(u["what"] for u in sections.get("incidents", {}).get("unchecked", ())))
    if detection:
        out.append("incident detection on " + ", ".join(detection))
    return out


def layout(doc: dict[str, Any]) -> list[Block]:
    blocks: list[Block] = [Heading(f"infertrace report: {doc['severity']}", 1), Paragraph(_selection(doc))]
    if doc["severity"] == "ok" and (unchecked := _not_checked(doc)):
        # "ok" is the worst finding in what could be checked; say at the top what that leaves out
        blocks.append(Paragraph(f"ok covers only what this store could check. Not checked: {'; '.join(unchecked)}."
                                , "warning"))
    if "coverage" in doc:
        blocks += _coverage(doc["coverage"])
    if doc["findings"]:
        blocks.append(Heading("Findings", 2))
        blocks += [Paragraph(f["title"], f["severity"]) for f in doc["findings"]]
    for name, section in doc["sections"].items():
        blocks.append(Heading(TITLES.get(name, name), 2))
        if section.get("status") != "ok":
            blocks.append(Paragraph(f"Not available: {section.get('reason', 'no result')}."))
            continue
        if name == "slo":
            blocks += _slo(section, {f["model"] for f in doc.get("coverage", {}).get("propagation", ())})
        else:
            blocks += RENDERERS[name](section)
    blocks.append(Heading("Recommendations", 2))
    if not doc["recommendations"]:
        blocks.append(Paragraph("None: no rule's evidence held in this selection."))
    if not_evaluated := unevaluated(doc):
        blocks.append(Paragraph("Not evaluated, for lack of data: " + ". ".join(
            w[0].upper() + w[1:] for w in not_evaluated) + ".", "warning" if not doc["recommendations"] else None))
    for r in doc["recommendations"]:
        blocks.append(Paragraph(f"{r['action']} Because: {r['because']}"))
    return blocks
