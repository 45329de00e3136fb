-- request_legs: one row per engine request span (a leg of a request), from whichever engine made the spans
-- (infertrace/sources/): the reference engine's and vLLM's `llm_request` span, SGLang's `Req …` span, TGI's
-- HTTP handler span. A colocated request has one leg; a disaggregated one has a prefill leg (the prefill
-- worker computes the prompt) and a decode leg (the decode worker, after the KV transfer, generates). The
-- `requests` relation joins a request's legs into one row: count requests there, never here.
--
-- Answers: how long did each request queue, prefill and decode; how many tokens in, out and from the
-- prefix cache; which tenant, model and engine instance; did it fail.
-- Use it for TTFT/E2E percentiles, TTFT decomposition, cache and billing analyses.
-- Columns: times are int64 ns since the epoch, durations int64 ns.
--   request_id, trace_id, span_id, parent_span_id, model, tenant, service, instance, component_kind, hardware,
--   region, role ('prefill' | 'decode' | 'colocated': the leg's part in the request; from the resource's
--   infertrace.component.kind prefill_worker / decode_worker, or SGLang's "Prefill Req …" / "Decode Req …"
--   span names; else colocated),
--   arrival_ns, scheduled_ns (first scheduling), first_token_ns, finish_ns,
--   queue_ns, ttft_ns, prefill_ns, decode_ns, e2e_ns, kv_transfer_ns,
--   input_tokens, output_tokens, cached_tokens, system_prompt_id, system_prompt_tokens,
--   assistant_prefill_tokens, max_tokens, preemptions, prefill_chunks, finish_reason, error_type,
--   status_code, outcome ('ok' | 'error'), timing_source, source, model_source, instance_source,
--   pair_key (the key the engine gives both legs of one disaggregated request, whatever trace each is in:
--   SGLang's `bootstrap_room` on its `prefill Req …` / `decode Req …` span; NULL for other sources and for
--   SGLang requests that were not disaggregated).
-- source: 'infertrace', 'vllm-v1', 'vllm-v0', 'sglang' or 'tgi'. timing_source: 'spans' when the phase times
-- come from child spans and events (the reference engine: exact; SGLang's slices; TGI's queued and
-- send_generation spans), 'gen_ai.latency' when they come from vLLM's seconds attributes (rounded to the ns).
-- vLLM V1 measures TTFT and E2E on the API server's clock but queue, prefill and decode on the engine core's:
-- its scheduling time here is the first token less the prefill (not arrival plus time_in_queue, which is early
-- by the API server's own latency), so queue_ns includes that latency.
-- Identity where a source sets none: the model is the span's response or request model, else the engine's
-- resource model, else a gen_ai.request.model elsewhere in the trace (a gateway's), else `service.name`
-- (model_source says which); the instance is `service.instance.id`, else `host.name`:`process.pid`, else
-- SGLang's scheduler thread (host id:pid), else `service.name`:`vllm.process_id`, else `service.name`
-- (instance_source says which). A request id missing on the span is taken from its trace, else the span id.
-- Prompt tokens missing on the span (TGI's carry none) are the engine's usage as a gateway's span in the trace
-- reports it (gen_ai.usage.input_tokens or .prompt_tokens: LiteLLM's), when the trace's gateway spans agree on one.
WITH
-- One scan of the spans picks every row this relation reads (each further scan of a store of many segments
-- costs as much as this one): engine request spans of every source, the reference engine's queue and
-- kv_transfer spans, SGLang's stages and scheduler thread, TGI's queued and send_generation spans, and any
-- other span naming a requested model (a gateway's: the model, id and tenant of a request whose engine span
-- lacks them).
pick AS MATERIALIZED (
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
        CASE WHEN "attr.rid" IS NOT NULL AND "attr.module" = 'sglang::request' AND name LIKE '%Req %'
             THEN map_extract_value(span_attributes, 'bootstrap_room') END AS bootstrap_room,
        CASE WHEN name = 'llm_request' THEN 'native'
             WHEN "attr.rid" IS NOT NULL AND "attr.module" = 'sglang::request' AND name LIKE '%Req %' THEN 'sglang'
             WHEN "attr.code.namespace" = 'text_generation_router::server'
                  AND name IN ('chat_completions', 'completions', 'generate', 'generate_stream') THEN 'tgi'
        END AS form
    FROM spans
    WHERE name IN ('llm_request', 'queue', 'kv_transfer', 'prefill_forward', 'chunked_prefill', 'queued',
                   'send_generation', 'chat_completions', 'completions', 'generate', 'generate_stream')
       OR "attr.thread_label" IS NOT NULL OR "attr.rid" IS NOT NULL
       OR ("attr.gen_ai.request.model" IS NOT NULL AND name <> 'engine_step')
),
engine_span AS (
    SELECT * FROM pick WHERE form IS NOT NULL
),
queue AS (
    SELECT trace_id, parent_span_id, max(end_ns) AS scheduled_ns
    FROM pick WHERE name = 'queue' GROUP BY ALL
),
kv AS (
    SELECT trace_id, "attr.gen_ai.request.id" AS request_id, sum(end_ns - start_ns)::BIGINT AS kv_transfer_ns
    FROM pick WHERE name = 'kv_transfer' GROUP BY ALL
),
-- SGLang: the scheduler's slices and thread span, per trace (one request per trace unless disaggregated)
sglang_slices AS (
    SELECT trace_id,
           any_value("attr.host_id"[1:8] || ':' || CAST("attr.pid" AS VARCHAR))
               FILTER (WHERE "attr.thread_label" LIKE '%Scheduler') AS scheduler,
           sum(len(list_filter(events, lambda e: e.name = 'retract')))
               FILTER (WHERE "attr.thread_label" LIKE '%Scheduler') AS preemptions,
           min(start_ns) FILTER (WHERE name = 'prefill_forward') AS scheduled_ns,
           count(*) FILTER (WHERE name = 'chunked_prefill') AS prefill_chunks
    FROM pick
    WHERE name IN ('prefill_forward', 'chunked_prefill') OR "attr.thread_label" IS NOT NULL
    GROUP BY trace_id
),
-- TGI: when the batching task picked the request, and the tokens it sent
tgi_spans AS (
    SELECT trace_id,
           max(end_ns) FILTER (WHERE name = 'queued') AS scheduled_ns,
           min(start_ns) FILTER (WHERE name = 'send_generation') AS first_token_ns,
           count(*) FILTER (WHERE name = 'send_generation') AS output_tokens
    FROM pick WHERE name IN ('queued', 'send_generation')
    GROUP BY trace_id
),
-- one row per engine request, with every column the relation needs, named once
engine AS (
    SELECT
        r.form, r.name, r.trace_id, r.span_id, r.parent_span_id, r.start_ns, r.end_ns, r.status_code,
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
                 t.output_tokens) AS output_tokens,
        coalesce(r."attr.gen_ai.usage.cache_read.input_tokens", r."attr.gen_ai.usage.cached_tokens")
            AS cached_tokens,
        r."attr.infertrace.request.system_prompt.id" AS system_prompt_id,
        r."attr.infertrace.request.system_prompt.tokens" AS system_prompt_tokens,
        r."attr.infertrace.request.assistant_prefill_tokens" AS assistant_prefill_tokens,
        r."attr.gen_ai.request.max_tokens" AS max_tokens,
        r."attr.infertrace.request.preemptions" AS own_preemptions,
        coalesce(r."attr.infertrace.request.prefill_chunks", s.prefill_chunks) AS prefill_chunks,
        r."attr.gen_ai.response.finish_reasons"[1] AS finish_reason,
        r."attr.error.type" AS error_type,
        q.scheduled_ns AS q_scheduled_ns,
        list_filter(r.events, lambda e: e.name = 'first_token')[1].time_ns AS event_first_token_ns,
        CASE WHEN r.form = 'sglang' THEN coalesce(s.preemptions, 0)
             ELSE len(list_filter(r.events, lambda e: e.name IN ('preempted', 'journey.PREEMPTED'))) END
            AS event_preemptions,
        CAST(round(r."attr.gen_ai.latency.time_in_queue" * 1e9) AS BIGINT) AS attr_queue_ns,
        CAST(round(r."attr.gen_ai.latency.time_to_first_token" * 1e9) AS BIGINT) AS attr_ttft_ns,
        CAST(round(r."attr.gen_ai.latency.time_in_model_prefill" * 1e9) AS BIGINT) AS attr_prefill_ns,
        CAST(round(r."attr.gen_ai.latency.e2e" * 1e9) AS BIGINT) AS attr_e2e_ns,
        coalesce(s.scheduled_ns, t.scheduled_ns) AS own_scheduled_ns,
        t.first_token_ns AS own_first_token_ns,
        s.scheduler AS sglang_instance,
        r.bootstrap_room,
        CASE
            WHEN r.form <> 'native' THEN r.form
            WHEN r."attr.infertrace.request.preemptions" IS NOT NULL OR q.scheduled_ns IS NOT NULL THEN 'infertrace'
            WHEN r."attr.gen_ai.latency.time_in_model_inference" IS NOT NULL OR r."res.vllm.process_id" IS NOT NULL
                THEN 'vllm-v1'
            ELSE 'vllm-v0'
        END AS source
    FROM engine_span r
    LEFT JOIN queue q ON r.form = 'native' AND q.trace_id = r.trace_id AND q.parent_span_id = r.span_id
    LEFT JOIN sglang_slices s ON r.form = 'sglang' AND s.trace_id = r.trace_id
    LEFT JOIN tgi_spans t ON r.form = 'tgi' AND t.trace_id = r.trace_id
),
-- What else the trace says (a gateway's span): for requests whose own span lacks a model, an id or a tenant
trace_info AS (
    SELECT trace_id,
           any_value("attr.gen_ai.request.model") AS model,
           any_value("attr.gen_ai.request.id") FILTER (WHERE "attr.gen_ai.request.id" IS NOT NULL) AS request_id,
           any_value(coalesce("attr.infertrace.tenant.id", "attr.metadata.user_api_key_team_id", "attr.user.id"))
               AS tenant,
           -- the prompt's tokens as the gateway's span reports the engine's usage (LiteLLM: on `litellm_request`,
           -- or on its root span since v1.81), where the trace's gateway spans agree on one count
           CASE WHEN min(usage_input_tokens) = max(usage_input_tokens) THEN min(usage_input_tokens) END
               AS input_tokens
    FROM pick
    WHERE form IS NULL AND "attr.gen_ai.request.model" IS NOT NULL
    GROUP BY trace_id
),
phases AS (
    SELECT
        e.*,
        ti.model AS trace_model, ti.request_id AS trace_request_id, ti.tenant AS trace_tenant,
        ti.input_tokens AS trace_input_tokens,
        coalesce(e.event_first_token_ns, e.own_first_token_ns, e.start_ns + e.attr_ttft_ns) AS first_token
    FROM engine e
    LEFT JOIN trace_info ti ON ti.trace_id = e.trace_id
),
timed AS (
    SELECT
        *,
        coalesce(q_scheduled_ns, own_scheduled_ns,
                 CASE WHEN source = 'vllm-v1' THEN first_token - attr_prefill_ns END,
                 start_ns + attr_queue_ns) AS scheduled,
        CASE WHEN source IN ('vllm-v1', 'vllm-v0', 'sglang') AND attr_e2e_ns IS NOT NULL
             THEN start_ns + attr_e2e_ns ELSE end_ns END AS finish
    FROM phases
)
SELECT
    coalesce(p.own_request_id, p.trace_request_id, p.span_id) AS request_id,
    p.trace_id,
    p.span_id,
    p.parent_span_id,
    coalesce(p.own_model, p.trace_model, p.service) AS model,
    coalesce(p.own_tenant, p.trace_tenant) AS tenant,
    p.service,
    coalesce(p.instance_id, p.host || ':' || CAST(p.pid AS VARCHAR), p.sglang_instance,
             p.service || ':' || p.vllm_pid, p.service) AS instance,
    coalesce(p.component_kind, 'engine') AS component_kind,
    p.hardware,
    p.region,
    CASE WHEN p.component_kind = 'prefill_worker' OR (p.form = 'sglang' AND lower(p.name) LIKE 'prefill req %')
              THEN 'prefill'
         WHEN p.component_kind = 'decode_worker' OR (p.form = 'sglang' AND lower(p.name) LIKE 'decode req %')
              THEN 'decode'
         ELSE 'colocated' END AS role,
    p.start_ns AS arrival_ns,
    p.scheduled AS scheduled_ns,
    p.first_token AS first_token_ns,
    p.finish AS finish_ns,
    p.scheduled - p.start_ns AS queue_ns,
    p.first_token - p.start_ns AS ttft_ns,
    p.first_token - p.scheduled AS prefill_ns,
    p.finish - p.first_token AS decode_ns,
    p.finish - p.start_ns AS e2e_ns,
    kv.kv_transfer_ns,
    coalesce(p.input_tokens, p.trace_input_tokens) AS input_tokens,
    p.output_tokens,
    p.cached_tokens,
    p.system_prompt_id,
    p.system_prompt_tokens,
    p.assistant_prefill_tokens,
    p.max_tokens,
    CAST(coalesce(p.own_preemptions, CASE WHEN p.source IN ('sglang', 'infertrace') OR p.event_preemptions > 0
                                          THEN p.event_preemptions END) AS BIGINT) AS preemptions,
    p.prefill_chunks,
    p.finish_reason,
    p.error_type,
    p.status_code,
    CASE WHEN p.status_code = 2 OR p.error_type IS NOT NULL THEN 'error' ELSE 'ok' END AS outcome,
    CASE WHEN p.q_scheduled_ns IS NOT NULL OR p.event_first_token_ns IS NOT NULL OR p.form <> 'native'
              THEN 'spans'
         WHEN p.attr_ttft_ns IS NOT NULL THEN 'gen_ai.latency' END AS timing_source,
    p.source,
    CASE WHEN p.own_model IS NOT NULL THEN 'attribute'
         WHEN p.trace_model IS NOT NULL THEN 'trace'
         WHEN p.service IS NOT NULL THEN 'service.name' END AS model_source,
    CASE WHEN p.instance_id IS NOT NULL THEN 'service.instance.id'
         WHEN p.host IS NOT NULL AND p.pid IS NOT NULL THEN 'host.name+process.pid'
         WHEN p.sglang_instance IS NOT NULL THEN 'sglang scheduler'
         WHEN p.service IS NOT NULL AND p.vllm_pid IS NOT NULL THEN 'service.name+vllm.process_id'
         WHEN p.service IS NOT NULL THEN 'service.name' END AS instance_source,
    CASE WHEN p.form = 'sglang' THEN p.bootstrap_room END AS pair_key
FROM timed p
LEFT JOIN kv ON kv.trace_id = p.trace_id AND kv.request_id = p.own_request_id
