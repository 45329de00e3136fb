-- token_runs: one row per run of tokens a request received together: from one `engine_step` span (a decoding
-- request gets a token at the end of each of the span's steps; a prefill chunk that completed the prompt gets
-- one at the end of the span's last step), or a run of one from a token span of an engine without step spans
-- (SGLang's `prefill_forward` / `decode_loop` slices, TGI's `send_generation` spans).
--
-- Answers: the same questions as `tokens`, without a row per token. Every token of a decode run after its first
-- waited exactly one step of its span (that step's duration_ns in `steps`), so only the run's first token needs
-- the request's previous one: `tokens` expands these runs, and aggregates over tokens (ITL percentiles, token
-- counts, an ITL heatmap) read the runs and the spans' steps instead of every token.
-- Columns: request_id, instance, trace_id, span_id (the step span, or the token's own span), role ('decode' |
--   'prefill' | 'span'), tokens (tokens in the run: the span's steps for a decode member, 1 otherwise),
--   tokens_before (tokens the request received on this engine before the run: the token_index of its first),
--   first_token_ns (time of the run's first token), first_itl_ns (its ITL: time since the request's previous
--   token on the same engine; NULL for the first there), from_prefill, handover_ns (as in `tokens`: on the first
--   token a request gets on an engine after tokens on another, the time since that other engine's last token).
-- A step span without step durations gives no token times: its runs are left out (their tokens still count in
-- later runs' tokens_before).
WITH produced AS MATERIALIZED (
    SELECT request_id, instance, trace_id, span_id, role, start_ns,
           CASE WHEN role = 'decode' THEN run_steps ELSE 1 END AS n,
           end_ns AS last_token_ns,
           CASE WHEN role = 'decode' THEN first_step_end_ns ELSE last_step_end_ns END AS first_token_ns
    FROM step_membership
    WHERE role = 'decode' OR (role = 'prefill' AND samples_token)
),
-- Requests with runs on several engines (a disaggregated request's prefill and decode workers). Every other request
-- has all its runs on one engine, where the runs per (request, engine) are the runs per request: one window
-- (one sort of the runs) gives both the previous run on the engine and on any engine.
several AS (
    SELECT request_id FROM produced GROUP BY request_id HAVING min(instance) <> max(instance)
),
single_runs AS (
    SELECT
        *,
        coalesce(sum(n) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS tokens_before,
        lag(last_token_ns) OVER w AS previous_token_ns,
        NULL::BIGINT AS previous_any_ns,
        NULL::VARCHAR AS previous_instance
    FROM produced ANTI JOIN several s ON s.request_id IS NOT DISTINCT FROM produced.request_id
    WINDOW w AS (PARTITION BY request_id ORDER BY start_ns)
),
several_runs AS (
    SELECT
        *,
        coalesce(sum(n) OVER (PARTITION BY request_id, instance ORDER BY start_ns
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS tokens_before,
        lag(last_token_ns) OVER (PARTITION BY request_id, instance ORDER BY start_ns) AS previous_token_ns,
        lag(last_token_ns) OVER (PARTITION BY request_id ORDER BY start_ns) AS previous_any_ns,
        lag(instance) OVER (PARTITION BY request_id ORDER BY start_ns) AS previous_instance
    FROM produced SEMI JOIN several s ON s.request_id IS NOT DISTINCT FROM produced.request_id
),
runs AS (
    SELECT * FROM single_runs
    UNION ALL
    SELECT * FROM several_runs
)
SELECT
    request_id, instance, trace_id, span_id, role, n::BIGINT AS tokens,
    CAST(tokens_before AS BIGINT) AS tokens_before,
    first_token_ns,
    first_token_ns - previous_token_ns AS first_itl_ns,
    role = 'prefill' AS from_prefill,
    CASE WHEN previous_instance <> instance AND previous_token_ns IS NULL
         THEN first_token_ns - previous_any_ns END AS handover_ns
FROM runs
WHERE first_token_ns IS NOT NULL
UNION ALL
SELECT request_id, instance, trace_id, span_id, 'span', 1::BIGINT, token_index, time_ns, itl_ns, from_prefill,
       NULL::BIGINT
FROM (
    SELECT
        r.request_id, r.instance, t.time_ns, t.trace_id, t.span_id,
        row_number() OVER w - 1 AS token_index,
        t.time_ns - lag(t.time_ns) OVER w AS itl_ns,
        row_number() OVER w = 1 AS from_prefill
    FROM (
        SELECT trace_id, span_id, CASE WHEN name = 'send_generation' THEN start_ns ELSE end_ns END AS time_ns
        FROM spans WHERE name IN ('prefill_forward', 'decode_loop', 'send_generation')
    ) t
    JOIN (SELECT request_id, instance, trace_id FROM request_legs WHERE source IN ('sglang', 'tgi')) r
      ON r.trace_id = t.trace_id
    WINDOW w AS (PARTITION BY r.request_id, r.instance ORDER BY t.time_ns, t.span_id)
)
