"""Derived metrics in Prometheus' exposition format, so Grafana users can chart them beside vLLM's own.

Where vLLM (V1) exports a metric with the same meaning, the same name, type, buckets and `model_name` label
are used, with `engine` naming the engine instance (`service.instance.id`); vLLM's `engine` label is an index:
- histograms `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
  `vllm:e2e_request_latency_seconds`, `vllm:request_queue_time_seconds`, `vllm:request_prefill_time_seconds`,
  `vllm:request_decode_time_seconds`;
- counters `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, `vllm:prefix_cache_queries_total` and
  `vllm:prefix_cache_hits_total` (prompt tokens looked up / read from the prefix cache),
  `vllm:num_preemptions_total`, `vllm:request_success_total` (by `finished_reason`);
- gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` at each engine's
  last recorded step.

What only infertrace knows, under `infertrace:`:
- `infertrace:itl_stalls_total{engine, model_name, cause, culprit_tenant}`: engine steps that stalled decoding
  requests (a step with culprits of two tenants counts once for each); `culprit_tenant` is empty for a host
  pause;
- `infertrace:itl_stall_victim_seconds_total{culprit_tenant}`: the delay a tenant's prefills handed to other
  requests' tokens (Σ over victims);
- `infertrace:itl_stall_windows_total{engine, model_name, culprit_tenant}`: on engines without step spans that
  time each token (SGLang, TGI, a streaming client's times), the request-only method's stall windows instead;
- `infertrace:prefix_cache_hit_rate{tenant}`: share of the tenant's prompt tokens read from the prefix cache;
- `infertrace:metric_unavailable{metric, reason}` = 1 for each metric above the store cannot give, and why (no
  step spans, no token times, no cached-token counts): an absent series never reads as a zero;
- `infertrace:data_until_timestamp_seconds` (when the newest segment the metrics cover was stored) and
  `infertrace:segments_pending` (segments stored since, being analysed): while a collector writes, a scrape
  answers from the newest materialised snapshot (`StoreMetrics`), so these say how current the rest is.

A counter whose inputs an engine's spans do not carry (vLLM's carry no cached-token or preemption counts) is left
out for that engine, rather than reported as 0.

Counters are totals over the store; as a collector adds spans they only grow, as Prometheus expects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from infertrace.analyzers.slo import UNCHECKED
from infertrace.export import NO_STALL_INPUTS, query_text, stall_source

if TYPE_CHECKING:
    from infertrace.analyzers.itl import ItlAnalysis
    from infertrace.analyzers.itl_requests import RequestOnlyAttribution
    from infertrace.analyzers.prefix_cache import PrefixCacheAnalysis
    from infertrace.store.store import Store

log = logging.getLogger(__name__)

# vLLM V1's buckets (vllm/v1/metrics/loggers.py), in seconds.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)

_REQUEST_HISTOGRAMS = {  # metric in the SQL → (name, help, buckets)
    "ttft": ("vllm:time_to_first_token_seconds", "Time to first token in seconds (from the engine request's "
             "arrival).", TTFT_BUCKETS),
    "e2e": ("vllm:e2e_request_latency_seconds", "End to end request latency in seconds (engine request).",
            REQUEST_LATENCY_BUCKETS),
    "queue": ("vllm:request_queue_time_seconds", "Time spent waiting before first scheduled, in seconds.",
              REQUEST_LATENCY_BUCKETS),
    "prefill": ("vllm:request_prefill_time_seconds", "Time from first scheduled to the first token, in seconds.",
                REQUEST_LATENCY_BUCKETS),
    "decode": ("vllm:request_decode_time_seconds", "Time from the first token to the last, in seconds.",
               REQUEST_LATENCY_BUCKETS),
}
_LABELS = ["model_name", "engine"]
NO_CACHED_COUNTS = "no request span of this store carries a cached-token count"


def _histogram(name: str, documentation: str, bounds: Sequence[float],
               rows: dict[tuple[str, str], tuple[list[int], float]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=_LABELS)
    for labels, (counts, total) in sorted(rows.items()):
        cumulative, buckets = 0, []
        for bound, count in zip([*map(str, bounds), "+Inf"], counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        family.add_metric(list(labels), buckets, total)
    return family


def _bucket_rows(frame: Any, key: Callable[[Any], tuple[str, str]], count: str,
                 bounds: Sequence[float]) -> dict[tuple[str, str], tuple[list[int], float]]:
    rows: dict[tuple[str, str], tuple[list[int], float]] = {}
    for record in frame.itertuples(index=False):
        counts, total = rows.get(key(record), ([0] * (len(bounds) + 1), 0.0))
        counts[int(record.bucket)] += int(getattr(record, count))
        rows[key(record)] = (counts, total + float(record.sum_seconds))
    return rows


def derived_metrics(store: Store, itl: ItlAnalysis | None = None,
                    cache: PrefixCacheAnalysis | None = None) -> list[Metric]:
    """Every metric family above, computed from the store (and the ITL and prefix-cache analyses)."""
    from infertrace.analyzers.itl import analyze_itl
    from infertrace.analyzers.itl_requests import attribute_store_requests
    from infertrace.analyzers.prefix_cache import analyze_prefix_cache

    cache = cache if cache is not None else analyze_prefix_cache(store)
    families: list[Metric] = []
    unavailable: dict[str, str] = {}  # metric -> why the store cannot give it
    requests = store.sql(query_text("metrics_request_histograms"), params={
        "ttft": list(TTFT_BUCKETS), "e2e": list(REQUEST_LATENCY_BUCKETS), "phase": list(REQUEST_LATENCY_BUCKETS),
    }).df()
    models: dict[str, str] = dict(zip(requests["instance"], requests["model"].fillna(""), strict=True))
    for metric, (name, documentation, bounds) in _REQUEST_HISTOGRAMS.items():
        rows = _bucket_rows(requests[requests["metric"] == metric], lambda r: (r.model or "", r.instance),
                            "requests", bounds)
        families.append(_histogram(name, documentation, bounds, rows))
    tokens = store.sql(query_text("metrics_itl_histogram"), params={"itl": list(ITL_BUCKETS)}).df()
    itl_rows = _bucket_rows(tokens, lambda r: (models.get(r.instance, ""), r.instance), "tokens", ITL_BUCKETS)
    families.append(_histogram("vllm:inter_token_latency_seconds", "Time between consecutive output tokens of a "
                               "request, in seconds.", ITL_BUCKETS, itl_rows))
    if tokens.empty:
        unavailable["vllm:inter_token_latency_seconds"] = UNCHECKED["itl"]
    families += _engine_totals(store, unavailable)
    method = "steps" if itl is not None else stall_source(store)
    if method == "steps":
        families += _stall_metrics(itl or analyze_itl(store))
    elif method == "requests":
        families.append(_stall_window_metrics(attribute_store_requests(store), models))
    if method != "steps":
        for name in ("infertrace:itl_stalls_total", "infertrace:itl_stall_victim_seconds_total"):
            unavailable[name] = NO_STALL_INPUTS if not method else ("counted per engine step, and this store has no "
                                                                    "engine_step spans: see "
                                                                    "infertrace:itl_stall_windows_total")
    if not method:
        unavailable["infertrace:itl_stall_windows_total"] = NO_STALL_INPUTS
    hit_rate = GaugeMetricFamily("infertrace:prefix_cache_hit_rate", "Share of the tenant's prompt tokens read "
                                 "from the prefix cache.", labels=["tenant"])
    for group in cache.by_tenant:
        if group.hit_rate is not None:
            hit_rate.add_metric([str(group.key)], float(group.hit_rate))
    if not hit_rate.samples:
        unavailable["infertrace:prefix_cache_hit_rate"] = NO_CACHED_COUNTS
    families.append(hit_rate)
    missing = GaugeMetricFamily("infertrace:metric_unavailable", "1 for each metric this store cannot give, with "
                                "the reason (an absent series is not a zero).", labels=["metric", "reason"])
    for name, reason in sorted(unavailable.items()):
        missing.add_metric([name, reason], 1.0)
    families.append(missing)
    return families


def _engine_totals(store: Store, unavailable: dict[str, str]) -> list[Metric]:
    """vLLM's counters and gauges per engine; a counter an engine's spans give no input for is left out for it, and
    where no engine has one it goes into `unavailable`."""
    totals = store.sql(query_text("metrics_engine_totals")).df()
    counters = {column: CounterMetricFamily(name, documentation, labels=_LABELS) for column, name, documentation in (
        ("prompt_tokens", "vllm:prompt_tokens", "Prompt tokens of the engine's requests."),
        ("generation_tokens", "vllm:generation_tokens", "Tokens the engine generated."),
        ("prompt_tokens_queried", "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
        ("cached_tokens", "vllm:prefix_cache_hits", "Prompt tokens read from the prefix cache."),
        ("preemptions", "vllm:num_preemptions", "Preemptions of the engine's requests."))}
    success = CounterMetricFamily("vllm:request_success", "Finished requests by finish reason.",
                                  labels=[*_LABELS, "finished_reason"])
    gauges = {column: GaugeMetricFamily(name, documentation, labels=_LABELS) for column, name, documentation in (
        ("running", "vllm:num_requests_running", "Requests running at the engine's last recorded step."),
        ("waiting", "vllm:num_requests_waiting", "Requests waiting at the engine's last recorded step."),
        ("kv_usage", "vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use at the engine's last "
                                                 "recorded step (1 = 100%)."))}
    per_engine: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    last: dict[tuple[str, str], dict[str, float | None]] = {}
    for r in totals.itertuples(index=False):
        labels = (r.model or "", r.instance)
        sums = per_engine[labels]
        for column in counters:
            if pd.notna(value := getattr(r, column)):
                sums[column] = sums.get(column, 0.0) + float(value)
        success.add_metric([*labels, str(r.finish_reason)], float(r.requests))
        kv = (float(r.kv_used_blocks) / float(r.kv_total_blocks)
              if pd.notna(r.kv_used_blocks) and pd.notna(r.kv_total_blocks) and r.kv_total_blocks else None)
        last[labels] = {"running": r.running if pd.notna(r.running) else None,
                        "waiting": r.waiting if pd.notna(r.waiting) else None, "kv_usage": kv}
    for labels, sums in sorted(per_engine.items()):
        for column, family in counters.items():
            if column in sums:  # else the engine's spans do not count it: left out, not a zero
                family.add_metric(list(labels), sums[column])
        for column, family in gauges.items():
            value = last[labels][column]
            if value is not None:  # no step spans: no load to report, rather than a zero
                family.add_metric(list(labels), float(value))
    for column, family in (*counters.items(), *gauges.items()):
        if not family.samples and per_engine:
            unavailable[family.name + ("_total" if family.type == "counter" else "")] = {
                "prompt_tokens_queried": NO_CACHED_COUNTS, "cached_tokens": NO_CACHED_COUNTS,
                "preemptions": "no request span of this store counts its preemptions",
            }.get(column, "no engine_step spans: an engine's load is read from its steps")
    return [*counters.values(), success, *gauges.values()]


def _stall_metrics(itl: ItlAnalysis) -> list[Metric]:
    stalls: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for s in itl.stalls:
        tenants = {c.tenant or "" for c in s.culprits} or {""}
        for cause in s.causes:
            for tenant in tenants if cause != "host_pause" else {""}:
                stalls[(s.model or "", s.instance, cause, tenant)] += 1
    count = CounterMetricFamily("infertrace:itl_stalls", "Engine steps that stalled decoding requests, by cause "
                                "and culprit tenant.", labels=[*_LABELS, "cause", "culprit_tenant"])
    for labels, n in sorted(stalls.items()):
        count.add_metric(list(labels), float(n))
    delay: dict[str, float] = defaultdict(float)
    for c in itl.culprits:
        delay[c.tenant or ""] += c.victim_stall_ns / 1e9
    handed = CounterMetricFamily("infertrace:itl_stall_victim_seconds", "Delay the tenant's prefills added to "
                                 "other requests' tokens, summed over the victims.", labels=["culprit_tenant"])
    for tenant, seconds in sorted(delay.items()):
        handed.add_metric([tenant], seconds)
    return [count, handed]


def _stall_window_metrics(attribution: RequestOnlyAttribution, models: dict[str, str]) -> Metric:
    windows: dict[tuple[str, str, str], int] = defaultdict(int)
    for s in attribution.stalls:
        for tenant in {c.tenant or "" for c in s.culprits} or {""}:
            windows[(models.get(s.instance, ""), s.instance, tenant)] += 1
    family = CounterMetricFamily("infertrace:itl_stall_windows", "Stall windows of decoding requests found from "
                                 "request spans and per-token times (engines without step spans), by culprit "
                                 "tenant (empty: no culprit found).", labels=[*_LABELS, "culprit_tenant"])
    for labels, n in sorted(windows.items()):
        family.add_metric(list(labels), float(n))
    return family


class StoreMetrics:
    """A prometheus-client collector over a store directory. Each scrape answers from the snapshot
    `infertrace.results.live` shows: the store's current segments when their analyses are materialised, else the
    newest materialised snapshot while the current one is materialised in the background (a scrape must answer
    within Prometheus' timeout, 10 s by default, and computing the analyses of a busy hour takes longer). The
    metrics are recomputed only when that snapshot changes, from its materialised relations and results; two
    gauges say how current they are. With `window_s`, the snapshots are those of that analysis window
    (`store.window_segments`): every figure covers the window's segments, and falls as old ones leave it."""

    def __init__(self, root: Path, window_s: float | None = None) -> None:
        self.root = root
        self.window_s = window_s
        self._lock = threading.Lock()
        self._snapshot: tuple[str, ...] | None = None
        self._families: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        from infertrace.results import result
        from infertrace.results.live import lag, shown_snapshot
        from infertrace.results.materialized import load_metrics, save_metrics
        from infertrace.results.relations import attach
        from infertrace.store.store import Store

        with self._lock:
            snapshot = shown_snapshot(self.root, self.window_s)
            if snapshot != self._snapshot:
                started = time.perf_counter()
                text = load_metrics(self.root, (Path(s).name for s in snapshot))
                if text is None:  # no materialised snapshot yet: computed here, and kept for the next reader
                    with Store.open(self.root, segments=snapshot, window_s=self.window_s) as store:
                        attach(store)
                        text = exposition_text(store, result(store, "itl"), result(store, "prefix_cache"))
                        try:
                            save_metrics(store, text)
                        except OSError as e:
                            log.warning("cannot keep the metrics in %s: %s", self.root, e)
                self._families = list(text_string_to_metric_families(text))
                self._snapshot = snapshot
                log.info("metrics recomputed for %d segments in %.2f s", len(snapshot), time.perf_counter() - started)
            behind = lag(self.root, snapshot, self.window_s)
            pending = GaugeMetricFamily("infertrace:segments_pending", "Segments stored since the snapshot these "
                                        "metrics come from (being analysed; 0: the metrics are current).")
            pending.add_metric([], float(behind.newer_segments if behind is not None else 0))
            yield from [*self._families, pending]


def exposition_text(store: Store, itl: ItlAnalysis, cache: PrefixCacheAnalysis) -> str:
    """Every family of `derived_metrics` and `infertrace:data_until_timestamp_seconds`, in Prometheus' text
    format: what `materialize` keeps per snapshot and a scrape serves (`StoreMetrics`)."""
    registry = CollectorRegistry(auto_describe=False)
    families = derived_metrics(store, itl=itl if stall_source(store) == "steps" else None, cache=cache)
    registry.register(_Families([*families, _data_until(store)]))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


class _Families:
    """Metric families computed once, for a registry to write out."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _data_until(store: Store) -> Metric:
    """When the newest segment of the store's snapshot was written: the metrics cover the spans stored until then."""
    gauge = GaugeMetricFamily("infertrace:data_until_timestamp_seconds", "When the newest segment of the snapshot "
                              "these metrics come from was stored (Unix seconds): they cover the spans stored until "
                              "then.")
    gauge.add_metric([], store.written_until())
    return gauge


def exposition(root: Path) -> bytes:
    """The metrics of a store directory as one scrape would return them."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreMetrics(root))  # type: ignore[arg-type]
    return generate_latest(registry)


def serve(root: Path, host: str, port: int, window_s: float | None = None) -> tuple[ThreadingHTTPServer,
                                                                                  threading.Thread]:
    """Serves GET /metrics for the store (its analysis window, with `window_s`) on host:port (port 0: any free
    port) in a background thread."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreMetrics(root, window_s))  # type: ignore[arg-type]
    server, thread = start_http_server(port, addr=host, registry=registry)
    return server, thread
