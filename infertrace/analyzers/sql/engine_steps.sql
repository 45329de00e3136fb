-- engine_steps: one row per `engine_step` span (a step, or a run of decode steps with unchanged
-- membership), with the work it did and the mean time of its steps.
--
-- Answers: is an engine slow for the work it is given? A step's time follows its work (prefill tokens,
-- decode tokens, context); an engine regression makes the same work slower, while a burst of requests only
-- makes the work larger. Root-cause ranking fits each engine's step time to its work outside the incident
-- and asks how many steps during the incident took longer than that fit allows.
-- Parameters: none.
-- Order: every column. Root-cause ranking sums floats in row order: its result must not depend on the order
-- in which DuckDB's threads, or the backend, happen to return rows.
-- Columns: instance, model, start_ns, steps, step_ns (mean duration of the span's steps, pauses excluded),
--   prefill_tokens, decode_tokens, context_tokens (sum of the decoding requests' context at the first step).
SELECT
    "res.service.instance.id" AS instance,
    "res.infertrace.engine.model" AS model,
    start_ns,
    coalesce("attr.infertrace.step.count", 1) AS steps,
    (end_ns - start_ns - coalesce("attr.infertrace.step.pause_ns", 0)) / coalesce("attr.infertrace.step.count", 1)
        AS step_ns,
    coalesce("attr.infertrace.step.prefill_tokens", 0) AS prefill_tokens,
    coalesce("attr.infertrace.step.decode_tokens", 0) AS decode_tokens,
    coalesce("attr.infertrace.step.decode.context_tokens", 0) AS context_tokens
FROM spans
WHERE name = 'engine_step'
ORDER BY ALL
