-- requests: one row per logical request, whatever engines served it. A colocated request is its one leg of
-- `request_legs`; a disaggregated request joins its prefill leg (prompt computed on a prefill worker) and its
-- decode leg (KV received over a link, tokens generated on a decode worker) into one row. Count requests,
-- take TTFT/E2E percentiles and bill here; look at engines' own work in `request_legs`.
--
-- Answers: how long did each request take from the gateway to the first token the client received, and
-- where did that time go (gateway components, prefill queue, prefill, KV transfer, decode queue, first
-- decode), each phase taken from the leg it belongs to; how many tokens in, out and from the prefix cache;
-- which tenant, model, engines and link; did it fail; could its legs be matched.
-- Columns: times are int64 ns since the epoch, durations int64 ns.
--   Those of `request_legs` (same names), for the request as a whole: request_id, trace_id, span_id,
--   parent_span_id (the decode leg's, else the only leg's), model, tenant, service, instance, component_kind,
--   hardware, region (of the leg whose tokens the client receives: the decode leg, else the only leg),
--   arrival_ns (at the first engine), scheduled_ns (first scheduling on the first engine), first_token_ns (the
--   first token of the leg the client receives tokens from), finish_ns, queue_ns (prefill queue), ttft_ns
--   (arrival at the first engine to first_token_ns), prefill_ns (a colocated request: first scheduling to
--   first token; a disaggregated one: the prefill leg's first scheduling to its end, or to the decode leg's
--   first token when that came first), decode_ns, e2e_ns,
--   kv_transfer_ns (disaggregated: end of the prefill leg to arrival at the decode worker, which the
--   reference engine's `kv_transfer` span covers exactly; NULL when the decode leg arrived before the prefill
--   leg ended, as SGLang's router sends both at once: the transfer is then not separable from the decode
--   worker's wait, which decode_queue_ns holds from the prefill's end). "The prefill's end" here is the prefill
--   leg's end, or the decode leg's first token when that came first (a prefill server whose span outlasts the
--   token the decode server produced from its KV: the span covers more than the prefill).
--   input_tokens, output_tokens (the decode leg's: the prefill leg's one token is not sent to the client),
--   cached_tokens (the prefill leg's prefix-cache hit),
--   system_prompt_id, system_prompt_tokens, assistant_prefill_tokens, max_tokens, preemptions (over all
--   legs), prefill_chunks (the prefill leg's), finish_reason, error_type, status_code, outcome ('error' when
--   any leg failed), timing_source, source, model_source, instance_source;
--   and: serving ('colocated' | 'disaggregated'), legs (engine legs joined), prefill_instance,
--   prefill_hardware, prefill_region, decode_instance (NULL when colocated), kv_link, kv_bytes (from the
--   `kv_transfer` span; NULL without one), gateway_start_ns (start of the trace's gateway entry span; NULL
--   without one), client_ttft_ns (gateway_start_ns to first_token_ns, else ttft_ns), gateway_ns (gateway start
--   to arrival at the first engine: auth, rate limit, global queue, route), decode_queue_ns (arrival at the
--   decode worker to its first scheduling; for a decode leg sent before the prefill ended: the prefill's end to
--   that scheduling, or 0 when it was scheduled before), first_decode_ns (the later of that scheduling and the
--   prefill's end, to the first token: the decode worker's one-token recompute),
--   leg_problem (NULL when the legs make one whole request; else why they do not: 'decode leg without a
--   prefill leg', 'prefill leg without a decode leg' (and it did not fail there: a request that failed on its
--   prefill worker never reaches a decode worker), 'several legs of one role' — such rows are kept, with
--   the phases that can be known).
--   leg_roles (disaggregated: 'declared' when the engines' resources (or SGLang's span names) say which leg is
--   which; 'inferred' when a trace held exactly two legs that declared nothing, the first generating one token
--   and ending before the second arrived, as behind vLLM's P/D proxy; NULL when colocated).
--   A request with only a prefill leg has no first_token_ns, ttft, decode_ns nor output_tokens.
-- The TTFT phases partition the client's TTFT exactly: gateway_ns + queue_ns + prefill_ns + kv_transfer_ns (0
-- when NULL) + decode_queue_ns + first_decode_ns = client_ttft_ns for a disaggregated request with a gateway;
-- gateway_ns + queue_ns + prefill_ns = client_ttft_ns for a colocated one.
-- Matching: legs that carry the same `pair_key` (SGLang's bootstrap_room) and declare their role form one
-- request whatever trace each is in (SGLang's router without trace context gives each server its own trace);
-- otherwise a trace's legs form one request when it holds at most one leg of each role (vLLM's and SGLang's
-- P/D proxies give the two legs different request ids but, with trace context propagated, one trace);
-- otherwise legs are matched on (trace, request id).
WITH
-- Per trace: its legs of each declared role and its first leg by arrival. Groupings over the legs' keys, not
-- windows over their whole rows (a window over tens of thousands of one-leg traces costs several times as much).
per_trace AS (
    SELECT
        trace_id,
        count(*) AS trace_legs,
        count(*) FILTER (WHERE role = 'prefill') AS declared_prefills,
        count(*) FILTER (WHERE role = 'decode') AS declared_decodes,
        count(*) FILTER (WHERE role = 'colocated') AS declared_colocated,
        arg_min(span_id, (arrival_ns, span_id)) AS first_span_id,
        arg_min_null(output_tokens, (arrival_ns, span_id)) AS first_output,
        arg_min_null(finish_ns, (arrival_ns, span_id)) AS first_finish_ns,
        max(arrival_ns) AS last_arrival_ns
    FROM request_legs
    GROUP BY trace_id
),
-- A trace of exactly two legs whose engines declare no role (vLLM's `llm_request` spans behind a P/D proxy): the
-- first is a prefill leg when it generated one token and ended before the second arrived (the proxy sends the
-- prefill request with max_tokens 1, then the decode request).
paired AS (
    SELECT l.trace_id, l.span_id, l.request_id, l.role, l.pair_key, l.arrival_ns, l.preemptions, l.status_code,
           l.outcome,
           p.declared_prefills, p.declared_decodes, p.declared_colocated,
           l.span_id = p.first_span_id AS first_leg,
           p.trace_legs = 2 AND p.declared_colocated = 2 AND p.first_output = 1
               AND p.first_finish_ns <= p.last_arrival_ns AS roles_inferred
    FROM request_legs l
    JOIN per_trace p ON p.trace_id = l.trace_id
),
keyed AS (
    SELECT * REPLACE (CASE WHEN roles_inferred THEN CASE WHEN first_leg THEN 'prefill' ELSE 'decode' END
                           ELSE role END AS role),
           CASE WHEN pair_key IS NOT NULL AND role IN ('prefill', 'decode') THEN 'pair/' || pair_key
                WHEN roles_inferred OR (declared_colocated = 0 AND declared_prefills <= 1 AND declared_decodes <= 1)
                THEN trace_id ELSE trace_id || '/' || request_id END AS request_key
    FROM paired
),
-- per request: its legs, and which of them is the leg whose tokens the client receives (the decode leg, else the
-- only or latest leg) and the leg it entered the engines by (the prefill leg, else the only or earliest leg)
counts AS (
    SELECT
        request_key,
        count(*) AS legs,
        count(*) FILTER (WHERE role = 'prefill') AS prefills,
        count(*) FILTER (WHERE role = 'decode') AS decodes,
        count(*) FILTER (WHERE role = 'colocated') AS colocated,
        bool_or(roles_inferred) AS roles_inferred,
        sum(preemptions)::BIGINT AS all_preemptions,
        max(status_code) AS all_status_code,
        bool_or(outcome = 'error') AS any_error,
        arg_min(trace_id, (role <> 'decode', role <> 'colocated', -arrival_ns, span_id)) AS out_trace_id,
        arg_min(span_id, (role <> 'decode', role <> 'colocated', -arrival_ns, span_id)) AS out_span_id,
        arg_min(role, (role <> 'decode', role <> 'colocated', -arrival_ns, span_id)) AS out_role,
        arg_min(trace_id, (role <> 'prefill', role <> 'colocated', arrival_ns, span_id)) AS in_trace_id,
        arg_min(span_id, (role <> 'prefill', role <> 'colocated', arrival_ns, span_id)) AS in_span_id,
        arg_min(role, (role <> 'prefill', role <> 'colocated', arrival_ns, span_id)) AS in_role
    FROM keyed
    GROUP BY request_key
),
-- a prefill leg's one token never reaches the client, so a request with only a prefill leg has no first token
-- nor output
out_leg AS (
    SELECT c.request_key,
           l.* REPLACE (c.out_role AS role,
                        CASE WHEN c.out_role <> 'prefill' THEN l.first_token_ns END AS first_token_ns,
                        CASE WHEN c.out_role <> 'prefill' THEN l.decode_ns END AS decode_ns,
                        CASE WHEN c.out_role <> 'prefill' THEN l.output_tokens END AS output_tokens)
    FROM counts c
    JOIN request_legs l ON l.trace_id = c.out_trace_id AND l.span_id = c.out_span_id
),
in_leg AS (
    SELECT c.request_key, l.* REPLACE (c.in_role AS role)
    FROM counts c
    JOIN request_legs l ON l.trace_id = c.in_trace_id AND l.span_id = c.in_span_id
),
calls AS MATERIALIZED (
    SELECT component, trace_id, request_id, start_ns, kv_link, kv_bytes
    FROM component_calls WHERE component IN ('gateway', 'kv_transfer')
),
gateway AS (
    SELECT trace_id, min(start_ns) AS gateway_start_ns
    FROM calls WHERE component = 'gateway' GROUP BY trace_id
),
kv AS (
    SELECT trace_id, request_id, any_value(kv_link) AS kv_link, sum(kv_bytes)::BIGINT AS kv_bytes
    FROM calls WHERE component = 'kv_transfer' GROUP BY ALL
),
joined AS (
    SELECT
        c.*,
        c.prefills = 1 AND c.decodes = 1 AND c.colocated = 0 AS disaggregated,
        CASE WHEN c.legs = 1 AND c.colocated = 1 THEN NULL
             WHEN c.prefills > 1 OR c.decodes > 1 OR c.colocated > 1 OR (c.colocated > 0 AND c.legs > 1)
                 THEN 'several legs of one role'
             WHEN c.prefills = 0 THEN 'decode leg without a prefill leg'
             WHEN c.decodes = 0 AND NOT c.any_error THEN 'prefill leg without a decode leg'
        END AS leg_problem
    FROM counts c
)
SELECT
    o.request_id AS request_id,
    o.trace_id AS trace_id,
    o.span_id AS span_id,
    o.parent_span_id AS parent_span_id,
    coalesce(o.model, i.model) AS model,
    coalesce(o.tenant, i.tenant) AS tenant,
    o.service AS service,
    o.instance AS instance,
    o.component_kind AS component_kind,
    o.hardware AS hardware,
    o.region AS region,
    i.arrival_ns AS arrival_ns,
    i.scheduled_ns AS scheduled_ns,
    o.first_token_ns AS first_token_ns,
    o.finish_ns AS finish_ns,
    i.queue_ns AS queue_ns,
    o.first_token_ns - i.arrival_ns AS ttft_ns,
    CASE WHEN j.disaggregated THEN e.prefill_end_ns - i.scheduled_ns ELSE i.prefill_ns END AS prefill_ns,
    o.decode_ns AS decode_ns,
    o.finish_ns - i.arrival_ns AS e2e_ns,
    CASE WHEN j.disaggregated AND o.arrival_ns >= i.finish_ns THEN o.arrival_ns - i.finish_ns END AS kv_transfer_ns,
    coalesce(i.input_tokens, o.input_tokens) AS input_tokens,
    o.output_tokens AS output_tokens,
    coalesce(i.cached_tokens, o.cached_tokens) AS cached_tokens,
    coalesce(i.system_prompt_id, o.system_prompt_id) AS system_prompt_id,
    coalesce(i.system_prompt_tokens, o.system_prompt_tokens) AS system_prompt_tokens,
    coalesce(i.assistant_prefill_tokens, o.assistant_prefill_tokens) AS assistant_prefill_tokens,
    o.max_tokens AS max_tokens,
    j.all_preemptions AS preemptions,
    i.prefill_chunks AS prefill_chunks,
    o.finish_reason AS finish_reason,
    coalesce(o.error_type, i.error_type) AS error_type,
    j.all_status_code AS status_code,
    CASE WHEN j.any_error THEN 'error' ELSE 'ok' END AS outcome,
    o.timing_source AS timing_source,
    o.source AS source,
    o.model_source AS model_source,
    o.instance_source AS instance_source,
    CASE WHEN j.prefills + j.decodes > 0 THEN 'disaggregated' ELSE 'colocated' END AS serving,
    j.legs,
    CASE WHEN i.role = 'prefill' THEN i.instance END AS prefill_instance,
    CASE WHEN i.role = 'prefill' THEN i.hardware END AS prefill_hardware,
    CASE WHEN i.role = 'prefill' THEN i.region END AS prefill_region,
    CASE WHEN o.role = 'decode' THEN o.instance END AS decode_instance,
    kv.kv_link,
    kv.kv_bytes,
    gw.gateway_start_ns,
    coalesce(o.first_token_ns - gw.gateway_start_ns, o.first_token_ns - i.arrival_ns) AS client_ttft_ns,
    i.arrival_ns - gw.gateway_start_ns AS gateway_ns,
    CASE WHEN NOT j.disaggregated THEN NULL
         WHEN o.arrival_ns >= i.finish_ns THEN o.queue_ns
         ELSE greatest(o.scheduled_ns, e.prefill_end_ns) - e.prefill_end_ns END AS decode_queue_ns,
    CASE WHEN j.disaggregated THEN o.first_token_ns - greatest(o.scheduled_ns, e.prefill_end_ns) END AS first_decode_ns,
    j.leg_problem,
    CASE WHEN j.prefills + j.decodes = 0 THEN NULL
         WHEN j.roles_inferred THEN 'inferred' ELSE 'declared' END AS leg_roles
FROM joined j
JOIN out_leg o ON o.request_key = j.request_key
JOIN in_leg i ON i.request_key = j.request_key
CROSS JOIN LATERAL (SELECT least(i.finish_ns, o.first_token_ns) AS prefill_end_ns) e  -- "the prefill's end" (above)
LEFT JOIN gateway gw ON gw.trace_id = o.trace_id
LEFT JOIN kv ON kv.trace_id = o.trace_id AND kv.request_id = o.request_id
