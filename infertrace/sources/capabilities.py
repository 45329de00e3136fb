"""What a store can answer, and why not: which engines' and gateways' spans it holds (infertrace/sources/), which
analyses that supports, what each falls back to, and what ingest quarantined. The report and the dashboard print
this so that "no data" never reads as "no problem".

    coverage = store_coverage(store)
    coverage.analysis("itl").detail
    # 'ITL attribution needs engine_step spans, client token times or an iteration log; this store has none.'
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infertrace.analyzers import materialize_once, query_text
from infertrace.analyzers.clocks import ClockOffset, clock_offsets
from infertrace.analyzers.instances import InstanceProblem, instance_problems
from infertrace.analyzers.propagation import PropagationBreak, propagation_breaks
from infertrace.sources import ENGINES
from infertrace.store.segments import QUARANTINE_DIR
from infertrace.store.store import Store
from infertrace.store.values import describe

SOURCE_TITLES = {"infertrace": "the reference engine", **{k: p.title for k, p in ENGINES.items()}}
TOKEN_SPANS = "SGLang decode_loop or TGI send_generation spans"


@dataclass(frozen=True)
class Analysis:
    key: str  # a report section (slo, incidents, itl, ttft, prefix_cache, prefill_throughput) or a part of one
    title: str
    supported: bool  # it runs on this store (perhaps on less than it would use)
    detail: str  # what it runs on and what it lacks, or why it cannot run


@dataclass(frozen=True)
class Quarantine:
    records: int  # lines and spans ingest kept aside
    reasons: tuple[tuple[str, int], ...]  # the commonest first


@dataclass(frozen=True)
class StoreCoverage:
    engine_requests: int
    sources: dict[str, int]  # engine requests per source (requests.source)
    entry_requests: int  # requests seen at a gateway's entry span
    entry_services: tuple[str, ...]
    component_calls: int  # component calls found by name, other service or HTTP attributes
    in_process_calls: int  # spans in the entry's own process: components only when --components names them
    step_spans: int
    tokens_from_steps: int
    tokens_from_spans: int
    cached_tokens: int  # requests with a cached-token count
    tenants: int  # requests with a tenant
    model_from_service: int  # requests whose model is only their service.name
    instance_fallbacks: dict[str, int]  # requests whose instance came from something else than service.instance.id
    quarantine: Quarantine
    stored_with_changes: str  # what ingest converted, kept as text, truncated or dropped to store spans ("" if none)
    unreadable_segments: int  # segments the reader left out of its snapshot
    client_token_requests: int = 0  # requests with a client's token times (client_tokens)
    iteration_lines: int = 0  # vLLM iteration log lines (iteration_log)
    clock_offsets: tuple[ClockOffset, ...] = ()  # engines whose clocks disagree with the gateway's
    instance_problems: tuple[InstanceProblem, ...] = ()  # instance ids that are not one engine's run
    propagation: tuple[PropagationBreak, ...] = ()  # models whose engines get no trace context from the gateway
    environments: dict[str, int] = field(default_factory=dict)  # spans per deployment environment that names one
    aliases: tuple[tuple[str, str, int], ...] = ()  # a gateway's name for a model, the engines' name, entries
    entries_without_model: int = 0  # entry requests that neither the entry nor an engine in its trace name a model of
    entries_model_from_client: int = 0  # entry requests whose model is the one their trace's CLIENT spans call
    entries_without_engine: int = 0  # entry requests with a model, answered without error, with no engine span
    client_calls: int = 0  # CLIENT spans naming a model, in traces without an engine request or a gateway span
    analyses: tuple[Analysis, ...] = field(default=())

    def analysis(self, key: str) -> Analysis:
        return next(a for a in self.analyses if a.key == key)

    def problems(self) -> list[str]:
        """The lines of `sentences` that say the spans are wrong or incomplete somewhere (quarantined data, clocks,
        instance ids, trace context, mixed environments, unreadable segments): what a reader must see before any
        figure."""
        return [*self._quarantined(), *self._spans_wrong(), *self._environments(), *self._unreadable()]

    def sentences(self) -> list[str]:
        """What the store holds, in a few lines."""
        sources = ", ".join(f"{SOURCE_TITLES.get(s, s)} ({n} requests)" for s, n in self.sources.items()) or "none"
        lines = [f"Engine spans: {sources}."]
        if self.entry_requests:
            lines.append(f"Gateway: {self.entry_requests} requests seen at entry spans of "
                         f"{', '.join(self.entry_services)}; {self.component_calls} component calls found in the "
                         "trace tree" + (f", and {self.in_process_calls} spans in the gateway's own process that "
                                         "count only when --components names them" if self.in_process_calls else "")
                         + ".")
            if self.entries_model_from_client:
                lines.append(f"{self.entries_model_from_client} of these entries take their model from the CLIENT "
                             "span their trace calls it with (gen_ai.request.model on the call, not on the request: "
                             "an application's or gateway's GenAI instrumentation, e.g. OpenLLMetry's).")
            if self.entries_without_model:
                lines.append(f"{self.entries_without_model} of these entries name no model, nor does an engine span "
                             "or one model of the CLIENT spans in their traces (gen_ai.request.model): they are in "
                             "no per-model figure (requests that are not LLM inference, a gateway that does not say "
                             "which model it called, or one that called several).")
        else:
            lines.append("Gateway: no gateway span" + ("; requests are seen at the engines." if self.engine_requests
                                                        else "."))
        if self.client_calls:
            lines.append(f"{self.client_calls} spans are calls to a model seen by their client (CLIENT spans with "
                         "gen_ai.request.model, in traces with no gateway or engine span: an application's GenAI "
                         "instrumentation, e.g. OpenLLMetry's): infertrace reads requests where they are served, at "
                         "gateways and engines, so they are in no figure.")
        if self.model_from_service:
            lines.append(f"{self.model_from_service} requests carry no model attribute (vLLM V1 sets none, TGI none): "
                         "their model is their service.name.")
        if self.instance_fallbacks:
            how = ", ".join(f"{n} from {k}" for k, n in self.instance_fallbacks.items())
            lines.append(f"Instances without service.instance.id: {how}.")
        lines += self._quarantined() or ["Quarantined at ingest: nothing."]
        if self.stored_with_changes:
            lines.append(f"Stored with changes: {self.stored_with_changes}.")
        lines += self._spans_wrong()
        if self.aliases:
            named = ", ".join(f"{alias} is {model} ({n} requests)" for alias, model, n in self.aliases)
            lines.append(f"Model names: the gateway's {named} at the engines; every figure uses the engines' names.")
        return lines + self._environments() + self._unreadable()

    def _quarantined(self) -> list[str]:
        q = self.quarantine
        if not q.records:
            return []
        top = "; ".join(f"{reason} ({n})" for reason, n in q.reasons)
        return [f"Quarantined at ingest: {q.records} lines or spans; commonest reasons: {top}."]

    def _spans_wrong(self) -> list[str]:
        return ([f"Clocks: {finding.sentence()}" for finding in self.clock_offsets]
                + [f"Instances: {problem.sentence()}" for problem in self.instance_problems]
                + [f"Trace context: {finding.sentence()}" for finding in self.propagation])

    def _environments(self) -> list[str]:
        if len(self.environments) < 2:
            return []
        named = ", ".join(f"{env} ({n} spans)" for env, n in self.environments.items())
        return [f"Environments: the spans name {len(self.environments)} deployment environments, {named} "
                "(deployment.environment.name). Every figure mixes them: a model served in several is one model with "
                "the engines of all. Ingest each environment's spans into a store of its own (infertrace ingest "
                "--resource deployment.environment.name=ENV)."]

    def _unreadable(self) -> list[str]:
        n = self.unreadable_segments
        return [f"{n} segment{'s' if n != 1 else ''} could not be read and {'are' if n != 1 else 'is'} left out of "
                "every analysis (infertrace store check)."] if n else []


def quarantine_summary(store: Store, top: int = 3) -> Quarantine:
    """Counts of the records ingest kept aside (the store's quarantine files), by reason."""
    files = sorted((store.root / QUARANTINE_DIR).glob("*.jsonl"))
    if not files:
        return Quarantine(0, ())
    rows = store.con.execute(
        "SELECT reason, count(*) FROM read_json(?, format = 'newline_delimited', columns = {'reason': 'VARCHAR'}) "
        "GROUP BY reason ORDER BY count(*) DESC, reason", [[str(f) for f in files]]).fetchall()
    return Quarantine(sum(n for _, n in rows), tuple((str(r), int(n)) for r, n in rows[:top]))


def store_coverage(store: Store) -> StoreCoverage:
    materialize_once(store, ("requests", "token_runs", "component_calls"))
    counts: dict[str, dict[str | None, int]] = {}
    for what, key, n in store.sql(query_text("store_coverage")).fetchall():
        counts.setdefault(what, {})[key] = int(n)

    def total(what: str) -> int:
        return sum(counts.get(what, {}).values())

    calls = counts.get("calls", {})
    named = _named_in_process(store) if calls.get("same_service") else 0
    coverage = StoreCoverage(
        engine_requests=total("source"),
        sources={str(k): n for k, n in sorted(counts.get("source", {}).items(), key=lambda kv: -kv[1])},
        entry_requests=total("entry"),
        entries_without_model=total("entry_without_model"),
        entries_model_from_client=total("entry_model_from_client"),
        entries_without_engine=total("entry_without_engine"),
        client_calls=total("client_calls"),
        entry_services=tuple(sorted(str(k) for k in counts.get("entry", {}) if k is not None)),
        component_calls=sum(n for k, n in calls.items() if k != "same_service") + named,
        in_process_calls=calls.get("same_service", 0) - named,
        step_spans=total("step_spans"),
        tokens_from_steps=counts.get("tokens", {}).get("steps", 0),
        tokens_from_spans=counts.get("tokens", {}).get("spans", 0),
        cached_tokens=total("cached_tokens"),
        tenants=total("tenants"),
        model_from_service=counts.get("model_source", {}).get("service.name", 0),
        instance_fallbacks={str(k): n for k, n in counts.get("instance_source", {}).items()
                            if k not in ("service.instance.id", None)},
        quarantine=quarantine_summary(store),
        stored_with_changes=describe(store.notes),
        unreadable_segments=len(store.skipped),
        client_token_requests=int(store.sql("SELECT count(DISTINCT request_id) FROM client_tokens").fetchall()[0][0]),
        iteration_lines=int(store.sql("SELECT count(*) FROM iteration_log").fetchall()[0][0]),
        clock_offsets=clock_offsets(store) if counts.get("entry") else (),
        instance_problems=instance_problems(store),
        propagation=propagation_breaks(store) if counts.get("entry") else (),
        environments={str(k): n for k, n in sorted(counts.get("environment", {}).items(), key=lambda kv: -kv[1])
                      if k is not None},
        aliases=tuple((alias, model, n) for (alias, model), n in
                      ((str(k).split("\t", 1), n) for k, n in sorted(counts.get("alias", {}).items()) if k)),
    )
    return StoreCoverage(**{**coverage.__dict__, "analyses": _analyses(coverage)})


def _named_in_process(store: Store) -> int:
    """Calls in the gateway's own process that the store connection's `--components` rules name (then they are
    components like any other)."""
    from infertrace.analyzers.topology import load_paths
    from infertrace.sources.components import registered

    if not registered(store):
        return 0
    paths = load_paths(store)
    return int((paths["found_by"] == "same_service").sum()) if not paths.empty else 0


def _analyses(c: StoreCoverage) -> tuple[Analysis, ...]:
    requests = c.engine_requests + c.entry_requests - c.entries_without_model  # those the per-model figures count
    tokens = c.tokens_from_steps + c.tokens_from_spans
    gateway = c.entry_requests > 0
    out = []

    none = ("No request names a model (the gateway's entry spans do not, and neither an engine span nor the CLIENT "
            "spans of their traces name one)"
            if c.entries_without_model else
            f"No request spans (only {c.client_calls} calls seen by their clients)" if c.client_calls else
            "No request spans")
    seen = "gateway entry spans" if gateway else "the engines' own spans (no gateway span)"
    itl_pct = ("ITL percentiles from engine_step spans" if c.tokens_from_steps else
               f"ITL percentiles from {TOKEN_SPANS}" if c.tokens_from_spans else
               f"no ITL percentiles: they need per-token times (engine_step spans, {TOKEN_SPANS}); this store has none")
    rates = ("error and 429 rates at the gateway" if gateway else
             "no error or 429 rates: they are the gateway's answers, and this store has no gateway span")
    unseen = sorted(p.instance for p in c.instance_problems if p.unseen_requests and not p.mixed)
    lost = (f" Requests of {', '.join(unseen)} whose request spans were lost are in no figure (see Instances)."
            if unseen else "")
    apart = ", ".join(sorted(f.model for f in c.propagation))

    def split(effect: str) -> str:
        return (f" The requests of {apart} are in traces apart from the gateway's (see Trace context): {effect}."
                if apart else "")
    skewed = sorted({i for f in c.clock_offsets for i in f.instances})
    clocks = (f" The TTFT of the requests of {', '.join(skewed)} is off by their clocks' offset from the gateway's "
              "(see Clocks): it runs from the gateway's entry to the engine's first token." if skewed else "")
    alone = (f" {c.entries_without_engine} requests reach no engine span (an engine that does not trace, or an API "
             "the gateway calls): their E2E is their entry span's, those answered without error, and they have no "
             "TTFT or ITL." if c.entries_without_engine else "")
    out.append(Analysis("slo", "SLO summary", requests > 0,
                        f"TTFT and E2E from {seen}; {itl_pct}; {rates}.{alone}{lost}{clocks}"
                        f"{split('their TTFT and E2E are from the engine alone')}" if requests else
                        f"{none}: nothing to summarise."))

    if not requests:
        detection = f"{none}: no incident can be detected."
    elif gateway:
        detection = (f"Per model and tenant, from {c.entry_requests - c.entries_without_model} requests at gateway "
                     "entry spans.")
    else:
        detection = ("Per model from the engines' spans alone: there is no gateway span, so gateway latency and "
                     "requests rejected before an engine are not seen.")
    if requests and not c.tenants:
        detection += " No span names a tenant: no tenant anomalies, no tenant lift."
    detection += split("each is counted twice, at the gateway and at its engine")
    out.append(Analysis("incidents", "Incident detection", requests > 0, detection))

    out.append(Analysis(
        "rca_components", "Root cause: shared components", c.component_calls > 0,
        f"{c.component_calls} component calls found in the trace tree rank with each model's engines."
        + split("the gateway's components cannot be followed to their engines") if c.component_calls else
        "RCA ranks what the engines' spans show (each model's engines and instances, attribute lift) and cannot "
        "rank shared components (auth, rate limiter, router, queue): this store has no gateway component spans"
        + (" (the gateway's in-process spans count once --components names them)" if c.in_process_calls else "")
        + "."))

    if c.step_spans:
        itl = f"From {c.step_spans} engine_step spans: each stall's culprit prefills and victims, exactly."
    elif c.client_token_requests or c.tokens_from_spans:
        times = (f"{c.client_token_requests} requests' client token times (their clock offset and jitter "
                  "estimated from the data)" if c.client_token_requests else f"per-token times from {TOKEN_SPANS}")
        itl = (f"No engine_step spans: the request-only method (infertrace.analyzers.itl_requests) joins request "
               f"spans with {times}: stall windows, not steps, and a confidence per culprit.")
        if c.client_token_requests and c.iteration_lines:
            itl += (f" {c.iteration_lines} vLLM iteration log lines name the stalled iterations' prefills by their "
                    "context tokens where they saw the stall (infertrace.analyzers.itl_iterations).")
    elif c.iteration_lines:
        itl = (f"No engine_step spans and no token times: {c.iteration_lines} vLLM iteration log lines, placed on "
               "the spans' clock by their first tokens, name the stalled iterations and the requests whose "
               "prefill ended in them (infertrace.analyzers.itl_iterations).")
    else:
        itl = ("ITL attribution needs engine_step spans, client token times or an iteration log; this store has "
               "none.")
    mixed = sorted(p.instance for p in c.instance_problems if p.step_spans and p.mixed)
    if mixed:
        whose = "its" if len(mixed) == 1 else "their"
        itl += (f" Not reliable on {', '.join(mixed)}: {whose} step spans are not one engine's run (see "
                "Instances).")
    incomplete = sorted(p.instance for p in c.instance_problems if p.missing_steps)
    if incomplete:
        itl += (f" Incomplete on {', '.join(incomplete)}: steps without a span, whose stalls are not seen (see "
                "Instances).")
    out.append(Analysis("itl", "ITL spike attribution",
                        (c.step_spans or c.client_token_requests or c.tokens_from_spans or c.iteration_lines) > 0,
                        itl))

    parts = []
    if requests:
        parts.append(("gateway share from entry spans" + (f", none for {apart} (see Trace context)" if apart else ""))
                     if gateway else "no gateway share (no gateway span)")
        if c.clock_offsets:
            parts.append(f"the gateway share of the requests of {', '.join(skewed)} is off by their clocks' offset "
                         "from the gateway's (see Clocks)")
        parts.append("prefill split into own compute and waiting from step spans" if c.step_spans else
                     "prefill not split into own compute and waiting (needs step spans)")
        if c.sources.get("vllm-v1"):
            parts.append("vLLM V1's queue time includes its API server's latency (its own clocks)")
        if c.sources.get("vllm-v0"):
            parts.append("vLLM V0 exports no prefill time: its prefill is TTFT less queue")
    ttft = "; ".join(parts) + "."
    out.append(Analysis("ttft", "TTFT decomposition", c.engine_requests > 0,
                        ttft[0].upper() + ttft[1:] if parts else "No engine request spans."))

    missing_cache = [SOURCE_TITLES.get(s, s) for s in c.sources if s in ("vllm-v1", "vllm-v0", "tgi")]
    out.append(Analysis(
        "prefix_cache", "Prefix cache and billing", c.cached_tokens > 0,
        f"From cached-token counts on {c.cached_tokens} requests." if c.cached_tokens else
        "Prefix-cache hit rates need a cached-token count per request; this store has none"
        + (f" ({', '.join(missing_cache)} export none)." if missing_cache else ".")))

    out.append(Analysis(
        "prefill_throughput", "Prefill throughput against the roofline", c.step_spans > 0,
        "From step spans and the engines' hardware." if c.step_spans else
        "Prefill throughput needs engine_step spans (tokens per step and step times); this store has none."))
    out.append(Analysis("tokens", "Per-token times", tokens > 0,
                        f"{tokens} tokens ({c.tokens_from_steps} from step spans, {c.tokens_from_spans} from "
                        "per-token spans)." if tokens else "No per-token times."))
    return tuple(out)
