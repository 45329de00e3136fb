-- tokens: one row per generated token, at the end of the step that produced it, with its inter-token
-- latency.
--
-- Answers: when did each request receive each token; which step produced it; what was the gap since the
-- previous token (ITL). An ITL spike is a token whose itl_ns is far above the engine's decode step time.
-- Columns: request_id, instance, token_index (0-based per request and engine; 0 is the first token), time_ns,
--   itl_ns (time since the request's previous token on the same engine; NULL for its first token there),
--   step_index, trace_id and span_id of the step span, from_prefill (true when a prefill chunk that completed
--   the prompt produced the token: the first token, or the first after a preemption), handover_ns (on the
--   first token a request gets on an engine after tokens on another: the time since that other engine's last
--   token. With disaggregation that is the decode worker's first token, and the gap is the KV transfer, the
--   decode worker's queue and its one-token recompute: labelled here, never counted as an ITL or a stall).
-- Tokens are counted per (request, engine): a disaggregated request's prefill worker produces one token (its
-- leg's, which the client never receives; `request_legs` role 'prefill') and its decode worker all the
-- client's tokens, from token_index 0.
-- A request in a span's decode list gets one token at the end of every step of the span; a prefilling
-- request whose chunk completed its prompt gets one at the end of that step. Differences are exact int64.
-- Cost: within a run of steps a token's ITL is that step's duration, so only the first token of each
-- (request, span) needs the request's previous token: the window runs over memberships, not over tokens.
-- Engines without step spans that still time each token (infertrace/sources/): SGLang's scheduler ends a
-- `prefill_forward` slice at the first token and a `decode_loop` slice at each later one (trace level 3); TGI
-- opens a `send_generation` span per token. Their tokens have no step (step_index NULL; trace_id and span_id
-- are the token's own span), and their instance is the request's.
WITH produced AS (
    SELECT request_id, instance, trace_id, span_id, role, start_ns,
           CASE WHEN role = 'decode' THEN run_steps ELSE 1 END AS n,
           end_ns AS last_token_ns
    FROM step_membership
    WHERE role = 'decode' OR (role = 'prefill' AND samples_token)
),
runs AS (
    SELECT
        *,
        coalesce(sum(n) OVER (PARTITION BY request_id, instance ORDER BY start_ns
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS tokens_before,
        lag(last_token_ns) OVER (PARTITION BY request_id, instance ORDER BY start_ns) AS previous_token_ns,
        lag(last_token_ns) OVER (PARTITION BY request_id ORDER BY start_ns) AS previous_any_ns,
        lag(instance) OVER (PARTITION BY request_id ORDER BY start_ns) AS previous_instance
    FROM produced
)
SELECT
    r.request_id,
    s.instance,
    CAST(r.tokens_before + CASE WHEN r.role = 'decode' THEN s.run_position ELSE 0 END AS BIGINT) AS token_index,
    s.end_ns AS time_ns,
    CASE WHEN r.role = 'decode' AND s.run_position > 0 THEN s.duration_ns
         ELSE s.end_ns - r.previous_token_ns END AS itl_ns,
    s.step_index,
    s.trace_id,
    s.span_id,
    r.role = 'prefill' AS from_prefill,
    CASE WHEN r.previous_instance <> r.instance AND r.previous_token_ns IS NULL
              AND (r.role = 'prefill' OR s.run_position = 0)
         THEN s.end_ns - r.previous_any_ns END AS handover_ns
FROM runs r
JOIN steps s ON s.trace_id = r.trace_id AND s.span_id = r.span_id
WHERE r.role = 'decode' OR s.run_position = s.run_steps - 1
UNION ALL
SELECT request_id, instance, token_index, time_ns, itl_ns, NULL::BIGINT AS step_index, trace_id, span_id, from_prefill,
       NULL::BIGINT AS handover_ns
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
