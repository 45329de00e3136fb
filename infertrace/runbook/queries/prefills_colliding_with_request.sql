-- title: Prefills that collided with a request's slow tokens
-- question: For each of request X's slowest tokens, which prefills ran in the engine steps between the
--   previous token and that one, how big were they, and whose were they?
-- when: A user reports one slow or stuttering stream and you have its request id (gen_ai.request.id).
-- param request_id text: The request whose tokens to explain.
-- param top int = 10: How many of its slowest tokens to explain.
-- example: request_id=tenant-a-000010
WITH slow AS (
    SELECT request_id, instance, token_index, time_ns, itl_ns,
           time_ns - itl_ns AS previous_ns
    FROM tokens
    WHERE request_id = $request_id AND itl_ns IS NOT NULL
    ORDER BY itl_ns DESC, token_index
    LIMIT $top
),
between_steps AS (
    SELECT s.token_index, st.trace_id, st.span_id, st.step_index, st.duration_ns
    FROM slow s
    JOIN steps st ON st.instance = s.instance AND st.end_ns > s.previous_ns AND st.end_ns <= s.time_ns
)
SELECT
    s.token_index,
    make_timestamp_ns(s.time_ns) AS token_time,
    round(s.itl_ns / 1e6, 3) AS itl_ms,
    s.instance,
    b.step_index,
    round(b.duration_ns / 1e6, 3) AS step_ms,
    m.request_id AS prefill_request_id,
    r.tenant AS prefill_tenant,
    m.chunk_tokens,
    m.computed_tokens AS cached_before_chunk,
    r.input_tokens AS prefill_prompt_tokens
FROM slow s
JOIN between_steps b ON b.token_index = s.token_index
JOIN step_membership m ON m.trace_id = b.trace_id AND m.span_id = b.span_id AND m.role = 'prefill'
LEFT JOIN requests r ON r.request_id = m.request_id
WHERE m.request_id <> s.request_id
ORDER BY s.itl_ns DESC, s.token_index, m.chunk_tokens DESC, b.step_index, m.request_id
