-- request_outcomes: one row per request as the caller saw it, with the latencies and outcomes that anomaly
-- detection scores, and the attributes that commonality analysis compares.
--
-- The caller's view is the request's entry span (component_calls role 'entry': a gateway's or proxy's span,
-- whatever its name) when the trace has one; without any gateway span it is the engine's own request span
-- (vLLM, SGLang or TGI alone), so detection still runs per model from the engines' spans: arrival, TTFT and
-- E2E are then the engine's, and rejections before the engine are not seen.
-- Answers: when did each request arrive, did it fail (5xx), was it rate limited (429), how long did the
-- caller wait for the first token (TTFT, including auth, rate limiting, queueing and routing), how fast did
-- tokens then come (decode time per output token), did the generation run to its token limit.
-- Parameters: none (the whole store; callers filter by time). A ClickHouse store runs its twin,
--   infertrace/store/clickhouse/sql/request_outcomes.sql.
-- Columns: trace_id, request_id, model, tenant, arrival_ns, end_ns, e2e_ns, http_status, failed, rejected,
--   ttft_ns (NULL when no token came), tpot_ns (NULL with fewer than two output tokens), pre_engine_ns
--   (entry arrival to the engine's; 0 without an entry), input_tokens, output_tokens, max_tokens, cached_tokens,
--   assistant_prefill_tokens, system_prompt_id, finish_reason, truncated (finished by length), route_target,
--   seen_at ('entry' | 'engine'), resend_count (the client's retry number, `http.request.resend_count` on the
--   entry; NULL on a first attempt or unknown).
-- A disaggregated request has two engine request spans (prefill worker, decode worker): the caller's first
-- token is the one the decode worker streams (after the KV transfer), the decode rate is the decode worker's.
WITH gw AS (
    SELECT trace_id, start_ns, end_ns, request_id, model, tenant, http_status, status_code, input_tokens,
           output_tokens, resend_count
    FROM component_calls WHERE role = 'entry'
),
eng AS (
    SELECT trace_id,
           min(arrival_ns) AS engine_arrival_ns,
           max(finish_ns) AS engine_finish_ns,
           arg_max(first_token_ns, finish_ns) AS first_token_ns,
           arg_max(decode_ns, finish_ns) AS decode_ns,
           arg_max(output_tokens, finish_ns) AS engine_output_tokens,
           arg_max(max_tokens, finish_ns) AS max_tokens,
           arg_max(finish_reason, finish_ns) AS finish_reason,
           max(cached_tokens) AS cached_tokens,
           max(assistant_prefill_tokens) AS assistant_prefill_tokens,
           any_value(system_prompt_id) AS system_prompt_id,
           any_value(model) AS engine_model,
           any_value(tenant) AS engine_tenant,
           any_value(request_id) AS engine_request_id,
           max(input_tokens) AS engine_input_tokens,
           bool_or(outcome = 'error') AS engine_failed
    FROM requests GROUP BY trace_id
),
route AS (
    SELECT trace_id, any_value(route_target) AS route_target
    FROM component_calls WHERE component = 'route' GROUP BY trace_id
),
caller AS (
    SELECT g.trace_id, g.request_id, g.model, g.tenant, g.start_ns, g.end_ns, g.http_status, g.status_code,
           g.input_tokens, g.output_tokens, 'entry' AS seen_at, g.resend_count
    FROM gw g
    UNION ALL
    SELECT e.trace_id, NULL, NULL, NULL, e.engine_arrival_ns, e.engine_finish_ns, NULL::BIGINT,
           CASE WHEN e.engine_failed THEN 2 ELSE 0 END, NULL::BIGINT, NULL::BIGINT, 'engine', NULL::BIGINT
    FROM eng e ANTI JOIN gw g ON g.trace_id = e.trace_id
)
SELECT
    g.trace_id,
    coalesce(g.request_id, e.engine_request_id) AS request_id,
    coalesce(g.model, e.engine_model) AS model,
    coalesce(g.tenant, e.engine_tenant) AS tenant,
    g.start_ns AS arrival_ns,
    g.end_ns,
    g.end_ns - g.start_ns AS e2e_ns,
    g.http_status,
    (g.http_status >= 500 OR (g.http_status IS NULL AND g.status_code = 2)) AS failed,
    coalesce(g.http_status = 429, false) AS rejected,
    CASE WHEN e.first_token_ns IS NOT NULL AND coalesce(g.http_status, 200) < 400
         THEN e.first_token_ns - g.start_ns END AS ttft_ns,
    CASE WHEN coalesce(g.output_tokens, e.engine_output_tokens) > 1 AND coalesce(g.http_status, 200) < 400
         THEN e.decode_ns / (coalesce(g.output_tokens, e.engine_output_tokens) - 1) END AS tpot_ns,
    e.engine_arrival_ns - g.start_ns AS pre_engine_ns,
    coalesce(g.input_tokens, e.engine_input_tokens) AS input_tokens,
    coalesce(g.output_tokens, e.engine_output_tokens) AS output_tokens,
    e.max_tokens,
    e.cached_tokens,
    e.assistant_prefill_tokens,
    e.system_prompt_id,
    e.finish_reason,
    coalesce(e.finish_reason = 'length', false) AS truncated,
    r.route_target,
    g.seen_at,
    g.resend_count
FROM caller g
LEFT JOIN eng e ON e.trace_id = g.trace_id
LEFT JOIN route r ON r.trace_id = g.trace_id
ORDER BY g.start_ns, g.trace_id, g.end_ns, g.seen_at, request_id  -- a total order: anomaly scores sum in it
