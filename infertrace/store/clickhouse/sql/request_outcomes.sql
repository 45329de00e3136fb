-- request_outcomes (ClickHouse form of infertrace/analyzers/sql/request_outcomes.sql): one row per request as the
-- caller saw it (its entry span, else its engine request span), with the latencies and outcomes anomaly detection
-- scores and the attributes commonality analysis compares. Same columns, same rules, same order; read that file.
-- Parameters: none. {requests}, {component_calls}: the ClickHouse forms of the relations (relations/).
-- DuckDB's arg_max skips a NULL argument, as ClickHouse's argMax does; `/` of integers is a float in both.
WITH
gw AS (
    SELECT trace_id, start_ns, end_ns, request_id, model, tenant, http_status, status_code, input_tokens,
           output_tokens, resend_count
    FROM ({component_calls}) WHERE role = 'entry'
),
eng AS (
    SELECT trace_id,
           min(arrival_ns) AS engine_arrival_ns,
           max(finish_ns) AS engine_finish_ns,
           argMax(first_token_ns, finish_ns) AS first_token_ns,
           argMax(decode_ns, finish_ns) AS decode_ns,
           argMax(output_tokens, finish_ns) AS engine_output_tokens,
           argMax(max_tokens, finish_ns) AS max_tokens,
           argMax(finish_reason, finish_ns) AS finish_reason,
           max(cached_tokens) AS cached_tokens,
           max(assistant_prefill_tokens) AS assistant_prefill_tokens,
           any(system_prompt_id) AS system_prompt_id,
           any(model) AS engine_model,
           any(tenant) AS engine_tenant,
           any(request_id) AS engine_request_id,
           max(input_tokens) AS engine_input_tokens,
           max(outcome = 'error') AS engine_failed
    FROM ({requests}) GROUP BY trace_id
),
route AS (
    SELECT trace_id, any(route_target) AS route_target
    FROM ({component_calls}) WHERE component = 'route' GROUP BY trace_id
),
caller AS (
    SELECT trace_id, request_id, model, tenant, start_ns, end_ns, http_status, toInt64(status_code) AS status_code,
           input_tokens, output_tokens, 'entry' AS seen_at, resend_count
    FROM gw
    UNION ALL
    SELECT trace_id, NULL, NULL, NULL, engine_arrival_ns, engine_finish_ns, CAST(NULL AS Nullable(Int64)),
           if(engine_failed, 2, 0), CAST(NULL AS Nullable(Int64)), CAST(NULL AS Nullable(Int64)), 'engine',
           CAST(NULL AS Nullable(Int64))
    FROM eng WHERE trace_id NOT IN (SELECT trace_id FROM gw)
)
SELECT
    g.trace_id AS trace_id,
    coalesce(g.request_id, e.engine_request_id) AS request_id,
    coalesce(g.model, e.engine_model) AS model,
    coalesce(g.tenant, e.engine_tenant) AS tenant,
    g.start_ns AS arrival_ns,
    g.end_ns AS end_ns,
    g.end_ns - g.start_ns AS e2e_ns,
    g.http_status AS http_status,
    CAST(g.http_status >= 500 OR (g.http_status IS NULL AND g.status_code = 2) AS Nullable(Bool)) AS failed,
    CAST(coalesce(g.http_status = 429, false) AS Bool) AS rejected,
    if(e.first_token_ns IS NOT NULL AND coalesce(g.http_status, 200) < 400, e.first_token_ns - g.start_ns, NULL)
        AS ttft_ns,
    if(coalesce(g.output_tokens, e.engine_output_tokens) > 1 AND coalesce(g.http_status, 200) < 400,
       e.decode_ns / (coalesce(g.output_tokens, e.engine_output_tokens) - 1), NULL) AS tpot_ns,
    e.engine_arrival_ns - g.start_ns AS pre_engine_ns,
    coalesce(g.input_tokens, e.engine_input_tokens) AS input_tokens,
    coalesce(g.output_tokens, e.engine_output_tokens) AS output_tokens,
    e.max_tokens AS max_tokens,
    e.cached_tokens AS cached_tokens,
    e.assistant_prefill_tokens AS assistant_prefill_tokens,
    e.system_prompt_id AS system_prompt_id,
    e.finish_reason AS finish_reason,
    CAST(coalesce(e.finish_reason = 'length', false) AS Bool) AS truncated,
    r.route_target AS route_target,
    g.seen_at AS seen_at,
    g.resend_count AS resend_count
FROM caller g
LEFT JOIN eng e ON e.trace_id = g.trace_id
LEFT JOIN route r ON r.trace_id = g.trace_id
ORDER BY g.start_ns, g.trace_id, g.end_ns, g.seen_at, request_id
