-- step_membership: which requests took part in each `engine_step` span, and how.
--
-- Answers: which requests prefilled in a step (chunk size, tokens already cached, whether the chunk
-- finished the prompt and so produced a token), which requests decoded through a run of steps, which
-- were preempted. Join to `steps` on (trace_id, span_id) for times; analyzers name culprit prefills and
-- their victims from here.
-- Columns: instance, trace_id, span_id, first_step_index, run_steps, start_ns, end_ns (of the span),
--   request_id, role ('prefill' | 'decode' | 'preempted'), chunk_tokens, computed_tokens, samples_token,
--   tokens (tokens the request received in the span: run_steps for a decode, 1 or 0 for a prefill chunk),
--   first_step_end_ns, last_step_end_ns (ends of the span's first and last step, from its step durations as
--   in `steps`; NULL when the span has none): a decode member gets its first token of the span at
--   first_step_end_ns and its last at last_step_end_ns.
WITH span AS (
    SELECT
        trace_id, span_id, start_ns, end_ns,
        "res.service.instance.id" AS instance,
        "attr.infertrace.step.index" AS first_step_index,
        coalesce(len("attr.infertrace.step.durations_ns"), "attr.infertrace.step.count") AS run_steps,
        "attr.infertrace.step.decode.request_ids" AS decode_ids,
        "attr.infertrace.step.prefill.request_ids" AS prefill_ids,
        "attr.infertrace.step.prefill.chunk_tokens" AS chunk_tokens,
        "attr.infertrace.step.prefill.computed_tokens" AS computed_tokens,
        "attr.infertrace.step.prefill.samples_token" AS samples_token,
        "attr.infertrace.step.preempted.request_ids" AS preempted_ids,
        CAST(start_ns + "attr.infertrace.step.durations_ns"[1] AS BIGINT) AS first_step_end_ns,
        CAST(start_ns + list_sum("attr.infertrace.step.durations_ns") AS BIGINT) AS last_step_end_ns
    FROM spans
    WHERE name = 'engine_step'
),
decode AS (
    SELECT instance, trace_id, span_id, first_step_index, run_steps, start_ns, end_ns, first_step_end_ns, last_step_end_ns,
           unnest(decode_ids) AS request_id
    FROM span WHERE len(decode_ids) > 0
),
prefill AS (
    SELECT instance, trace_id, span_id, first_step_index, run_steps, start_ns, end_ns, first_step_end_ns, last_step_end_ns,
           unnest(prefill_ids) AS request_id,
           unnest(chunk_tokens) AS chunk_tokens,
           unnest(computed_tokens) AS computed_tokens,
           unnest(samples_token) AS samples_token
    FROM span WHERE len(prefill_ids) > 0
),
preempted AS (
    SELECT instance, trace_id, span_id, first_step_index, run_steps, start_ns, end_ns, first_step_end_ns, last_step_end_ns,
           unnest(preempted_ids) AS request_id
    FROM span WHERE len(preempted_ids) > 0
)
SELECT instance, trace_id, span_id, first_step_index, run_steps, start_ns, end_ns, request_id,
       'decode' AS role, NULL::BIGINT AS chunk_tokens, NULL::BIGINT AS computed_tokens,
       NULL::BOOLEAN AS samples_token, run_steps::BIGINT AS tokens, first_step_end_ns, last_step_end_ns
FROM decode
UNION ALL
SELECT instance, trace_id, span_id, first_step_index, run_steps, start_ns, end_ns, request_id,
       'prefill', chunk_tokens, computed_tokens, samples_token,
       CASE WHEN samples_token THEN 1 ELSE 0 END::BIGINT, first_step_end_ns, last_step_end_ns
FROM prefill
UNION ALL
SELECT instance, trace_id, span_id, first_step_index, run_steps, start_ns, end_ns, request_id,
       'preempted', NULL, NULL, NULL, 0::BIGINT, first_step_end_ns, last_step_end_ns
FROM preempted
