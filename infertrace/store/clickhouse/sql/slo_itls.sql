-- slo_itls (ClickHouse form of infertrace/analyzers/slo.py's ITLS_SQL): the ITLs of the requests the SLO summary
-- selects, per model and bucket of the requests' arrival, each distinct value with how many tokens had it.
--
-- Answers: the SLO summary's ITL percentiles (whole window and per bucket), without a row per token: a run's first
-- token from `token_runs`, every later token of a decode run from its span's step durations.
-- Parameters: {since}, {until} (ns; NULL for no bound), {model}, {tenant} (NULL for all); {origin}, {width}: the
-- buckets (ns).
-- Columns: model, bucket, itl_ns, n.
-- {slo_requests} is this folder's twin of the selection; {token_runs}, {spans}: relations/ and the typed spans.
WITH
r AS ({slo_requests}),
runs AS (
    SELECT r.model AS model,
           {origin:Int64} + intDiv(r.arrival_ns - {origin:Int64}, {width:Int64}) * {width:Int64} AS bucket,
           t.trace_id AS trace_id, t.span_id AS span_id, t.role AS role, t.tokens AS tokens,
           t.first_itl_ns AS first_itl_ns
    FROM r JOIN ({token_runs}) t ON t.request_id = r.request_id
    WHERE r.seen_at = 'engine'
),
members AS (
    SELECT model, bucket, trace_id, span_id, toInt64(count()) AS members
    FROM runs WHERE role = 'decode' AND tokens > 1 GROUP BY model, bucket, trace_id, span_id
),
later_steps AS (
    -- every step of a step span after its first (DuckDB: `steps` with run_position > 0)
    SELECT trace_id, span_id, durations[i] AS duration_ns
    FROM (SELECT trace_id, span_id,
                 JSONExtract(coalesce("attr.infertrace.step.durations_ns", '[]'), 'Array(Int64)') AS durations
          FROM ({spans}) WHERE name = 'engine_step')
    ARRAY JOIN arrayEnumerate(durations) AS i
    WHERE i > 1
)
SELECT model, bucket, itl_ns, toInt64(sum(n)) AS n
FROM (
    SELECT model, bucket, first_itl_ns AS itl_ns, toInt64(1) AS n FROM runs WHERE first_itl_ns IS NOT NULL
    UNION ALL
    SELECT m.model, m.bucket, s.duration_ns, m.members
    FROM members m JOIN later_steps s ON s.trace_id = m.trace_id AND s.span_id = m.span_id
)
GROUP BY model, bucket, itl_ns
ORDER BY model, bucket, itl_ns
