-- tokens: one row per generated token, at the end of the step that produced it, with its inter-token
-- latency.
--
-- Answers: when did each request receive each token; which step produced it; what was the gap since the
-- previous token (ITL). An ITL spike is a token whose itl_ns is far above the engine's decode step time.
-- Columns: request_id, instance, token_index (0-based per request; 0 is the first token), time_ns,
--   itl_ns (time since the request's previous token; NULL for its first token), step_index, trace_id and
--   span_id of the step span, from_prefill (true when a prefill chunk that completed the prompt produced
--   the token: the first token, or the first after a preemption).
-- A request in a span's decode list gets one token at the end of every step of the span; a prefilling
-- request whose chunk completed its prompt gets one at the end of that step. Differences are exact int64.
WITH produced AS (
    SELECT m.request_id, s.instance, s.step_index, s.end_ns AS time_ns, s.trace_id, s.span_id,
           false AS from_prefill
    FROM step_membership m
    JOIN steps s ON s.trace_id = m.trace_id AND s.span_id = m.span_id
    WHERE m.role = 'decode'
    UNION ALL
    SELECT m.request_id, s.instance, s.step_index, s.end_ns, s.trace_id, s.span_id, true
    FROM step_membership m
    JOIN steps s ON s.trace_id = m.trace_id AND s.span_id = m.span_id
    WHERE m.role = 'prefill' AND m.samples_token
)
SELECT
    request_id,
    instance,
    (row_number() OVER w - 1)::BIGINT AS token_index,
    time_ns,
    time_ns - lag(time_ns) OVER w AS itl_ns,
    step_index,
    trace_id,
    span_id,
    from_prefill
FROM produced
WINDOW w AS (PARTITION BY request_id ORDER BY time_ns, step_index)
