-- steps (ClickHouse form of infertrace/store/relations/steps.sql): one row per engine step, expanded from
-- `engine_step` spans. Same columns, same rules; read that file for what each column means. Kept beside it: a
-- change there is made here too, and tests/test_store_clickhouse.py holds the two to the same rows on every sample.
-- {spans}: the window's spans, typed (pushdown.spans_sql; list keys as JSON text).
WITH span AS (
    SELECT
        trace_id, span_id, start_ns AS span_start_ns,
        "res.service.instance.id" AS instance,
        "res.service.name" AS service,
        "res.infertrace.engine.model" AS model,
        "res.infertrace.hardware" AS hardware,
        "res.infertrace.engine.policy" AS policy,
        "attr.infertrace.step.index" AS first_index,
        JSONExtract(coalesce("attr.infertrace.step.durations_ns", '[]'), 'Array(Int64)') AS durations,
        "attr.infertrace.step.prefill_tokens" AS prefill_tokens,
        "attr.infertrace.step.decode_tokens" AS decode_tokens,
        toInt64(JSONLength(coalesce("attr.infertrace.step.prefill.request_ids", '[]'))) AS num_prefills,
        toInt64(JSONLength(coalesce("attr.infertrace.step.decode.request_ids", '[]'))) AS num_decodes,
        "attr.infertrace.step.decode.context_tokens" AS context_tokens,
        "attr.infertrace.step.running" AS running,
        "attr.infertrace.step.waiting" AS waiting,
        "attr.infertrace.step.kv.used_blocks" AS kv_used_blocks,
        "attr.infertrace.step.kv.total_blocks" AS kv_total_blocks,
        toInt64(JSONLength(coalesce("attr.infertrace.step.preempted.request_ids", '[]'))) AS num_preempted,
        coalesce("attr.infertrace.step.pause_ns", 0) AS span_pause_ns,
        arrayCumSum(durations) AS sums
    FROM ({spans})
    WHERE name = 'engine_step'
),
step AS (
    SELECT *, toInt64(i - 1) AS run_position, durations[i] AS duration_ns, span_start_ns + sums[i] AS step_end_ns,
           toInt64(length(durations)) AS run_steps
    FROM span ARRAY JOIN arrayEnumerate(durations) AS i
)
SELECT
    instance, service, model, hardware, policy,
    first_index + run_position AS step_index,
    step_end_ns - duration_ns AS start_ns,
    step_end_ns AS end_ns,
    duration_ns,
    trace_id, span_id, run_position, run_steps,
    prefill_tokens, decode_tokens, num_prefills, num_decodes,
    context_tokens + run_position * num_decodes AS decode_context_tokens,
    running, waiting, kv_used_blocks, kv_total_blocks, num_preempted,
    if(run_position = run_steps - 1, span_pause_ns, 0) AS pause_ns
FROM step
