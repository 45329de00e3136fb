-- steps: one row per engine step, expanded from `engine_step` spans (one span per step, or per run of
-- decode-only steps with unchanged membership).
--
-- Answers: when did each step of each engine start and end, how many prefill and decode tokens did it
-- compute, how full was the engine. A long step with prefill tokens next to many decodes is an ITL spike.
-- Columns: instance, service, model, hardware, policy, step_index, start_ns, end_ns, duration_ns,
--   trace_id, span_id (the span the step came from), run_position (0-based place in the span), run_steps,
--   prefill_tokens, decode_tokens, num_prefills, num_decodes, decode_context_tokens (sum of the decoding
--   requests' context lengths at this step), running, waiting, kv_used_blocks, kv_total_blocks (end of the
--   span), num_preempted, pause_ns (on the span's last step only: the engine ends a run at the step a host
--   pause fell in).
-- Step i of a span ends at span start + sum(durations_ns[1..i]); the sums are exact integers (HUGEINT).
WITH span AS (
    SELECT
        trace_id, span_id, start_ns AS span_start_ns,
        "res.service.instance.id" AS instance,
        "res.service.name" AS service,
        "res.infertrace.engine.model" AS model,
        "res.infertrace.hardware" AS hardware,
        "res.infertrace.engine.policy" AS policy,
        "attr.infertrace.step.index" AS first_index,
        "attr.infertrace.step.durations_ns" AS durations,
        "attr.infertrace.step.prefill_tokens" AS prefill_tokens,
        "attr.infertrace.step.decode_tokens" AS decode_tokens,
        coalesce(len("attr.infertrace.step.prefill.request_ids"), 0) AS num_prefills,
        coalesce(len("attr.infertrace.step.decode.request_ids"), 0) AS num_decodes,
        "attr.infertrace.step.decode.context_tokens" AS context_tokens,
        "attr.infertrace.step.running" AS running,
        "attr.infertrace.step.waiting" AS waiting,
        "attr.infertrace.step.kv.used_blocks" AS kv_used_blocks,
        "attr.infertrace.step.kv.total_blocks" AS kv_total_blocks,
        coalesce(len("attr.infertrace.step.preempted.request_ids"), 0) AS num_preempted,
        coalesce("attr.infertrace.step.pause_ns", 0) AS pause_ns,
        -- Step i ends at the span's start plus the sum of durations 1..i: exact (HUGEINT), computed once per
        -- span as a list (a window over every step of the store would sort them all).
        list_transform(range(1, len("attr.infertrace.step.durations_ns") + 1),
                       lambda i: CAST(start_ns + list_sum("attr.infertrace.step.durations_ns"[1:i]) AS BIGINT))
            AS ends
    FROM spans
    WHERE name = 'engine_step'
),
step AS (
    -- the span's lists unnested side by side (the columns of a row are not copied with a list per step)
    SELECT
        * EXCLUDE (durations, ends),
        unnest(range(len(durations))) AS run_position,
        unnest(durations) AS duration_ns,
        unnest(ends) AS end_ns,
        len(durations) AS run_steps
    FROM span
)
SELECT
    instance, service, model, hardware, policy,
    first_index + run_position AS step_index,
    end_ns - duration_ns AS start_ns,
    end_ns,
    duration_ns,
    trace_id, span_id, run_position, run_steps,
    prefill_tokens, decode_tokens, num_prefills, num_decodes,
    context_tokens + run_position * num_decodes AS decode_context_tokens,
    running, waiting, kv_used_blocks, kv_total_blocks, num_preempted,
    CASE WHEN run_position = run_steps - 1 THEN pause_ns ELSE 0 END AS pause_ns
FROM step
