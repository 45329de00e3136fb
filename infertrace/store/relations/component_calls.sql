-- component_calls: one row per call to a shared serving component (gateway, auth, rate limiter, router,
-- global queue) and per KV transfer, with its outcome and latency.
--
-- Answers: which component handled a request, how long it took, what it decided (ok, rejected, timeout,
-- error; HTTP-style status), where the router sent it. Use it when several models degrade at once: a
-- shared component whose latency or rejections rose across exactly those models is the likely cause.
-- Columns: component (span name), component_kind, service, instance, region, request_id, tenant, model
--   (the span's own gen_ai.request.model, else its trace's gateway span's), trace_id, span_id,
--   parent_span_id, start_ns, end_ns, latency_ns, outcome (the span's infertrace.component.outcome; without
--   it: 'error' for an error status or HTTP 5xx, 'rejected' for 4xx, else 'ok'), http_status, route_target, error_type,
--   status_code, kv_bytes, kv_source, kv_destination, kv_link, queue_ns (time the call waited for a free worker
--   of the component, inside the span: `infertrace.component.queue_ns`; NULL when the component does not queue).
WITH call AS (
    SELECT * FROM spans
    WHERE name IN ('gateway', 'auth', 'rate_limit', 'route', 'global_queue', 'kv_transfer')
),
gateway AS (
    SELECT trace_id, any_value("attr.gen_ai.request.model") AS model
    FROM spans WHERE name = 'gateway' GROUP BY trace_id
)
SELECT
    c.name AS component,
    c."res.infertrace.component.kind" AS component_kind,
    c."res.service.name" AS service,
    c."res.service.instance.id" AS instance,
    c."res.cloud.region" AS region,
    c."attr.gen_ai.request.id" AS request_id,
    c."attr.infertrace.tenant.id" AS tenant,
    coalesce(c."attr.gen_ai.request.model", g.model) AS model,
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
    c."attr.infertrace.kv_transfer.link" AS kv_link,
    c."attr.infertrace.component.queue_ns" AS queue_ns
FROM call c
LEFT JOIN gateway g ON g.trace_id = c.trace_id
