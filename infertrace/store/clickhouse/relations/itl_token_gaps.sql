-- itl_token_gaps (ClickHouse form of infertrace/analyzers/sql/itl_token_gaps.sql, which the ITL analyzer keeps as a
-- temporary table): one row per decode run of a request with the gap before its first token. Same columns, same
-- rules; read that file. Made once per snapshot, not once per range of stall candidates that reads it.
-- {step_membership}: the ClickHouse form of the relation.
WITH
runs AS (
    SELECT request_id, instance, first_step_index, role, tokens, first_step_end_ns, trace_id, span_id,
           first_step_index + if(role = 'decode', run_steps, 1) - 1 AS run_last_step_index,
           if(role = 'decode', last_step_end_ns, first_step_end_ns) AS run_last_step_end_ns
    FROM ({step_membership})
    WHERE role = 'decode' OR (role = 'prefill' AND samples_token)
),
ordered AS (
    SELECT *,
           lagInFrame(toNullable(run_last_step_index)) OVER w AS prev_last_step_index,
           lagInFrame(toNullable(run_last_step_end_ns)) OVER w AS prev_last_step_end_ns,
           coalesce(sum(tokens) OVER (PARTITION BY request_id, instance
                                      ORDER BY first_step_index, first_step_end_ns, trace_id, span_id
                                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS tokens_before
    FROM runs
    WINDOW w AS (PARTITION BY request_id, instance ORDER BY first_step_index, first_step_end_ns, trace_id, span_id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT request_id, instance, first_step_index, prev_last_step_index,
       first_step_index - prev_last_step_index AS gap_steps, toInt64(tokens_before) AS tokens_before, tokens,
       first_step_end_ns - prev_last_step_end_ns AS itl_ns
FROM ordered
WHERE role = 'decode' AND prev_last_step_index IS NOT NULL
