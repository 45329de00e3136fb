-- requests (ClickHouse form of infertrace/store/relations/requests.sql): one row per logical request, a colocated
-- request's one leg or a disaggregated request's prefill and decode legs joined. Same columns, same matching
-- rules; read that file for what each column means. Kept beside it: a change there is made here too, and
-- tests/test_store_clickhouse.py holds the two to the same rows on every sample.
-- {request_legs}, {component_calls}: their ClickHouse forms. DuckDB's least/greatest skip NULLs and
-- arg_min_null keeps a NULL argument; ClickHouse's do neither, hence the coalesces and one-element tuples.
WITH
legs AS (
    SELECT * FROM ({request_legs})
),
per_trace AS (
    SELECT
        trace_id,
        count() AS trace_legs,
        countIf(role = 'prefill') AS declared_prefills,
        countIf(role = 'decode') AS declared_decodes,
        countIf(role = 'colocated') AS declared_colocated,
        argMin(span_id, (arrival_ns, span_id)) AS first_span_id,
        argMin(tuple(output_tokens), (arrival_ns, span_id)).1 AS first_output,
        argMin(tuple(finish_ns), (arrival_ns, span_id)).1 AS first_finish_ns,
        max(arrival_ns) AS last_arrival_ns
    FROM legs
    GROUP BY trace_id
),
paired AS (
    SELECT l.trace_id AS trace_id, l.span_id AS span_id, l.request_id AS request_id, l.pair_key AS pair_key,
           l.arrival_ns AS arrival_ns, l.preemptions AS preemptions, l.status_code AS status_code,
           l.outcome AS outcome,
           p.declared_prefills AS declared_prefills, p.declared_decodes AS declared_decodes,
           p.declared_colocated AS declared_colocated,
           l.span_id = p.first_span_id AS first_leg,
           coalesce(p.trace_legs = 2 AND p.declared_colocated = 2 AND p.first_output = 1
                    AND p.first_finish_ns <= p.last_arrival_ns, false) AS roles_inferred,
           if(roles_inferred, if(first_leg, 'prefill', 'decode'), l.role) AS leg_role
    FROM legs l
    JOIN per_trace p ON p.trace_id = l.trace_id
),
keyed AS (
    SELECT *,
           multiIf(pair_key IS NOT NULL AND leg_role IN ('prefill', 'decode'), concat('pair/', pair_key),
                   roles_inferred OR (declared_colocated = 0 AND declared_prefills <= 1 AND declared_decodes <= 1),
                   trace_id, concat(trace_id, '/', coalesce(request_id, ''))) AS request_key,
           request_id IS NULL AND NOT (roles_inferred OR (declared_colocated = 0 AND declared_prefills <= 1
                                                          AND declared_decodes <= 1)) AS unkeyed
    FROM paired
),
counts AS (
    SELECT
        request_key,
        count() AS legs,
        countIf(leg_role = 'prefill') AS prefills,
        countIf(leg_role = 'decode') AS decodes,
        countIf(leg_role = 'colocated') AS colocated,
        max(roles_inferred) AS any_roles_inferred,
        toInt64(sum(preemptions)) AS all_preemptions,
        max(status_code) AS all_status_code,
        max(outcome = 'error') AS any_error,
        argMin(trace_id, (leg_role <> 'decode', leg_role <> 'colocated', -arrival_ns, span_id)) AS out_trace_id,
        argMin(span_id, (leg_role <> 'decode', leg_role <> 'colocated', -arrival_ns, span_id)) AS out_span_id,
        argMin(leg_role, (leg_role <> 'decode', leg_role <> 'colocated', -arrival_ns, span_id)) AS out_role,
        argMin(trace_id, (leg_role <> 'prefill', leg_role <> 'colocated', arrival_ns, span_id)) AS in_trace_id,
        argMin(span_id, (leg_role <> 'prefill', leg_role <> 'colocated', arrival_ns, span_id)) AS in_span_id,
        argMin(leg_role, (leg_role <> 'prefill', leg_role <> 'colocated', arrival_ns, span_id)) AS in_role
    FROM keyed
    GROUP BY request_key, if(unkeyed, span_id, '')
),
joined AS (
    SELECT
        *,
        prefills = 1 AND decodes = 1 AND colocated = 0 AS disaggregated,
        multiIf(legs = 1 AND colocated = 1, NULL,
                prefills > 1 OR decodes > 1 OR colocated > 1 OR (colocated > 0 AND legs > 1),
                'several legs of one role',
                prefills = 0, 'decode leg without a prefill leg',
                decodes = 0 AND NOT any_error, 'prefill leg without a decode leg', NULL) AS leg_problem
    FROM counts
),
calls AS (
    SELECT component, trace_id, request_id, start_ns, kv_link, kv_bytes
    FROM ({component_calls}) WHERE component IN ('gateway', 'kv_transfer')
),
gateway AS (
    SELECT trace_id, min(start_ns) AS gateway_start_ns
    FROM calls WHERE component = 'gateway' GROUP BY trace_id
),
kv AS (
    SELECT trace_id, request_id, any(kv_link) AS kv_link, toInt64(sum(kv_bytes)) AS kv_bytes
    FROM calls WHERE component = 'kv_transfer' GROUP BY trace_id, request_id
),
legs_of AS (
    SELECT
        j.*,
        o.request_id AS o_request_id, o.trace_id AS o_trace_id, o.span_id AS o_span_id,
        o.parent_span_id AS o_parent_span_id, o.model AS o_model, o.tenant AS o_tenant, o.service AS o_service,
        o.instance AS o_instance, o.component_kind AS o_component_kind, o.hardware AS o_hardware,
        o.region AS o_region, o.arrival_ns AS o_arrival_ns, o.scheduled_ns AS o_scheduled_ns,
        o.queue_ns AS o_queue_ns, o.finish_ns AS o_finish_ns,
        if(j.out_role <> 'prefill', o.first_token_ns, NULL) AS o_first_token_ns,
        if(j.out_role <> 'prefill', o.decode_ns, NULL) AS o_decode_ns,
        if(j.out_role <> 'prefill', o.output_tokens, NULL) AS o_output_tokens,
        o.input_tokens AS o_input_tokens, o.cached_tokens AS o_cached_tokens,
        o.system_prompt_id AS o_system_prompt_id, o.system_prompt_tokens AS o_system_prompt_tokens,
        o.assistant_prefill_tokens AS o_assistant_prefill_tokens, o.max_tokens AS o_max_tokens,
        o.finish_reason AS o_finish_reason, o.error_type AS o_error_type, o.timing_source AS o_timing_source,
        o.source AS o_source, o.model_source AS o_model_source, o.instance_source AS o_instance_source,
        i.model AS i_model, i.tenant AS i_tenant, i.instance AS i_instance, i.hardware AS i_hardware,
        i.region AS i_region, i.arrival_ns AS i_arrival_ns, i.scheduled_ns AS i_scheduled_ns,
        i.finish_ns AS i_finish_ns, i.queue_ns AS i_queue_ns, i.prefill_ns AS i_prefill_ns,
        i.input_tokens AS i_input_tokens, i.cached_tokens AS i_cached_tokens,
        i.system_prompt_id AS i_system_prompt_id, i.system_prompt_tokens AS i_system_prompt_tokens,
        i.assistant_prefill_tokens AS i_assistant_prefill_tokens, i.prefill_chunks AS i_prefill_chunks,
        i.error_type AS i_error_type,
        -- "the prefill's end" (requests.sql)
        least(coalesce(i_finish_ns, o_first_token_ns), coalesce(o_first_token_ns, i_finish_ns)) AS prefill_end_ns,
        greatest(coalesce(o_scheduled_ns, prefill_end_ns), coalesce(prefill_end_ns, o_scheduled_ns))
            AS decode_start_ns
    FROM joined j
    JOIN legs o ON o.trace_id = j.out_trace_id AND o.span_id = j.out_span_id
    JOIN legs i ON i.trace_id = j.in_trace_id AND i.span_id = j.in_span_id
)
SELECT
    l.o_request_id AS request_id,
    l.o_trace_id AS trace_id,
    l.o_span_id AS span_id,
    l.o_parent_span_id AS parent_span_id,
    coalesce(l.o_model, l.i_model) AS model,
    coalesce(l.o_tenant, l.i_tenant) AS tenant,
    l.o_service AS service,
    l.o_instance AS instance,
    l.o_component_kind AS component_kind,
    l.o_hardware AS hardware,
    l.o_region AS region,
    l.i_arrival_ns AS arrival_ns,
    l.i_scheduled_ns AS scheduled_ns,
    l.o_first_token_ns AS first_token_ns,
    l.o_finish_ns AS finish_ns,
    l.i_queue_ns AS queue_ns,
    l.o_first_token_ns - l.i_arrival_ns AS ttft_ns,
    if(l.disaggregated, l.prefill_end_ns - l.i_scheduled_ns, l.i_prefill_ns) AS prefill_ns,
    l.o_decode_ns AS decode_ns,
    l.o_finish_ns - l.i_arrival_ns AS e2e_ns,
    if(l.disaggregated AND l.o_arrival_ns >= l.i_finish_ns, l.o_arrival_ns - l.i_finish_ns, NULL) AS kv_transfer_ns,
    coalesce(l.i_input_tokens, l.o_input_tokens) AS input_tokens,
    l.o_output_tokens AS output_tokens,
    coalesce(l.i_cached_tokens, l.o_cached_tokens) AS cached_tokens,
    coalesce(l.i_system_prompt_id, l.o_system_prompt_id) AS system_prompt_id,
    coalesce(l.i_system_prompt_tokens, l.o_system_prompt_tokens) AS system_prompt_tokens,
    coalesce(l.i_assistant_prefill_tokens, l.o_assistant_prefill_tokens) AS assistant_prefill_tokens,
    l.o_max_tokens AS max_tokens,
    l.all_preemptions AS preemptions,
    l.i_prefill_chunks AS prefill_chunks,
    l.o_finish_reason AS finish_reason,
    coalesce(l.o_error_type, l.i_error_type) AS error_type,
    l.all_status_code AS status_code,
    if(l.any_error, 'error', 'ok') AS outcome,
    l.o_timing_source AS timing_source,
    l.o_source AS source,
    l.o_model_source AS model_source,
    l.o_instance_source AS instance_source,
    if(l.prefills + l.decodes > 0, 'disaggregated', 'colocated') AS serving,
    l.legs AS legs,
    if(l.in_role = 'prefill', l.i_instance, NULL) AS prefill_instance,
    if(l.in_role = 'prefill', l.i_hardware, NULL) AS prefill_hardware,
    if(l.in_role = 'prefill', l.i_region, NULL) AS prefill_region,
    if(l.out_role = 'decode', l.o_instance, NULL) AS decode_instance,
    kv.kv_link AS kv_link,
    kv.kv_bytes AS kv_bytes,
    gw.gateway_start_ns AS gateway_start_ns,
    coalesce(l.o_first_token_ns - gw.gateway_start_ns, l.o_first_token_ns - l.i_arrival_ns) AS client_ttft_ns,
    l.i_arrival_ns - gw.gateway_start_ns AS gateway_ns,
    multiIf(NOT l.disaggregated, NULL, l.o_arrival_ns >= l.i_finish_ns, l.o_queue_ns,
            l.decode_start_ns - l.prefill_end_ns) AS decode_queue_ns,
    if(l.disaggregated, l.o_first_token_ns - l.decode_start_ns, NULL) AS first_decode_ns,
    l.leg_problem AS leg_problem,
    multiIf(l.prefills + l.decodes = 0, NULL, l.any_roles_inferred, 'inferred', 'declared') AS leg_roles
FROM legs_of l
LEFT JOIN gateway gw ON gw.trace_id = l.o_trace_id
LEFT JOIN kv ON kv.trace_id = l.o_trace_id AND kv.request_id = l.o_request_id
