-- slo_requests (ClickHouse form of infertrace/analyzers/slo.py's SELECTED_SQL): the requests the SLO summary
-- selects, with TTFT and E2E as the client sees them (from the gateway span's start when the trace has one, else
-- from arrival at the engine).
--
-- Answers: the rows the SLO summary's percentiles, extent and per-bucket counts are computed from: one per request,
-- not the request's spans.
-- Parameters: {since}, {until} (ns; NULL for no bound), {model}, {tenant} (NULL for all).
-- Columns: request_id, model, tenant, arrival_ns, finish_ns, ttft_ns, e2e_ns, seen_at ('engine'; 'entry' for a
-- request its gateway answered without error whose trace reaches no engine span: E2E is its entry span, no TTFT).
-- {requests}, {component_calls}: the ClickHouse forms of the relations (relations/).
SELECT request_id, model, tenant, client_arrival_ns AS arrival_ns, finish_ns, ttft_ns, e2e_ns, seen_at
FROM (
    SELECT q.request_id AS request_id, q.model AS model, q.tenant AS tenant,
           coalesce(g.start_ns, q.arrival_ns) AS client_arrival_ns, q.finish_ns AS finish_ns,
           q.first_token_ns - client_arrival_ns AS ttft_ns, q.finish_ns - client_arrival_ns AS e2e_ns,
           'engine' AS seen_at
    FROM ({requests}) q
    LEFT JOIN (SELECT trace_id, start_ns FROM ({component_calls}) WHERE component = 'gateway') g
      ON g.trace_id = q.trace_id
    WHERE ({since:Nullable(Int64)} IS NULL OR client_arrival_ns >= {since:Nullable(Int64)})
      AND ({until:Nullable(Int64)} IS NULL OR client_arrival_ns < {until:Nullable(Int64)})
      AND ({model:Nullable(String)} IS NULL OR q.model = {model:Nullable(String)})
      AND ({tenant:Nullable(String)} IS NULL OR q.tenant = {tenant:Nullable(String)})
    UNION ALL
    SELECT g.request_id, g.model, g.tenant, g.start_ns, g.end_ns, CAST(NULL AS Nullable(Int64)),
           g.end_ns - g.start_ns, 'entry'
    FROM ({component_calls}) g
    WHERE g.component = 'gateway' AND g.model IS NOT NULL AND g.outcome = 'ok'
      AND g.trace_id NOT IN (SELECT trace_id FROM ({requests}))
      AND ({since:Nullable(Int64)} IS NULL OR g.start_ns >= {since:Nullable(Int64)})
      AND ({until:Nullable(Int64)} IS NULL OR g.start_ns < {until:Nullable(Int64)})
      AND ({model:Nullable(String)} IS NULL OR g.model = {model:Nullable(String)})
      AND ({tenant:Nullable(String)} IS NULL OR g.tenant = {tenant:Nullable(String)})
)
ORDER BY request_id, model, tenant, client_arrival_ns, finish_ns, ttft_ns, e2e_ns, seen_at
