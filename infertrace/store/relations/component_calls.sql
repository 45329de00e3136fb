-- component_calls: one row per call to a serving component around the engines: the entry span the client
-- called (a gateway or proxy), every call the request made on its way to or beside the engine (auth, rate
-- limiter, router, queue, whatever a gateway's spans show), and each KV transfer.
--
-- Answers: which component handled a request, how long it took, what it decided (ok, rejected, timeout,
-- error; HTTP-style status), where the router sent it. Use it when several models degrade at once: a
-- shared component whose latency or rejections rose across exactly those models is the likely cause.
-- Components are found in the trace tree, not by name: in a trace with an engine request (`request_legs`) or an
-- entry, a call is any span that is not the entry, not an engine's request span nor one of that engine's own
-- spans (same service), not a wrapper around the engine's span (its direct parent, ending past the middle
-- of it: a proxy's call to the engine), and that runs on another service than the entry or carries
-- http.route, peer.service or server.address. Spans of the entry's own service without those are listed too
-- (found_by 'same_service': a proxy's in-process hooks) for `--components` to name; this project's own
-- gateway spans (`auth`, `rate_limit`, `route`, `global_queue`) and `kv_transfer` are found by name, also in a
-- trace that has neither an entry nor an engine span (a trace whose other spans were lost or sampled away).
-- The entry is the root span of a request trace (no parent, or a parent not in the store) that is a SERVER
-- span or carries http.route and is not an engine's own span: `component` is 'gateway' for it.
-- Columns: component ('gateway' for the entry, else the span name), role ('entry' | 'call' | 'kv_transfer'),
--   operation (http.route, else the span name), found_by ('name' | 'service' | 'http' | 'same_service' |
--   'entry'), component_kind (infertrace.component.kind; NULL for spans of other sources), service, instance
--   (service.instance.id, else host.name:process.pid, else service.name), region, request_id, tenant, model
--   (the span's own gen_ai.request.model, else its trace's engine's, else its entry's, else the one model its
--   trace's CLIENT spans name: an application or gateway whose GenAI instrumentation, e.g. OpenLLMetry, puts the
--   model on its call to the model and not on the request it serves; a name the entries give a model that their
--   traces show served by exactly one engine model is that model's name: a proxy's alias, e.g. LiteLLM's
--   model_name, is not a model of its own), trace_id, span_id,
--   parent_span_id, start_ns, end_ns, latency_ns, outcome (the span's infertrace.component.outcome; without
--   it: 'error' for an error status or HTTP 5xx, 'rejected' for 4xx, else 'ok'), http_status
--   (`http.response.status_code`, else the older conventions' `http.status_code`), route_target,
--   error_type, status_code, input_tokens, output_tokens (gen_ai.usage.*, as a gateway reports them), kv_bytes,
--   kv_source, kv_destination, kv_link, queue_ns (time the call waited for a free worker of the component, inside
--   the span: `infertrace.component.queue_ns`; NULL when the component does not queue), resend_count (the
--   client's retry number, `http.request.resend_count`; NULL on a first attempt or unknown).
WITH
eng AS MATERIALIZED (
    SELECT trace_id, span_id, parent_span_id, arrival_ns, finish_ns, service, model, tenant, request_id
    FROM request_legs
),
around AS MATERIALIZED (
    -- every span that could be a component or an entry: not an engine's own request, phase or step span (one
    -- scan: each scan of a store of many segments costs about as much)
    SELECT
        name, trace_id, span_id, parent_span_id, kind, start_ns, end_ns, status_code,
        "res.service.name", "res.service.instance.id", "res.host.name", "res.process.pid", "res.cloud.region",
        "res.infertrace.component.kind", "attr.http.route", "attr.peer.service", "attr.server.address",
        "attr.gen_ai.request.id", "attr.gen_ai.request.model", "attr.infertrace.tenant.id",
        "attr.metadata.user_api_key_team_id", "attr.user.id", "attr.infertrace.component.outcome",
        -- HTTP semantic conventions before 1.21 (and Envoy, and Zipkin tags) say http.status_code
        coalesce("attr.http.response.status_code", TRY_CAST(span_attributes['http.status_code'] AS BIGINT))
            AS "attr.http.response.status_code",
        "attr.infertrace.route.target", "attr.error.type",
        "attr.gen_ai.usage.input_tokens", "attr.gen_ai.usage.output_tokens", "attr.infertrace.kv_transfer.bytes",
        "attr.infertrace.kv_transfer.source", "attr.infertrace.kv_transfer.destination",
        "attr.infertrace.kv_transfer.link", "attr.infertrace.component.queue_ns", "attr.http.request.resend_count"
    FROM spans
    WHERE name NOT IN ('llm_request', 'queue', 'prefill', 'decode', 'engine_step')
),
root_candidate AS (
    SELECT * FROM around WHERE kind = 2 OR "attr.http.route" IS NOT NULL
),
entry AS MATERIALIZED (
    -- a root: no parent, or a parent not in the store (an entry's parent would be a client's span, never an engine
    -- phase or step span, so looking among these and the engines' spans is enough)
    SELECT * FROM root_candidate WHERE parent_span_id IS NULL
    UNION ALL
    SELECT r.* FROM root_candidate r
    LEFT JOIN around p ON p.trace_id = r.trace_id AND p.span_id = r.parent_span_id
    LEFT JOIN eng e ON e.trace_id = r.trace_id AND e.span_id = r.parent_span_id
    LEFT JOIN eng own ON own.trace_id = r.trace_id AND own.span_id = r.span_id
    WHERE r.parent_span_id IS NOT NULL AND p.span_id IS NULL AND e.span_id IS NULL AND own.span_id IS NULL
),
alias AS (
    -- a name the entries give a model that their traces show served by exactly one engine model: that model
    SELECT en."attr.gen_ai.request.model" AS name, min(e.model) AS model
    FROM entry en JOIN eng e ON e.trace_id = en.trace_id
    WHERE en."attr.gen_ai.request.model" IS NOT NULL AND e.model IS NOT NULL
    GROUP BY en."attr.gen_ai.request.model"
    HAVING count(DISTINCT e.model) = 1
),
called AS (
    -- per trace whose CLIENT spans name one model (gen_ai.request.model): the model its caller called; a trace
    -- whose calls name several (an agent calling two models) has none
    SELECT trace_id, min("attr.gen_ai.request.model") AS model
    FROM around
    WHERE kind = 3 AND "attr.gen_ai.request.model" IS NOT NULL
    GROUP BY trace_id
    HAVING count(DISTINCT "attr.gen_ai.request.model") = 1
),
request_trace AS (
    -- per request trace: what its engines and its entry say (the engines' model first, then the entry's, then the
    -- one model its CLIENT spans called), and the entry's span and service
    SELECT t.trace_id,
           coalesce(any_value(t.model) FILTER (WHERE NOT t.is_entry), any_value(t.model), any_value(cd.model)) AS model,
           any_value(t.tenant) AS tenant,
           any_value(t.request_id) AS request_id, list(DISTINCT t.service) FILTER (WHERE NOT t.is_entry) AS services,
           any_value(t.span_id) FILTER (WHERE t.is_entry) AS entry_span_id,
           any_value(t.service) FILTER (WHERE t.is_entry) AS entry_service
    FROM (SELECT trace_id, span_id, service, model, tenant, request_id, false AS is_entry FROM eng
          UNION ALL
          SELECT trace_id, span_id, "res.service.name", "attr.gen_ai.request.model",
                 coalesce("attr.infertrace.tenant.id", "attr.metadata.user_api_key_team_id", "attr.user.id"),
                 "attr.gen_ai.request.id", true FROM entry) t
    LEFT JOIN called cd ON cd.trace_id = t.trace_id
    GROUP BY t.trace_id
),
wrapper AS (
    -- the direct parent of an engine's span that lasts past the middle of it: a proxy's call to the engine
    SELECT a.trace_id, a.span_id
    FROM around a JOIN eng e ON e.trace_id = a.trace_id AND e.parent_span_id = a.span_id
    WHERE a.end_ns > e.arrival_ns + (e.finish_ns - e.arrival_ns) // 2
),
call AS (
    SELECT
        a.*,
        CASE WHEN a.span_id = rt.entry_span_id THEN 'entry'
             WHEN a.name IN ('auth', 'rate_limit', 'route', 'global_queue', 'kv_transfer')
                  AND (a."res.infertrace.component.kind" IS NOT NULL OR rt.trace_id IS NULL) THEN 'name'
             WHEN rt.entry_span_id IS NULL OR a."res.service.name" IS DISTINCT FROM rt.entry_service THEN 'service'
             WHEN coalesce(a."attr.http.route", a."attr.peer.service", a."attr.server.address") IS NOT NULL THEN 'http'
             ELSE 'same_service'
        END AS found_by
    FROM around a
    LEFT JOIN request_trace rt ON rt.trace_id = a.trace_id
    LEFT JOIN wrapper w ON w.trace_id = a.trace_id AND w.span_id = a.span_id
    WHERE w.span_id IS NULL
      AND CASE WHEN rt.trace_id IS NULL  -- a trace without an entry or an engine: this project's names only
               THEN a.name IN ('auth', 'rate_limit', 'route', 'global_queue', 'kv_transfer')
               ELSE a.span_id = rt.entry_span_id OR a.name = 'kv_transfer'
                    OR NOT list_contains(coalesce(rt.services, []), a."res.service.name")  -- an engine's own spans
          END
)
SELECT
    CASE WHEN c.found_by = 'entry' THEN 'gateway' ELSE c.name END AS component,
    CASE WHEN c.found_by = 'entry' THEN 'entry' WHEN c.name = 'kv_transfer' THEN 'kv_transfer' ELSE 'call' END AS role,
    coalesce(c."attr.http.route", c.name) AS operation,
    c.found_by,
    c."res.infertrace.component.kind" AS component_kind,
    c."res.service.name" AS service,
    coalesce(c."res.service.instance.id", c."res.host.name" || ':' || CAST(c."res.process.pid" AS VARCHAR),
             c."res.service.name") AS instance,
    c."res.cloud.region" AS region,
    coalesce(c."attr.gen_ai.request.id", rt.request_id) AS request_id,
    coalesce(c."attr.infertrace.tenant.id", c."attr.metadata.user_api_key_team_id", c."attr.user.id",
             rt.tenant) AS tenant,
    coalesce(own.model, c."attr.gen_ai.request.model", via.model, rt.model) AS model,
    c.trace_id,
    c.span_id,
    c.parent_span_id,
    c.start_ns,
    c.end_ns,
    c.end_ns - c.start_ns AS latency_ns,
    coalesce(c."attr.infertrace.component.outcome",
             CASE WHEN c.status_code = 2 OR c."attr.http.response.status_code" >= 500 THEN 'error'
                  WHEN c."attr.http.response.status_code" >= 400 THEN 'rejected' ELSE 'ok' END) AS outcome,
    c."attr.http.response.status_code" AS http_status,
    c."attr.infertrace.route.target" AS route_target,
    c."attr.error.type" AS error_type,
    c.status_code,
    c."attr.gen_ai.usage.input_tokens" AS input_tokens,
    c."attr.gen_ai.usage.output_tokens" AS output_tokens,
    c."attr.infertrace.kv_transfer.bytes" AS kv_bytes,
    c."attr.infertrace.kv_transfer.source" AS kv_source,
    c."attr.infertrace.kv_transfer.destination" AS kv_destination,
    c."attr.infertrace.kv_transfer.link" AS kv_link,
    c."attr.infertrace.component.queue_ns" AS queue_ns,
    c."attr.http.request.resend_count" AS resend_count
FROM call c
LEFT JOIN request_trace rt ON rt.trace_id = c.trace_id
LEFT JOIN alias own ON own.name = c."attr.gen_ai.request.model"
LEFT JOIN alias via ON via.name = rt.model
