-- component_calls: one row per call to a serving component around the engines: the entry span the client
-- called (a gateway or proxy), every call the request made on its way to or beside the engine (auth, rate
-- limiter, router, queue, whatever a gateway's spans show), and each KV transfer.
--
-- Answers: which component handled a request, how long it took, what it decided (ok, rejected, timeout,
-- error; HTTP-style status), where the router sent it. Use it when several models degrade at once: a
-- shared component whose latency or rejections rose across exactly those models is the likely cause.
-- Components are found in the trace tree, not by name: in a trace with an engine request (`requests`) or an
-- entry, a call is any span that is not the entry, not an engine's request span nor one of that engine's own
-- spans (same service), not a wrapper around the engine's span (its direct parent, ending past the middle
-- of it: a proxy's call to the engine), and that runs on another service than the entry or carries
-- http.route, peer.service or server.address. Spans of the entry's own service without those are listed too
-- (found_by 'same_service': a proxy's in-process hooks) for `--components` to name; this project's own
-- gateway spans (`auth`, `rate_limit`, `route`, `global_queue`) and `kv_transfer` are found by name.
-- The entry is the root span of a request trace (no parent, or a parent not in the store) that is a SERVER
-- span or carries http.route and is not an engine's own span: `component` is 'gateway' for it.
-- Columns: component ('gateway' for the entry, else the span name), role ('entry' | 'call' | 'kv_transfer'),
--   operation (http.route, else the span name), found_by ('name' | 'service' | 'http' | 'same_service' |
--   'entry'), component_kind (infertrace.component.kind; NULL for spans of other sources), service, instance
--   (service.instance.id, else host.name:process.pid, else service.name), region, request_id, tenant, model
--   (the span's own gen_ai.request.model, else its trace's entry's or engine's), trace_id, span_id,
--   parent_span_id, start_ns, end_ns, latency_ns, outcome (the span's infertrace.component.outcome; without
--   it: 'error' for an error status or HTTP 5xx, 'rejected' for 4xx, else 'ok'), http_status, route_target,
--   error_type, status_code, kv_bytes, kv_source, kv_destination, kv_link.
WITH
eng AS (
    SELECT trace_id, span_id, service, model, tenant, request_id FROM requests
),
eng_span AS (
    SELECT s.trace_id, s.span_id, s.parent_span_id, s.start_ns, s.end_ns
    FROM spans s SEMI JOIN eng e ON e.trace_id = s.trace_id AND e.span_id = s.span_id
),
around AS (
    -- every span that could be a component or an entry: not an engine's own request, phase or step span
    SELECT * FROM spans
    WHERE name NOT IN ('llm_request', 'queue', 'prefill', 'decode', 'engine_step')
),
entry AS (
    SELECT a.* FROM around a
    WHERE (a.parent_span_id IS NULL
           OR NOT EXISTS (SELECT 1 FROM spans p WHERE p.trace_id = a.trace_id AND p.span_id = a.parent_span_id))
      AND (a.kind = 2 OR a."attr.http.route" IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM eng e WHERE e.trace_id = a.trace_id AND e.span_id = a.span_id)
),
request_trace AS (
    SELECT trace_id, any_value(model) AS model, any_value(tenant) AS tenant, any_value(request_id) AS request_id,
           list(DISTINCT service) AS services
    FROM (SELECT trace_id, model, tenant, request_id, service FROM eng
          UNION ALL
          SELECT trace_id, "attr.gen_ai.request.model", coalesce("attr.infertrace.tenant.id",
                 "attr.metadata.user_api_key_team_id", "attr.user.id"), "attr.gen_ai.request.id", NULL FROM entry)
    GROUP BY trace_id
),
wrapper AS (
    -- the direct parent of an engine's span that lasts past the middle of it: a proxy's call to the engine
    SELECT a.trace_id, a.span_id
    FROM around a JOIN eng_span e ON e.trace_id = a.trace_id AND e.parent_span_id = a.span_id
    WHERE a.end_ns > e.start_ns + (e.end_ns - e.start_ns) / 2
),
call AS (
    SELECT
        a.*,
        CASE WHEN en.span_id IS NOT NULL THEN 'entry'
             WHEN a.name IN ('auth', 'rate_limit', 'route', 'global_queue', 'kv_transfer')
                  AND a."res.infertrace.component.kind" IS NOT NULL THEN 'name'
             WHEN a."res.service.name" IS DISTINCT FROM en_trace."res.service.name"
                  AND en_trace.span_id IS NOT NULL THEN 'service'
             WHEN coalesce(a."attr.http.route", a."attr.peer.service", a."attr.server.address") IS NOT NULL THEN 'http'
             WHEN en_trace.span_id IS NOT NULL THEN 'same_service'
             ELSE 'service'
        END AS found_by
    FROM around a
    JOIN request_trace rt ON rt.trace_id = a.trace_id
    LEFT JOIN entry en ON en.trace_id = a.trace_id AND en.span_id = a.span_id
    LEFT JOIN entry en_trace ON en_trace.trace_id = a.trace_id
    WHERE NOT EXISTS (SELECT 1 FROM eng e WHERE e.trace_id = a.trace_id AND e.span_id = a.span_id)
      AND NOT EXISTS (SELECT 1 FROM wrapper w WHERE w.trace_id = a.trace_id AND w.span_id = a.span_id)
      AND (en.span_id IS NOT NULL OR a.name = 'kv_transfer'
           OR NOT list_contains(rt.services, a."res.service.name"))
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
    coalesce(c."attr.gen_ai.request.model", rt.model) AS model,
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
    c."attr.infertrace.kv_transfer.bytes" AS kv_bytes,
    c."attr.infertrace.kv_transfer.source" AS kv_source,
    c."attr.infertrace.kv_transfer.destination" AS kv_destination,
    c."attr.infertrace.kv_transfer.link" AS kv_link
FROM call c
JOIN request_trace rt ON rt.trace_id = c.trace_id
