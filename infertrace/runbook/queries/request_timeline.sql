-- title: One request's path through the fleet
-- question: Where did request X spend its time: each gateway component it passed (with outcome), the engine
--   queue, prefill, KV transfer and decode, in order?
-- when: Explaining one slow or failed request end to end.
-- param request_id text: The request id (gen_ai.request.id).
-- example: request_id=tenant-a-000010
WITH trace AS (
    SELECT DISTINCT trace_id FROM component_calls WHERE request_id = $request_id
    UNION SELECT trace_id FROM requests WHERE request_id = $request_id
)
SELECT
    make_timestamp_ns(s.start_ns) AS start,
    round((s.start_ns - min(s.start_ns) OVER ()) / 1e6, 3) AS start_ms,
    round((s.end_ns - s.start_ns) / 1e6, 3) AS duration_ms,
    s.name AS span,
    s."res.service.instance.id" AS instance,
    coalesce(s."attr.http.response.status_code", TRY_CAST(s.span_attributes['http.status_code'] AS BIGINT))
        AS http_status,
    s."attr.error.type" AS error_type,
    s."attr.infertrace.route.target" AS route_target
FROM spans s
JOIN trace USING (trace_id)
ORDER BY s.start_ns, s.end_ns DESC
