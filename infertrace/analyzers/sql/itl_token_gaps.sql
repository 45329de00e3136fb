-- itl_token_gaps: one row per decode run of a request (a decode membership of an `engine_step` span) with
-- the gap before its first token: the steps between the request's previous token and that token.
--
-- Answers: which steps stood between two consecutive tokens of a request. The first token of a decode run
-- waited for every step in (prev_last_step_index, first_step_index]; the run's later tokens each waited
-- for one decode-only step. An ITL spike's culprits are the prefills in the first set.
-- Parameters: none.
-- Columns: request_id, instance, first_step_index, prev_last_step_index, gap_steps (steps in the gap),
--   tokens_before (tokens the request had received on this instance before the run), tokens (in the run),
--   itl_ns (the run's first token's ITL: end of step first_step_index − end of step prev_last_step_index,
--   from the memberships' step end times, so no join to `steps` is needed; NULL when a span has no step
--   durations).
-- Runs are counted per (request, instance): with disaggregation the first token comes from a prefill worker
-- and the decode worker's first run has no previous token there.
WITH runs AS (
    SELECT request_id, instance, first_step_index, role, tokens, first_step_end_ns, trace_id, span_id,
           first_step_index + CASE WHEN role = 'decode' THEN run_steps ELSE 1 END - 1 AS last_step_index,
           CASE WHEN role = 'decode' THEN last_step_end_ns ELSE first_step_end_ns END AS last_step_end_ns
    FROM step_membership
    WHERE role = 'decode' OR (role = 'prefill' AND samples_token)
),
ordered AS (
    SELECT *,
           lag(last_step_index) OVER w AS prev_last_step_index,
           lag(last_step_end_ns) OVER w AS prev_last_step_end_ns,
           coalesce(sum(tokens) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS tokens_before
    FROM runs
    -- (the span breaks ties, which only an id two engines or two runs of one share can have: the same output
    -- for the same store, on any number of threads)
    WINDOW w AS (PARTITION BY request_id, instance ORDER BY first_step_index, first_step_end_ns, trace_id, span_id)
)
SELECT request_id, instance, first_step_index, prev_last_step_index,
       first_step_index - prev_last_step_index AS gap_steps, tokens_before::BIGINT AS tokens_before, tokens,
       first_step_end_ns - prev_last_step_end_ns AS itl_ns
FROM ordered
WHERE role = 'decode' AND prev_last_step_index IS NOT NULL
