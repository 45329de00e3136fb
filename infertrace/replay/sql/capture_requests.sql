-- capture_requests: one row per request of a model that reached an engine in a window, as a replay needs it.
--
-- Answers: what traffic did the model's engines serve: when each request reached an engine, its prompt and
-- output lengths, tenant, shared system prompt, assistant prefill, prefix-cache hit, and whether the engine
-- rejected it. A disaggregated request has two engine request spans (prefill worker, decode worker): its
-- arrival is the first one's, its output the decode worker's.
-- Parameters: $model, $since_ns, $until_ns (arrival window, [since, until)).
-- Columns: request_id, tenant, arrival_ns, input_tokens, output_tokens, max_tokens, cached_tokens,
--   system_prompt_id, system_prompt_tokens, assistant_prefill_tokens, engine_error (error.type set by the
--   engine), ttft_ns (arrival to first token on the engine that prefilled), e2e_ns (arrival to last token),
--   preemptions, timing_source, instances (engine rows of the request), route_ns (when the router took the
--   request; NULL without a route span: the router's decision time, which a replay routes at),
--   core_ttft_ns and core_e2e_ns (TTFT and E2E as the engine's scheduler saw them, where the request span is
--   an API server's whose own latency the replay does not model: vLLM V1's engine core, time_in_queue plus
--   time_in_model_prefill or time_in_model_inference; SGLang's scheduler, from its thread span's start to the
--   end of the request's first prefill_forward or to the thread span's end, the tokenizer's tokenize, dispatch
--   and detokenize left out; TGI's batching task, from the `queued` span's start (the queue append, after the
--   HTTP handler's validation and tokenisation) to its first `send_generation` and to its `schedule` span's end;
--   NULL for other sources), source (request_legs' source).
WITH routes AS (
    SELECT trace_id, min(start_ns) AS route_ns
    FROM spans WHERE name = 'route' AND "attr.infertrace.route.target" IS NOT NULL
    GROUP BY trace_id
),
sglang AS (
    SELECT trace_id,
           min(start_ns) FILTER (WHERE "attr.thread_label" LIKE '%Scheduler') AS scheduler_ns,
           max(end_ns) FILTER (WHERE "attr.thread_label" LIKE '%Scheduler') AS scheduler_end_ns,
           min(end_ns) FILTER (WHERE name = 'prefill_forward') AS first_token_ns
    FROM spans
    WHERE (name = 'prefill_forward' OR "attr.thread_label" LIKE '%Scheduler')
      AND trace_id IN (SELECT trace_id FROM request_legs WHERE source = 'sglang' AND model = $model)
    GROUP BY trace_id
),
tgi AS (
    SELECT trace_id,
           min(start_ns) FILTER (WHERE name = 'queued') AS queued_ns,
           min(start_ns) FILTER (WHERE name = 'send_generation') AS first_token_ns,
           max(end_ns) FILTER (WHERE name = 'schedule') AS schedule_end_ns
    FROM spans
    WHERE name IN ('queued', 'send_generation', 'schedule')
      AND trace_id IN (SELECT trace_id FROM request_legs WHERE source = 'tgi' AND model = $model)
    GROUP BY trace_id
),
rows AS (
    SELECT r.*, routes.route_ns,
           CASE WHEN r.source = 'vllm-v1' THEN CAST(round((s."attr.gen_ai.latency.time_in_queue"
               + s."attr.gen_ai.latency.time_in_model_prefill") * 1e9) AS BIGINT)
                WHEN r.source = 'sglang' THEN g.first_token_ns - g.scheduler_ns
                WHEN r.source = 'tgi' THEN t.first_token_ns - t.queued_ns END AS core_ttft_ns,
           CASE WHEN r.source = 'vllm-v1' THEN CAST(round((s."attr.gen_ai.latency.time_in_queue"
               + s."attr.gen_ai.latency.time_in_model_inference") * 1e9) AS BIGINT)
                WHEN r.source = 'sglang' THEN g.scheduler_end_ns - g.scheduler_ns
                WHEN r.source = 'tgi' THEN t.schedule_end_ns - t.queued_ns END AS core_e2e_ns
    FROM request_legs r
    JOIN spans s ON s.trace_id = r.trace_id AND s.span_id = r.span_id
    LEFT JOIN routes ON routes.trace_id = r.trace_id
    LEFT JOIN sglang g ON g.trace_id = r.trace_id
    LEFT JOIN tgi t ON t.trace_id = r.trace_id
    WHERE r.model = $model
)
SELECT
    request_id,
    any_value(tenant) AS tenant,
    min(arrival_ns) AS arrival_ns,
    max(input_tokens) AS input_tokens,
    max(output_tokens) AS output_tokens,
    max(max_tokens) AS max_tokens,
    max(cached_tokens) AS cached_tokens,
    any_value(system_prompt_id) AS system_prompt_id,
    max(system_prompt_tokens) AS system_prompt_tokens,
    coalesce(max(assistant_prefill_tokens), 0) AS assistant_prefill_tokens,
    any_value(error_type) AS engine_error,
    arg_min(ttft_ns, arrival_ns) AS ttft_ns,
    max(finish_ns) - min(arrival_ns) AS e2e_ns,
    coalesce(sum(preemptions), 0) AS preemptions,
    any_value(timing_source) AS timing_source,
    count(*) AS instances,
    min(route_ns) AS route_ns,
    arg_min(core_ttft_ns, arrival_ns) AS core_ttft_ns,
    max(core_e2e_ns) AS core_e2e_ns,
    any_value(source) AS source
FROM rows
GROUP BY request_id
HAVING min(arrival_ns) >= $since_ns AND min(arrival_ns) < $until_ns
ORDER BY arrival_ns, request_id
