-- engine_requests: one row per engine request span, with what the engine itself did: its own time to the
-- first token (engine queue + prefill, from the request's arrival at the engine) and its decode time per
-- output token.
--
-- Answers: is an engine itself slow (a regression, a slower kernel), as opposed to the requests reaching it
-- late? Root-cause ranking reads an engine's own anomaly from these rows, as it reads a router's from its
-- route spans.
-- Parameters: none.
-- Order: every column. Root-cause ranking sums floats in row order: its result must not depend on the order
-- in which DuckDB's threads, or the backend, happen to return rows.
-- Columns: trace_id, instance, model, arrival_ns, engine_ttft_ns, engine_queue_ns (arrival at the engine to first
--   scheduling: part of engine_ttft_ns), tpot_ns (NULL with fewer than two output tokens), failed (the engine
--   failed the request; not when it refused a prompt longer than it accepts, `prompt_too_long`: that request could
--   never be served as made, vLLM answers it 400, and a tenant sending such prompts does not make the engine, or a
--   prefill pool, a failing one).
SELECT
    trace_id,
    instance,
    model,
    arrival_ns,
    ttft_ns AS engine_ttft_ns,
    queue_ns AS engine_queue_ns,
    CASE WHEN output_tokens > 1 THEN decode_ns / (output_tokens - 1) END AS tpot_ns,
    outcome = 'error' AND error_type IS DISTINCT FROM 'prompt_too_long' AS failed
FROM request_legs
WHERE instance IS NOT NULL
ORDER BY ALL
