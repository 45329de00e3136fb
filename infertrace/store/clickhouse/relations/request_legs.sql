-- request_legs (ClickHouse form of infertrace/store/relations/request_legs.sql): one row per engine request span,
-- every source the DuckDB form reads (this engine, vLLM, SGLang, TGI). Same columns, same rules, same order of
-- fallbacks; read that file for what each column means. Kept line for line beside it: a change there is made here
-- too, and tests/test_store_clickhouse.py holds the two to the same rows on every sample.
-- {spans}: the window's spans, typed (pushdown.spans_sql). List keys are JSON text there; arrays are never NULL
-- in ClickHouse and `arr[1]` of an empty array is a default, so first elements are taken with a guard.
WITH
pick AS (
    SELECT
        name, trace_id, span_id, parent_span_id, start_ns, end_ns, status_code, events,
        "attr.gen_ai.request.id", "attr.gen_ai.response.model", "attr.gen_ai.request.model",
        "attr.infertrace.tenant.id", "attr.metadata.user_api_key_team_id", "attr.user.id",
        "res.service.name", "res.service.instance.id", "res.host.name", "res.process.pid", "res.vllm.process_id",
        "res.infertrace.component.kind", "res.infertrace.hardware", "res.cloud.region", "res.infertrace.engine.model",
        coalesce("attr.gen_ai.usage.input_tokens", "attr.gen_ai.usage.prompt_tokens") AS usage_input_tokens,
        "attr.gen_ai.usage.output_tokens",
        "attr.gen_ai.usage.completion_tokens", "attr.gen_ai.usage.cache_read.input_tokens",
        "attr.gen_ai.usage.cached_tokens", "attr.infertrace.request.system_prompt.id",
        "attr.infertrace.request.system_prompt.tokens", "attr.infertrace.request.assistant_prefill_tokens",
        "attr.gen_ai.request.max_tokens", "attr.infertrace.request.preemptions",
        "attr.infertrace.request.prefill_chunks", "attr.gen_ai.response.finish_reasons", "attr.error.type",
        "attr.gen_ai.latency.time_in_queue", "attr.gen_ai.latency.time_to_first_token",
        "attr.gen_ai.latency.time_in_model_prefill", "attr.gen_ai.latency.e2e",
        "attr.gen_ai.latency.time_in_model_inference", "attr.rid", "attr.module", "attr.code.namespace",
        "attr.thread_label", "attr.host_id", "attr.pid",
        "attr.rid" IS NOT NULL AND "attr.module" = 'sglang::request' AND name LIKE '%Req %' AS is_sglang,
        if(is_sglang AND mapContains(span_attributes, 'bootstrap_room'), span_attributes['bootstrap_room'], NULL)
            AS bootstrap_room,
        multiIf(name = 'llm_request', 'native', is_sglang, 'sglang',
                "attr.code.namespace" = 'text_generation_router::server'
                    AND name IN ('chat_completions', 'completions', 'generate', 'generate_stream'), 'tgi',
                NULL) AS form
    FROM ({spans})
    WHERE name IN ('llm_request', 'queue', 'kv_transfer', 'prefill_forward', 'chunked_prefill', 'queued',
                   'send_generation', 'chat_completions', 'completions', 'generate', 'generate_stream')
       OR "attr.thread_label" IS NOT NULL OR "attr.rid" IS NOT NULL
       OR ("attr.gen_ai.request.model" IS NOT NULL AND name <> 'engine_step')
),
queue AS (
    SELECT trace_id, parent_span_id, max(end_ns) AS scheduled_ns
    FROM pick WHERE name = 'queue' GROUP BY trace_id, parent_span_id
),
kv AS (
    SELECT trace_id, "attr.gen_ai.request.id" AS request_id, toInt64(sum(end_ns - start_ns)) AS kv_transfer_ns
    FROM pick WHERE name = 'kv_transfer' GROUP BY trace_id, request_id
),
sglang_slices AS (
    SELECT trace_id,
           anyIf(concat(substring("attr.host_id", 1, 8), ':', toString("attr.pid")),
                 "attr.thread_label" LIKE '%Scheduler') AS scheduler,
           sumIf(toNullable(length(arrayFilter(e -> e.name = 'retract', events))),
                 "attr.thread_label" LIKE '%Scheduler') AS preemptions,
           minIf(toNullable(start_ns), name = 'prefill_forward') AS scheduled_ns,
           toInt64(countIf(name = 'chunked_prefill')) AS prefill_chunks
    FROM pick
    WHERE name IN ('prefill_forward', 'chunked_prefill') OR "attr.thread_label" IS NOT NULL
    GROUP BY trace_id
),
tgi_spans AS (
    SELECT trace_id,
           maxIf(toNullable(end_ns), name = 'queued') AS scheduled_ns,
           minIf(toNullable(start_ns), name = 'send_generation') AS first_token_ns,
           toInt64(countIf(name = 'send_generation')) AS output_tokens
    FROM pick WHERE name IN ('queued', 'send_generation')
    GROUP BY trace_id
),
engine AS (
    SELECT
        r.form AS form, r.name AS name, r.trace_id AS trace_id, r.span_id AS span_id,
        r.parent_span_id AS parent_span_id, r.start_ns AS start_ns, r.end_ns AS end_ns,
        r.status_code AS status_code,
        r."attr.gen_ai.request.id" AS own_request_id,
        coalesce(r."attr.gen_ai.response.model", r."attr.gen_ai.request.model", r."res.infertrace.engine.model")
            AS own_model,
        r."attr.infertrace.tenant.id" AS own_tenant,
        r."res.service.name" AS service, r."res.service.instance.id" AS instance_id, r."res.host.name" AS host,
        r."res.process.pid" AS pid, r."res.vllm.process_id" AS vllm_pid,
        r."res.infertrace.component.kind" AS component_kind, r."res.infertrace.hardware" AS hardware,
        r."res.cloud.region" AS region,
        r.usage_input_tokens AS input_tokens,
        coalesce(r."attr.gen_ai.usage.output_tokens", r."attr.gen_ai.usage.completion_tokens",
                 if(r.form = 'tgi', t.output_tokens, NULL)) AS output_tokens,
        coalesce(r."attr.gen_ai.usage.cache_read.input_tokens", r."attr.gen_ai.usage.cached_tokens")
            AS cached_tokens,
        r."attr.infertrace.request.system_prompt.id" AS system_prompt_id,
        r."attr.infertrace.request.system_prompt.tokens" AS system_prompt_tokens,
        r."attr.infertrace.request.assistant_prefill_tokens" AS assistant_prefill_tokens,
        r."attr.gen_ai.request.max_tokens" AS max_tokens,
        r."attr.infertrace.request.preemptions" AS own_preemptions,
        coalesce(r."attr.infertrace.request.prefill_chunks", if(r.form = 'sglang', s.prefill_chunks, NULL))
            AS prefill_chunks,
        JSONExtract(coalesce(r."attr.gen_ai.response.finish_reasons", '[]'), 'Array(Nullable(String))')[1]
            AS finish_reason,
        r."attr.error.type" AS error_type,
        if(r.form = 'native', q.scheduled_ns, NULL) AS q_scheduled_ns,
        arrayFilter(e -> e.name = 'first_token', r.events) AS first_token_events,
        if(empty(first_token_events), NULL, first_token_events[1].time_ns) AS event_first_token_ns,
        if(r.form = 'sglang', coalesce(s.preemptions, 0),
           length(arrayFilter(e -> e.name IN ('preempted', 'journey.PREEMPTED'), r.events))) AS event_preemptions,
        toInt64(sign(r."attr.gen_ai.latency.time_in_queue" * 1e9)
                * floor(abs(r."attr.gen_ai.latency.time_in_queue" * 1e9) + 0.5)) AS attr_queue_ns,
        toInt64(sign(r."attr.gen_ai.latency.time_to_first_token" * 1e9)
                * floor(abs(r."attr.gen_ai.latency.time_to_first_token" * 1e9) + 0.5)) AS attr_ttft_ns,
        toInt64(sign(r."attr.gen_ai.latency.time_in_model_prefill" * 1e9)
                * floor(abs(r."attr.gen_ai.latency.time_in_model_prefill" * 1e9) + 0.5)) AS attr_prefill_ns,
        toInt64(sign(r."attr.gen_ai.latency.e2e" * 1e9)
                * floor(abs(r."attr.gen_ai.latency.e2e" * 1e9) + 0.5)) AS attr_e2e_ns,
        multiIf(r.form = 'sglang', s.scheduled_ns, r.form = 'tgi', t.scheduled_ns, NULL) AS own_scheduled_ns,
        if(r.form = 'tgi', t.first_token_ns, NULL) AS own_first_token_ns,
        if(r.form = 'sglang', s.scheduler, NULL) AS sglang_instance,
        r.bootstrap_room AS bootstrap_room,
        multiIf(r.form <> 'native', r.form,
                r."attr.infertrace.request.preemptions" IS NOT NULL OR q_scheduled_ns IS NOT NULL, 'infertrace',
                r."attr.gen_ai.latency.time_in_model_inference" IS NOT NULL OR r."res.vllm.process_id" IS NOT NULL,
                'vllm-v1', 'vllm-v0') AS source
    FROM (SELECT * FROM pick WHERE form IS NOT NULL) r
    LEFT JOIN queue q ON q.trace_id = r.trace_id AND q.parent_span_id = r.span_id
    LEFT JOIN sglang_slices s ON s.trace_id = r.trace_id
    LEFT JOIN tgi_spans t ON t.trace_id = r.trace_id
),
trace_info AS (
    SELECT trace_id,
           any("attr.gen_ai.request.model") AS model,
           any("attr.gen_ai.request.id") AS request_id,
           any(coalesce("attr.infertrace.tenant.id", "attr.metadata.user_api_key_team_id", "attr.user.id")) AS tenant,
           if(min(usage_input_tokens) = max(usage_input_tokens), min(usage_input_tokens), NULL) AS input_tokens
    FROM pick
    WHERE form IS NULL AND "attr.gen_ai.request.model" IS NOT NULL
    GROUP BY trace_id
),
timed AS (
    SELECT
        e.*,
        ti.model AS trace_model, ti.request_id AS trace_request_id, ti.tenant AS trace_tenant,
        ti.input_tokens AS trace_input_tokens,
        coalesce(e.event_first_token_ns, e.own_first_token_ns, e.start_ns + e.attr_ttft_ns) AS first_token,
        coalesce(e.q_scheduled_ns, e.own_scheduled_ns,
                 if(e.source = 'vllm-v1', first_token - e.attr_prefill_ns, NULL),
                 e.start_ns + e.attr_queue_ns) AS scheduled,
        if(e.source IN ('vllm-v1', 'vllm-v0', 'sglang') AND e.attr_e2e_ns IS NOT NULL,
           e.start_ns + e.attr_e2e_ns, e.end_ns) AS finish
    FROM engine e
    LEFT JOIN trace_info ti ON ti.trace_id = e.trace_id
)
SELECT
    coalesce(p.own_request_id, p.trace_request_id, p.span_id) AS request_id,
    p.trace_id AS trace_id,
    p.span_id AS span_id,
    p.parent_span_id AS parent_span_id,
    coalesce(p.own_model, p.trace_model, p.service) AS model,
    coalesce(p.own_tenant, p.trace_tenant) AS tenant,
    p.service AS service,
    coalesce(p.instance_id, concat(p.host, ':', toString(p.pid)), p.sglang_instance,
             concat(p.service, ':', p.vllm_pid), p.service) AS instance,
    coalesce(p.component_kind, 'engine') AS component_kind,
    p.hardware AS hardware,
    p.region AS region,
    multiIf(p.component_kind = 'prefill_worker' OR (p.form = 'sglang' AND lower(p.name) LIKE 'prefill req %'),
            'prefill',
            p.component_kind = 'decode_worker' OR (p.form = 'sglang' AND lower(p.name) LIKE 'decode req %'),
            'decode', 'colocated') AS role,
    p.start_ns AS arrival_ns,
    p.scheduled AS scheduled_ns,
    p.first_token AS first_token_ns,
    p.finish AS finish_ns,
    p.scheduled - p.start_ns AS queue_ns,
    p.first_token - p.start_ns AS ttft_ns,
    p.first_token - p.scheduled AS prefill_ns,
    p.finish - p.first_token AS decode_ns,
    p.finish - p.start_ns AS e2e_ns,
    kv.kv_transfer_ns AS kv_transfer_ns,
    coalesce(p.input_tokens, p.trace_input_tokens) AS input_tokens,
    p.output_tokens AS output_tokens,
    p.cached_tokens AS cached_tokens,
    p.system_prompt_id AS system_prompt_id,
    p.system_prompt_tokens AS system_prompt_tokens,
    p.assistant_prefill_tokens AS assistant_prefill_tokens,
    p.max_tokens AS max_tokens,
    -- event_preemptions is a UInt64 (a length): coalesce of Int64 and UInt64 is a Variant, which toInt64 reads
    -- as 0 when NULL, so it is made an Int64 first
    coalesce(p.own_preemptions, if(p.source IN ('sglang', 'infertrace') OR p.event_preemptions > 0,
                                   toInt64(p.event_preemptions), NULL)) AS preemptions,
    p.prefill_chunks AS prefill_chunks,
    p.finish_reason AS finish_reason,
    p.error_type AS error_type,
    p.status_code AS status_code,
    if(p.status_code = 2 OR p.error_type IS NOT NULL, 'error', 'ok') AS outcome,
    multiIf(p.q_scheduled_ns IS NOT NULL OR p.event_first_token_ns IS NOT NULL OR p.form <> 'native', 'spans',
            p.attr_ttft_ns IS NOT NULL, 'gen_ai.latency', NULL) AS timing_source,
    p.source AS source,
    multiIf(p.own_model IS NOT NULL, 'attribute', p.trace_model IS NOT NULL, 'trace',
            p.service IS NOT NULL, 'service.name', NULL) AS model_source,
    multiIf(p.instance_id IS NOT NULL, 'service.instance.id',
            p.host IS NOT NULL AND p.pid IS NOT NULL, 'host.name+process.pid',
            p.sglang_instance IS NOT NULL, 'sglang scheduler',
            p.service IS NOT NULL AND p.vllm_pid IS NOT NULL, 'service.name+vllm.process_id',
            p.service IS NOT NULL, 'service.name', NULL) AS instance_source,
    if(p.form = 'sglang', p.bootstrap_room, NULL) AS pair_key
FROM timed p
LEFT JOIN kv ON kv.trace_id = p.trace_id AND kv.request_id = p.own_request_id
