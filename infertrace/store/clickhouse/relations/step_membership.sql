-- step_membership (ClickHouse form of infertrace/store/relations/step_membership.sql): which requests took part
-- in each `engine_step` span, and how. Same columns, same rules; read that file for what each column means. Kept
-- beside it: a change there is made here too, and tests/test_store_clickhouse.py holds the two to the same rows on
-- every sample. DuckDB's unnest pads a shorter parallel list with NULL: the per-chunk lists are read as arrays of
-- Nullable here, whose out-of-range element is NULL.
-- {spans}: the window's spans, typed (pushdown.spans_sql; list keys as JSON text).
WITH span AS (
    SELECT
        trace_id, span_id, start_ns, end_ns,
        "res.service.instance.id" AS instance,
        "attr.infertrace.step.index" AS first_step_index,
        JSONExtract(coalesce("attr.infertrace.step.durations_ns", '[]'), 'Array(Int64)') AS durations,
        if("attr.infertrace.step.durations_ns" IS NOT NULL, toInt64(length(durations)),
           "attr.infertrace.step.count") AS run_steps,
        JSONExtract(coalesce("attr.infertrace.step.decode.request_ids", '[]'), 'Array(String)') AS decode_ids,
        JSONExtract(coalesce("attr.infertrace.step.prefill.request_ids", '[]'), 'Array(String)') AS prefill_ids,
        JSONExtract(coalesce("attr.infertrace.step.prefill.chunk_tokens", '[]'), 'Array(Nullable(Int64))')
            AS chunk_tokens,
        JSONExtract(coalesce("attr.infertrace.step.prefill.computed_tokens", '[]'), 'Array(Nullable(Int64))')
            AS computed_tokens,
        JSONExtract(coalesce("attr.infertrace.step.prefill.samples_token", '[]'), 'Array(Nullable(Bool))')
            AS samples_token,
        JSONExtract(coalesce("attr.infertrace.step.preempted.request_ids", '[]'), 'Array(String)') AS preempted_ids,
        if(length(durations) > 0, start_ns + durations[1], NULL) AS first_step_end_ns,
        if(length(durations) > 0, start_ns + arraySum(durations), NULL) AS last_step_end_ns
    FROM ({spans})
    WHERE name = 'engine_step'
)
SELECT instance, trace_id, span_id, first_step_index, run_steps, start_ns, end_ns, arrayJoin(decode_ids) AS request_id,
       'decode' AS role, CAST(NULL AS Nullable(Int64)) AS chunk_tokens, CAST(NULL AS Nullable(Int64)) AS computed_tokens,
       CAST(NULL AS Nullable(Bool)) AS samples_token, run_steps AS tokens, first_step_end_ns, last_step_end_ns
FROM span
UNION ALL
SELECT instance, trace_id, span_id, first_step_index, run_steps, start_ns, end_ns, prefill_ids[i],
       'prefill', chunk_tokens[i], computed_tokens[i], samples_token[i],
       toNullable(toInt64(if(coalesce(samples_token[i], false), 1, 0))), first_step_end_ns, last_step_end_ns
FROM span ARRAY JOIN arrayEnumerate(prefill_ids) AS i
UNION ALL
SELECT instance, trace_id, span_id, first_step_index, run_steps, start_ns, end_ns, arrayJoin(preempted_ids),
       'preempted', NULL, NULL, NULL, toNullable(toInt64(0)), first_step_end_ns, last_step_end_ns
FROM span
