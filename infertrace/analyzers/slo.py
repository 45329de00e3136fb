"""Fleet SLO summary: TTFT, ITL and E2E percentiles per model (whole window and per time bucket), error and
429 rates at the gateway, each checked against configurable SLO targets.

TTFT and E2E are as the client sees them: from the start of the request's gateway span (arrival at the
engine when the trace has none) to its first / last token in the `requests` relation; ITL is every token's
after a request's first (the `tokens` relation's itl_ns), read from `token_runs` and `steps` without a row per
token (each later token of a decode run waited one step of its span), errors and 429s from the gateway's calls in
`component_calls` (a request rejected at the gateway never reaches an engine). A window and model/tenant
filters select requests by arrival; a request's tokens go with it.

A target is breached when the observed value exceeds it; the breach is `critical` when the observed value is
at least `critical_ratio` times the target, else `warning`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from infertrace.store.store import Store

SEVERITIES = ("ok", "warning", "critical")
QUANTILES = (0.5, 0.95, 0.99)
METRICS = ("ttft", "itl", "e2e")


@dataclass(frozen=True)
class SloTarget:
    metric: str  # ttft | itl | e2e (milliseconds at `quantile`) or error_rate | rejected_rate (fractions)
    quantile: float | None  # 0.5, 0.95 or 0.99 for latency metrics; None for rates
    threshold: float

    @property
    def key(self) -> str:
        if self.quantile is None:
            return self.metric
        return f"{self.metric}_p{round(self.quantile * 100)}_ms"


DEFAULT_TARGETS = (SloTarget("ttft", 0.99, 1000.0), SloTarget("itl", 0.99, 100.0), SloTarget("e2e", 0.99, 30000.0),
                   SloTarget("error_rate", None, 0.01), SloTarget("rejected_rate", None, 0.01))


def parse_target(text: str) -> SloTarget:
    """`ttft_p99_ms=500`, `itl_p95_ms=80`, `e2e_p50_ms=4000`, `error_rate=0.02`, `rejected_rate=0.05`."""
    key, sep, value = text.partition("=")
    key = key.strip()
    try:
        threshold = float(value)
    except ValueError:
        raise ValueError(f"SLO {text!r}: expected KEY=NUMBER") from None
    if not sep or threshold < 0:
        raise ValueError(f"SLO {text!r}: expected KEY=NUMBER with a number ≥ 0")
    if key in ("error_rate", "rejected_rate"):
        return SloTarget(key, None, threshold)
    parts = key.split("_")
    if len(parts) == 3 and parts[0] in METRICS and parts[2] == "ms" and parts[1] in ("p50", "p95", "p99"):
        return SloTarget(parts[0], int(parts[1][1:]) / 100, threshold)
    raise ValueError(f"SLO {text!r}: unknown key {key!r}; use ttft|itl|e2e _p50|_p95|_p99 _ms, error_rate or "
                     "rejected_rate")


def with_targets(overrides: list[SloTarget], base: tuple[SloTarget, ...] = DEFAULT_TARGETS) -> tuple[SloTarget, ...]:
    """`base` with each override replacing the target of the same metric (a latency metric keeps one target)."""
    merged = {t.metric: t for t in base}
    for t in overrides:
        merged[t.metric] = t
    return tuple(merged.values())


@dataclass(frozen=True)
class Percentiles:
    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None

    def at(self, quantile: float) -> float | None:
        return {0.5: self.p50_ms, 0.95: self.p95_ms, 0.99: self.p99_ms}[quantile]


@dataclass(frozen=True)
class SloCheck:
    target: SloTarget
    observed: float | None
    severity: str  # ok | warning | critical, or unknown: nothing in the store to observe it from (`UNCHECKED`)

    @property
    def ratio(self) -> float | None:
        if self.observed is None or self.target.threshold == 0:
            return None
        return self.observed / self.target.threshold


@dataclass(frozen=True)
class ModelSlo:
    model: str
    gateway_requests: int  # requests the gateway answered for this model
    errors: int  # gateway outcome error (5xx, timeouts)
    rejected: int  # HTTP 429
    engine_requests: int  # requests that reached an engine (rows of `requests`)
    ttft: Percentiles
    itl: Percentiles
    e2e: Percentiles
    checks: tuple[SloCheck, ...]

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.gateway_requests if self.gateway_requests else None

    @property
    def rejected_rate(self) -> float | None:
        return self.rejected / self.gateway_requests if self.gateway_requests else None

    @property
    def severity(self) -> str:
        """The worst of the checks the store could make (`unchecked` lists the others)."""
        return max((c.severity for c in self.checks if c.severity in SEVERITIES), key=SEVERITIES.index,
                   default="ok")

    @property
    def unchecked(self) -> tuple[SloCheck, ...]:
        """The targets the store holds nothing to check against for this model (`UNCHECKED` says why)."""
        return tuple(c for c in self.checks if c.severity == "unknown")


# Why a target could not be checked: what the metric is read from, which the store lacks for the model.
UNCHECKED = {"ttft": "no request with a first token", "e2e": "no request that finished",
             "itl": "no per-token times (engine_step spans, SGLang's or TGI's token spans, or a client's token times)",
             "error_rate": "no gateway entry span (errors and 429s are counted where the gateway answered)",
             "rejected_rate": "no gateway entry span (errors and 429s are counted where the gateway answered)"}


@dataclass(frozen=True)
class SloBucket:
    model: str
    start_ns: int
    requests: int  # requests arriving in the bucket
    percentiles_ms: dict[str, float | None]  # "ttft_p99_ms" → value, for every metric × quantile
    breached: tuple[str, ...]  # target keys breached in this bucket (latency targets only)


@dataclass(frozen=True)
class SloSummary:
    since_ns: int | None
    until_ns: int | None
    start_ns: int | None  # first request arrival in the selection
    end_ns: int | None  # last request finish in the selection
    model_filter: str | None
    tenant_filter: str | None
    targets: tuple[SloTarget, ...]
    critical_ratio: float
    bucket_ns: int
    models: tuple[ModelSlo, ...]
    buckets: tuple[SloBucket, ...] = field(default=())

    @property
    def severity(self) -> str:
        return max((m.severity for m in self.models), key=SEVERITIES.index, default="ok")

    def model(self, name: str) -> ModelSlo:
        return next(m for m in self.models if m.model == name)


# The SLO summary reads the store through three aggregations (`Store.aggregate`: on a ClickHouse store they run
# in ClickHouse, infertrace/store/clickhouse/sql/slo_*.sql, and only their rows come back), then reduces those rows
# to percentiles on a DuckDB connection of its own.

# `slo_requests`: the selected requests, with TTFT and E2E as the client sees them: from the gateway span's start
# when the request's trace has one (gateway components and routing included), else from arrival at the engine
# (seen_at 'engine'). A request its gateway answered whose trace reaches no engine span (an engine that does not
# trace, as vLLM by default, or a hosted API the gateway calls) is seen at the gateway alone (seen_at 'entry'): its
# E2E is its entry span, which ends when the response has been sent, and it has no TTFT; only those answered
# without error count (a rejection answered in a millisecond is no latency of the model's; the 429 and error rates
# count them).
_SELECTED = """
WITH r AS (
    SELECT q.request_id, q.model, q.tenant, coalesce(g.start_ns, q.arrival_ns) AS arrival_ns, q.finish_ns,
           q.first_token_ns - coalesce(g.start_ns, q.arrival_ns) AS ttft_ns,
           q.finish_ns - coalesce(g.start_ns, q.arrival_ns) AS e2e_ns, 'engine' AS seen_at
    FROM requests q
    LEFT JOIN component_calls g ON g.trace_id = q.trace_id AND g.component = 'gateway'
    WHERE ($since IS NULL OR coalesce(g.start_ns, q.arrival_ns) >= $since)
      AND ($until IS NULL OR coalesce(g.start_ns, q.arrival_ns) < $until)
      AND ($model IS NULL OR q.model = $model) AND ($tenant IS NULL OR q.tenant = $tenant)
    UNION ALL
    SELECT g.request_id, g.model, g.tenant, g.start_ns, g.end_ns, NULL::BIGINT, g.end_ns - g.start_ns, 'entry'
    FROM component_calls g ANTI JOIN requests q ON q.trace_id = g.trace_id
    WHERE g.component = 'gateway' AND g.model IS NOT NULL AND g.outcome = 'ok'
      AND ($since IS NULL OR g.start_ns >= $since) AND ($until IS NULL OR g.start_ns < $until)
      AND ($model IS NULL OR g.model = $model) AND ($tenant IS NULL OR g.tenant = $tenant)
)
"""
SELECTED_SQL = _SELECTED + """
SELECT * FROM r ORDER BY request_id, model, tenant, arrival_ns, finish_ns, ttft_ns, e2e_ns, seen_at
"""

# `slo_itls`: the selected requests' ITLs (the `tokens` relation's non-NULL itl_ns of their tokens) per model and
# bucket of the requests' arrival ($origin, $width), each distinct value with how many tokens had it: a run's first
# token from `token_runs`, and each later token of a decode run from its step (all decoding requests of a span
# waited the same step), so no row per token is made.
ITLS_SQL = _SELECTED + """,
runs AS (
    SELECT r.model, $origin + (r.arrival_ns - $origin) // $width * $width AS bucket, t.trace_id, t.span_id,
           t.role, t.tokens, t.first_itl_ns
    FROM r JOIN token_runs t ON t.request_id = r.request_id
    WHERE r.seen_at = 'engine'
),
members AS (
    SELECT model, bucket, trace_id, span_id, count(*) AS members
    FROM runs WHERE role = 'decode' AND tokens > 1 GROUP BY ALL
)
SELECT model, bucket, itl_ns, sum(n)::BIGINT AS n
FROM (
    SELECT model, bucket, first_itl_ns AS itl_ns, 1 AS n FROM runs WHERE first_itl_ns IS NOT NULL
    UNION ALL
    SELECT m.model, m.bucket, s.duration_ns, m.members
    FROM members m JOIN steps s ON s.trace_id = m.trace_id AND s.span_id = m.span_id
    WHERE s.run_position > 0 AND s.duration_ns IS NOT NULL
)
GROUP BY ALL
ORDER BY ALL
"""

# `slo_gateway`: per model, the requests the gateway answered, its errors and its 429s.
GATEWAY_SQL = """
SELECT g.model, count(*) AS n,
       count(*) FILTER (WHERE g.outcome = 'error') AS errors,
       count(*) FILTER (WHERE g.http_status = 429) AS rejected
FROM component_calls g
WHERE g.component = 'gateway' AND g.model IS NOT NULL
  AND ($since IS NULL OR g.start_ns >= $since) AND ($until IS NULL OR g.start_ns < $until)
  AND ($model IS NULL OR g.model = $model) AND ($tenant IS NULL OR g.tenant = $tenant)
GROUP BY ALL
ORDER BY ALL
"""

# Over the selected requests (`r`: the rows of `slo_requests`).
_PERCENTILES = """
SELECT r.model, 'ttft' AS metric, count(r.ttft_ns) AS n,
       quantile_cont(r.ttft_ns, [0.5, 0.95, 0.99]) AS q{bucket_col}
FROM r GROUP BY ALL
UNION ALL
SELECT r.model, 'e2e', count(r.e2e_ns), quantile_cont(r.e2e_ns, [0.5, 0.95, 0.99]){bucket_col}
FROM r GROUP BY ALL
"""

_EXTENT = "SELECT min(r.arrival_ns), max(r.finish_ns), count(*) FROM r"


def _itl_overall(con: duckdb.DuckDBPyConnection, bucketed: pa.Table) -> pa.Table:
    """The ITLs per (model, ITL) across the buckets, from `slo_itls`' rows (one read of the runs instead of two)."""
    query = "SELECT model, itl_ns, sum(n)::BIGINT AS n FROM bucketed GROUP BY ALL ORDER BY ALL"
    return con.from_arrow(bucketed).query("bucketed", query).to_arrow_table()


def _itl_percentiles(con: duckdb.DuckDBPyConnection, table: pa.Table, *, bucketed: bool) -> list[tuple[Any, ...]]:
    """Rows as `_PERCENTILES` gives them for the ITL: (model, 'itl', tokens, [p50, p95, p99][, bucket]), per model
    (and bucket of the requests' arrival), from ITLs weighted by how many tokens had each (`slo_itls`' rows, or
    their sums over the buckets)."""
    if table.num_rows == 0:
        return []
    models = table["model"].combine_chunks()
    codes = pc.dictionary_encode(models).indices
    change = _changes(pc.fill_null(codes, -1).to_numpy(zero_copy_only=False), pc.is_null(codes))
    if bucketed:
        buckets = table["bucket"].combine_chunks()
        change |= _changes(pc.fill_null(buckets, 0).to_numpy(zero_copy_only=False), pc.is_null(buckets))
    values = table["itl_ns"].to_numpy()
    weights = table["n"].to_numpy()
    out = []
    start = 0
    for end in [*(np.flatnonzero(change) + 1).tolist(), table.num_rows]:
        model = models[start].as_py()
        n = int(weights[start:end].sum())
        q = weighted_quantile_cont(con, values[start:end], weights[start:end], QUANTILES)
        out.append((model, "itl", n, q, buckets[start].as_py()) if bucketed else (model, "itl", n, q))
        start = end
    return out


def _changes(values: np.ndarray, nulls: pa.Array) -> np.ndarray:
    """Whether each row after the first differs from the one before it (a null equals only a null)."""
    null = nulls.to_numpy(zero_copy_only=False)
    return (values[1:] != values[:-1]) | (null[1:] != null[:-1])


def weighted_quantile_cont(con: Any, values: Any, weights: Any, quantiles: tuple[float, ...]) -> list[float]:
    """DuckDB's `quantile_cont` of the multiset holding each of the ascending, distinct int64 `values` `weights`
    times, without a row per item: the values at positions floor and ceil of (n - 1)·q are found from the
    cumulative weights, and DuckDB (connection `con`) interpolates between them, so the result is its own to the
    last bit (`quantile_cont` of the two values at the fraction is that interpolation)."""
    cumulative = np.cumsum(weights)
    total = int(cumulative[-1])
    out: list[float] = []
    between: dict[int, tuple[int, int, float]] = {}  # quantile's place → (low value, high value, fraction)
    for i, q in enumerate(quantiles):
        position = (total - 1) * q
        low, high = math.floor(position), math.ceil(position)
        lo = int(values[int(np.searchsorted(cumulative, low, side="right"))])
        out.append(float(lo))
        if low != high:
            hi = int(values[int(np.searchsorted(cumulative, high, side="right"))])
            between[i] = (lo, hi, position - low)
    for i, (lo, hi, fraction) in between.items():
        out[i] = con.execute("SELECT quantile_cont(v, $fraction) FROM (SELECT unnest($v::BIGINT[]) AS v)",
                             {"v": [lo, hi], "fraction": fraction}).fetchall()[0][0]
    return out


def _ms(ns: Any) -> float | None:
    return None if ns is None else float(ns) / 1e6


def _severity(observed: float | None, threshold: float, critical_ratio: float) -> str:
    if observed is None:
        return "unknown"
    if observed <= threshold:
        return "ok"
    return "critical" if observed >= critical_ratio * threshold else "warning"


def bucket_width_ns(span_ns: int, target_buckets: int = 60) -> int:
    """A round bucket width (1, 2, 5, 10, 15, 30 s, 1, 2, 5, 10, 15, 30 min, 1 h) giving about
    `target_buckets` buckets over `span_ns`."""
    widths_s = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
    wanted = span_ns / max(target_buckets, 1) / 1e9
    return next((w for w in widths_s if w >= wanted), widths_s[-1]) * 10**9


def slo_summary(store: Store, *, since_ns: int | None = None, until_ns: int | None = None, model: str | None = None,
                tenant: str | None = None, targets: tuple[SloTarget, ...] = DEFAULT_TARGETS,
                critical_ratio: float = 2.0, bucket_ns: int | None = None) -> SloSummary:
    """Percentiles per model and per time bucket for the selected requests, checked against `targets`."""
    params = {"since": since_ns, "until": until_ns, "model": model, "tenant": tenant}
    if not store.pushes_down("slo_requests"):
        from infertrace.analyzers import materialize_once

        materialize_once(store, ("requests", "token_runs", "component_calls"))  # read by each aggregation below
    con = duckdb.connect()
    con.register("r", store.aggregate("slo_requests", SELECTED_SQL, params).to_arrow_table())
    start, end, _count = con.execute(_EXTENT).fetchall()[0]
    if bucket_ns is None:
        bucket_ns = bucket_width_ns((end - start) if start is not None else 0)
    bound = {**params, "origin": start, "width": bucket_ns}
    bucketed = (store.aggregate("slo_itls", ITLS_SQL, bound).to_arrow_table() if start is not None
                else pa.table({"model": pa.array([], pa.string()), "itl_ns": pa.array([], pa.int64()),
                               "n": pa.array([], pa.int64())}))
    overall: dict[tuple[str, str], Percentiles] = {}
    rows = con.execute(_PERCENTILES.format(bucket_col="")).fetchall()
    for row_model, metric, n, q in rows + _itl_percentiles(con, _itl_overall(con, bucketed), bucketed=False):
        qs = list(q) if q is not None else [None, None, None]
        overall[(row_model, metric)] = Percentiles(int(n), *(_ms(v) for v in qs))
    gateway = {row[0]: row[1:] for row in store.aggregate("slo_gateway", GATEWAY_SQL, params).fetchall()}
    models = sorted({m for m, _ in overall} | set(gateway))
    reached = dict(con.execute("SELECT model, count(*) FROM r WHERE seen_at = 'engine' GROUP BY ALL")
                   .fetchall())  # engine requests, with a first token or not
    empty = Percentiles(0, None, None, None)
    results = []
    for name in models:
        n_gw, errors, rejected = gateway.get(name, (0, 0, 0))
        pct = {metric: overall.get((name, metric), empty) for metric in METRICS}
        engine_requests = int(reached.get(name, 0))
        slo = ModelSlo(name, int(n_gw), int(errors), int(rejected), engine_requests, pct["ttft"], pct["itl"],
                       pct["e2e"], ())
        checks = []
        for t in targets:
            if t.quantile is None:
                observed = slo.error_rate if t.metric == "error_rate" else slo.rejected_rate
            else:
                observed = pct[t.metric].at(t.quantile)
            checks.append(SloCheck(t, observed, _severity(observed, t.threshold, critical_ratio)))
        results.append(ModelSlo(name, int(n_gw), int(errors), int(rejected), engine_requests, pct["ttft"],
                                pct["itl"], pct["e2e"], tuple(checks)))
    buckets = _buckets(con, bound, bucketed, targets) if start is not None else ()
    return SloSummary(since_ns, until_ns, start, end, model, tenant, targets, critical_ratio, bucket_ns,
                      tuple(results), buckets)


def _buckets(con: duckdb.DuckDBPyConnection, bound: dict[str, Any], itls: pa.Table,
             targets: tuple[SloTarget, ...]) -> tuple[SloBucket, ...]:
    """Percentiles per model and bucket (`con`: the selected requests as `r`; `bound`: the buckets' $origin and
    $width; `itls`: `slo_itls`' rows)."""
    bucket_col = ", $origin + (r.arrival_ns - $origin) // $width * $width AS bucket"
    sql = _PERCENTILES.format(bucket_col=bucket_col)
    counts_sql = "SELECT r.model, $origin + (r.arrival_ns - $origin) // $width * $width, count(*) FROM r GROUP BY ALL"
    grid = {"origin": bound["origin"], "width": bound["width"]}
    values: dict[tuple[str, int], dict[str, float | None]] = {}
    rows = con.execute(sql, grid).fetchall()
    for row_model, metric, _n, q, bucket in rows + _itl_percentiles(con, itls, bucketed=True):
        cell = values.setdefault((row_model, int(bucket)), {})
        for quantile, v in zip(QUANTILES, q or [None] * 3, strict=True):
            cell[f"{metric}_p{round(quantile * 100)}_ms"] = _ms(v)
    requests = {(m, int(b)): int(n) for m, b, n in con.execute(counts_sql, grid).fetchall()}
    out = []
    for (row_model, bucket), cell in sorted(values.items()):
        breached = tuple(t.key for t in targets if t.quantile is not None
                         and (cell.get(t.key) or 0.0) > t.threshold)
        full = {f"{m}_p{round(q * 100)}_ms": cell.get(f"{m}_p{round(q * 100)}_ms") for m in METRICS for q in QUANTILES}
        out.append(SloBucket(row_model, bucket, requests.get((row_model, bucket), 0), full, breached))
    return tuple(out)
