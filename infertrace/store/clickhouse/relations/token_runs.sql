-- token_runs (ClickHouse form of infertrace/store/relations/token_runs.sql, with the step memberships of
-- step_membership.sql it reads): one row per run of tokens a request received together, from an `engine_step`
-- span or a token span of an engine without step spans (SGLang, TGI). Same columns, same rules; read those files
-- for what each column means. Kept beside them: a change there is made here too, and
-- tests/test_store_clickhouse.py holds the two to the same rows on every sample.
-- One window per (request, engine) gives what DuckDB's two (requests on one engine / on several) give: on one
-- engine the runs per request are the runs per (request, engine), and the previous run on another engine, read
-- over the request's runs, is never there.
-- {spans}: the window's spans, typed (pushdown.spans_sql; list keys as JSON text); {request_legs}: its ClickHouse
-- form.
WITH
span AS (
    SELECT
        trace_id, span_id, start_ns, end_ns,
        "res.service.instance.id" AS instance,
        JSONExtract(coalesce("attr.infertrace.step.durations_ns", '[]'), 'Array(Int64)') AS durations,
        if("attr.infertrace.step.durations_ns" IS NOT NULL, toInt64(length(durations)),
           "attr.infertrace.step.count") AS run_steps,
        JSONExtract(coalesce("attr.infertrace.step.decode.request_ids", '[]'), 'Array(String)') AS decode_ids,
        JSONExtract(coalesce("attr.infertrace.step.prefill.request_ids", '[]'), 'Array(String)') AS prefill_ids,
        JSONExtract(coalesce("attr.infertrace.step.prefill.samples_token", '[]'), 'Array(Bool)') AS samples_token,
        if(length(durations) > 0, start_ns + durations[1], NULL) AS first_step_end_ns,
        if(length(durations) > 0, start_ns + arraySum(durations), NULL) AS last_step_end_ns
    FROM ({spans})
    WHERE name = 'engine_step'
),
produced AS (
    SELECT arrayJoin(decode_ids) AS request_id, instance, trace_id, span_id, 'decode' AS role, start_ns,
           run_steps AS n, end_ns AS last_token_ns, first_step_end_ns AS first_token_ns
    FROM span
    UNION ALL
    SELECT prefill_ids[i], instance, trace_id, span_id, 'prefill', start_ns, toNullable(toInt64(1)), end_ns,
           last_step_end_ns
    FROM span ARRAY JOIN arrayEnumerate(prefill_ids) AS i
    WHERE samples_token[i]
),
runs AS (
    SELECT
        *,
        coalesce(sum(n) OVER (PARTITION BY request_id, instance ORDER BY start_ns
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS tokens_before,
        lagInFrame(toNullable(last_token_ns)) OVER (PARTITION BY request_id, instance ORDER BY start_ns
                                                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
            AS previous_token_ns,
        lagInFrame(toNullable(last_token_ns)) OVER (PARTITION BY request_id ORDER BY start_ns
                                                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
            AS previous_any_ns,
        lagInFrame(toNullable(instance)) OVER (PARTITION BY request_id ORDER BY start_ns
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
            AS previous_instance
    FROM produced
)
SELECT
    request_id, instance, trace_id, span_id, role, toInt64(n) AS tokens,
    toInt64(tokens_before) AS tokens_before,
    first_token_ns,
    first_token_ns - previous_token_ns AS first_itl_ns,
    role = 'prefill' AS from_prefill,
    if(previous_instance <> instance AND previous_token_ns IS NULL, first_token_ns - previous_any_ns, NULL)
        AS handover_ns
FROM runs
WHERE first_token_ns IS NOT NULL
UNION ALL
SELECT request_id, instance, trace_id, span_id, 'span', toInt64(1), toInt64(token_index), time_ns, itl_ns,
       from_prefill, NULL
FROM (
    SELECT
        r.request_id AS request_id, r.instance AS instance, t.time_ns AS time_ns, t.trace_id AS trace_id,
        t.span_id AS span_id,
        row_number() OVER w - 1 AS token_index,
        t.time_ns - lagInFrame(toNullable(t.time_ns)) OVER w AS itl_ns,
        row_number() OVER w = 1 AS from_prefill
    FROM (
        SELECT trace_id, span_id, if(name = 'send_generation', start_ns, end_ns) AS time_ns
        FROM ({spans}) WHERE name IN ('prefill_forward', 'decode_loop', 'send_generation')
    ) t
    JOIN (SELECT request_id, instance, trace_id FROM ({request_legs}) WHERE source IN ('sglang', 'tgi')) r
      ON r.trace_id = t.trace_id
    WINDOW w AS (PARTITION BY r.request_id, r.instance ORDER BY t.time_ns, t.span_id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
