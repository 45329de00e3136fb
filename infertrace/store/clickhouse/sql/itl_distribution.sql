-- itl_distribution (ClickHouse form of the ITL analyzer's per-engine distribution: analyzers/sql/
-- itl_token_itls.sql over itl_token_gaps.sql, summed per (instance, itl_ns)): every inter-token latency of
-- every request on each engine, with how many tokens had it.
--
-- Answers: the ITL distribution (p50, p99) of each engine, computed where the spans are; a few hundred
-- thousand rows come back rather than the spans.
-- Parameters: none. {step_spans}: pushdown.step_spans_sql.
-- Columns: instance, itl_ns, tokens.
-- As in DuckDB: a token-producing membership (a decode run, or a prefill chunk that sampled a token) of a
-- request on an engine follows its previous one there (by first step index); a decode run's first token
-- waited from the end of the previous membership's last step to the end of its own first step; every later
-- token of the run waited one decode step, so each of those steps counts its decodes once.
WITH span AS ({step_spans}),
runs AS (
    SELECT instance, request_id, first_step_index, is_decode, first_step_end_ns,
           first_step_index + if(is_decode, run_steps, 1) - 1 AS last_step_index,
           if(is_decode, last_step_end_ns, first_step_end_ns) AS last_step_end_ns
    FROM (
        SELECT instance, first_step_index, run_steps, first_step_end_ns, last_step_end_ns,
               arrayJoin(decode_ids) AS request_id, true AS is_decode
        FROM span
        UNION ALL
        SELECT instance, first_step_index, run_steps, first_step_end_ns, last_step_end_ns,
               prefill_ids[i] AS request_id, false AS is_decode
        FROM span ARRAY JOIN arrayEnumerate(prefill_ids) AS i
        WHERE samples_token[i]
    )
),
ordered AS (
    SELECT instance, is_decode, first_step_end_ns,
           lagInFrame(toNullable(last_step_index)) OVER w AS prev_last_step_index,
           lagInFrame(toNullable(last_step_end_ns)) OVER w AS prev_last_step_end_ns
    FROM runs
    WINDOW w AS (PARTITION BY request_id, instance ORDER BY first_step_index
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT instance, itl_ns, toInt64(sum(tokens)) AS tokens
FROM (
    SELECT instance, first_step_end_ns - prev_last_step_end_ns AS itl_ns, toInt64(1) AS tokens
    FROM ordered
    WHERE is_decode AND prev_last_step_index IS NOT NULL AND itl_ns IS NOT NULL
    UNION ALL
    SELECT instance, durations[i] AS itl_ns, num_decodes AS tokens
    FROM span ARRAY JOIN arrayEnumerate(durations) AS i
    WHERE i > 1
)
WHERE instance IS NOT NULL
GROUP BY instance, itl_ns
ORDER BY instance, itl_ns
