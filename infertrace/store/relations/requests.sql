-- requests: one row per engine request (an `llm_request` span), with its phase timings.
--
-- Answers: how long did each request queue, prefill and decode; how many tokens in, out and from the
-- prefix cache; which tenant, model and engine instance; did it fail.
-- Use it for TTFT/E2E percentiles, TTFT decomposition, cache and billing analyses.
-- Columns: times are int64 ns since the epoch, durations int64 ns.
--   request_id, trace_id, span_id, model, tenant, service, instance, hardware, region,
--   arrival_ns, scheduled_ns (first scheduling), first_token_ns, finish_ns,
--   queue_ns, ttft_ns, prefill_ns, decode_ns, e2e_ns, kv_transfer_ns,
--   input_tokens, output_tokens, cached_tokens, system_prompt_id, system_prompt_tokens,
--   assistant_prefill_tokens, max_tokens, preemptions, prefill_chunks, finish_reason, error_type,
--   status_code, outcome ('ok' | 'error'), timing_source.
-- timing_source is 'spans' when the phase times come from the queue span and the first_token event (the
-- reference engine: exact), 'gen_ai.latency' when they come from vLLM's seconds attributes (vLLM's own
-- llm_request span, which has no children: rounded to the nanosecond).
WITH req AS (
    SELECT * FROM spans WHERE name = 'llm_request'
),
queue AS (
    SELECT trace_id, parent_span_id, max(end_ns) AS scheduled_ns
    FROM spans WHERE name = 'queue' GROUP BY ALL
),
kv AS (
    SELECT trace_id, "attr.gen_ai.request.id" AS request_id, sum(end_ns - start_ns)::BIGINT AS kv_transfer_ns
    FROM spans WHERE name = 'kv_transfer' GROUP BY ALL
),
timed AS (
    SELECT
        r.*,
        q.scheduled_ns AS q_scheduled_ns,
        list_filter(r.events, lambda e: e.name = 'first_token')[1].time_ns AS event_first_token_ns,
        CAST(round(r."attr.gen_ai.latency.time_in_queue" * 1e9) AS BIGINT) AS attr_queue_ns,
        CAST(round(r."attr.gen_ai.latency.time_to_first_token" * 1e9) AS BIGINT) AS attr_ttft_ns
    FROM req r
    LEFT JOIN queue q ON q.trace_id = r.trace_id AND q.parent_span_id = r.span_id
),
phases AS (
    SELECT
        *,
        coalesce(q_scheduled_ns, start_ns + attr_queue_ns) AS scheduled,
        coalesce(event_first_token_ns, start_ns + attr_ttft_ns) AS first_token
    FROM timed
)
SELECT
    p."attr.gen_ai.request.id" AS request_id,
    p.trace_id,
    p.span_id,
    coalesce(p."attr.gen_ai.response.model", p."attr.gen_ai.request.model", p."res.infertrace.engine.model") AS model,
    p."attr.infertrace.tenant.id" AS tenant,
    p."res.service.name" AS service,
    p."res.service.instance.id" AS instance,
    p."res.infertrace.hardware" AS hardware,
    p."res.cloud.region" AS region,
    p.start_ns AS arrival_ns,
    p.scheduled AS scheduled_ns,
    p.first_token AS first_token_ns,
    p.end_ns AS finish_ns,
    p.scheduled - p.start_ns AS queue_ns,
    p.first_token - p.start_ns AS ttft_ns,
    p.first_token - p.scheduled AS prefill_ns,
    p.end_ns - p.first_token AS decode_ns,
    p.end_ns - p.start_ns AS e2e_ns,
    kv.kv_transfer_ns,
    coalesce(p."attr.gen_ai.usage.input_tokens", p."attr.gen_ai.usage.prompt_tokens") AS input_tokens,
    coalesce(p."attr.gen_ai.usage.output_tokens", p."attr.gen_ai.usage.completion_tokens") AS output_tokens,
    p."attr.gen_ai.usage.cache_read.input_tokens" AS cached_tokens,
    p."attr.infertrace.request.system_prompt.id" AS system_prompt_id,
    p."attr.infertrace.request.system_prompt.tokens" AS system_prompt_tokens,
    p."attr.infertrace.request.assistant_prefill_tokens" AS assistant_prefill_tokens,
    p."attr.gen_ai.request.max_tokens" AS max_tokens,
    p."attr.infertrace.request.preemptions" AS preemptions,
    p."attr.infertrace.request.prefill_chunks" AS prefill_chunks,
    p."attr.gen_ai.response.finish_reasons"[1] AS finish_reason,
    p."attr.error.type" AS error_type,
    p.status_code,
    CASE WHEN p.status_code = 2 OR p."attr.error.type" IS NOT NULL THEN 'error' ELSE 'ok' END AS outcome,
    CASE WHEN p.q_scheduled_ns IS NOT NULL OR p.event_first_token_ns IS NOT NULL THEN 'spans'
         WHEN p.attr_ttft_ns IS NOT NULL THEN 'gen_ai.latency' END AS timing_source
FROM phases p
LEFT JOIN kv ON kv.trace_id = p.trace_id AND kv.request_id = p."attr.gen_ai.request.id"
