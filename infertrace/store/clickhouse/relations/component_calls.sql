-- component_calls (ClickHouse form of infertrace/store/relations/component_calls.sql): the entry span of each
-- request trace, the calls found in the trace tree, and each KV transfer. Same columns, same rules; read that file
-- for what each column means. Kept beside it: a change there is made here too, and tests/test_store_clickhouse.py
-- holds the two to the same rows on every sample.
-- {spans}: the window's spans, typed (pushdown.spans_sql); {request_legs}: its ClickHouse form.
WITH
eng AS (
    SELECT trace_id, span_id, parent_span_id, arrival_ns, finish_ns, service, model, tenant, request_id
    FROM ({request_legs})
),
around AS (
    SELECT
        name, trace_id, span_id, parent_span_id, kind, start_ns, end_ns, status_code,
        "res.service.name", "res.service.instance.id", "res.host.name", "res.process.pid", "res.cloud.region",
        "res.infertrace.component.kind", "attr.http.route", "attr.peer.service", "attr.server.address",
        "attr.gen_ai.request.id", "attr.gen_ai.request.model", "attr.infertrace.tenant.id",
        "attr.metadata.user_api_key_team_id", "attr.user.id", "attr.infertrace.component.outcome",
        -- HTTP semantic conventions before 1.21 (and Envoy, and Zipkin tags) say http.status_code
        coalesce("attr.http.response.status_code", toInt64OrNull(span_attributes['http.status_code']))
            AS "attr.http.response.status_code",
        "attr.infertrace.route.target", "attr.error.type",
        "attr.gen_ai.usage.input_tokens", "attr.gen_ai.usage.output_tokens", "attr.infertrace.kv_transfer.bytes",
        "attr.infertrace.kv_transfer.source", "attr.infertrace.kv_transfer.destination",
        "attr.infertrace.kv_transfer.link", "attr.infertrace.component.queue_ns", "attr.http.request.resend_count"
    FROM ({spans})
    WHERE name NOT IN ('llm_request', 'queue', 'prefill', 'decode', 'engine_step')
),
root_candidate AS (
    SELECT * FROM around WHERE kind = 2 OR "attr.http.route" IS NOT NULL
),
entry AS (
    SELECT * FROM root_candidate WHERE parent_span_id IS NULL
    UNION ALL
    SELECT * FROM root_candidate r
    WHERE r.parent_span_id IS NOT NULL
      AND (r.trace_id, r.parent_span_id) NOT IN (SELECT trace_id, span_id FROM around)
      AND (r.trace_id, r.parent_span_id) NOT IN (SELECT trace_id, span_id FROM eng)
      AND (r.trace_id, r.span_id) NOT IN (SELECT trace_id, span_id FROM eng)
),
alias AS (
    SELECT en."attr.gen_ai.request.model" AS name, min(e.model) AS model
    FROM entry en JOIN eng e ON e.trace_id = en.trace_id
    WHERE en."attr.gen_ai.request.model" IS NOT NULL AND e.model IS NOT NULL
    GROUP BY en."attr.gen_ai.request.model"
    HAVING count(DISTINCT e.model) = 1
),
called AS (
    SELECT trace_id, min("attr.gen_ai.request.model") AS model
    FROM around
    WHERE kind = 3 AND "attr.gen_ai.request.model" IS NOT NULL
    GROUP BY trace_id
    HAVING count(DISTINCT "attr.gen_ai.request.model") = 1
),
request_trace AS (
    SELECT t.trace_id AS trace_id,
           coalesce(anyIf(t.model, NOT t.is_entry), any(t.model), any(toNullable(cd.model))) AS model,
           any(t.tenant) AS tenant,
           any(t.request_id) AS request_id, groupUniqArrayIf(t.service, NOT t.is_entry) AS services,
           anyIf(t.span_id, t.is_entry) AS entry_span_id,
           anyIf(t.service, t.is_entry) AS entry_service
    FROM (SELECT trace_id, toNullable(span_id) AS span_id, service, model, tenant, request_id, false AS is_entry
          FROM eng
          UNION ALL
          SELECT trace_id, toNullable(span_id), "res.service.name", "attr.gen_ai.request.model",
                 coalesce("attr.infertrace.tenant.id", "attr.metadata.user_api_key_team_id", "attr.user.id"),
                 "attr.gen_ai.request.id", true FROM entry) t
    LEFT JOIN called cd ON cd.trace_id = t.trace_id
    GROUP BY t.trace_id
),
wrapper AS (
    SELECT DISTINCT a.trace_id AS trace_id, a.span_id AS span_id
    FROM around a JOIN eng e ON e.trace_id = a.trace_id AND e.parent_span_id = a.span_id
    WHERE a.end_ns > e.arrival_ns + intDiv(e.finish_ns - e.arrival_ns, 2)
),
call AS (
    SELECT
        a.*,
        rt.trace_id IS NOT NULL AS in_request_trace,
        rt.entry_span_id AS entry_span_id, rt.entry_service AS entry_service, rt.services AS services,
        rt.request_id AS trace_request_id, rt.tenant AS trace_tenant, rt.model AS trace_model,
        multiIf(a.span_id = rt.entry_span_id, 'entry',
                a.name IN ('auth', 'rate_limit', 'route', 'global_queue', 'kv_transfer')
                    AND (a."res.infertrace.component.kind" IS NOT NULL OR rt.trace_id IS NULL), 'name',
                rt.entry_span_id IS NULL OR NOT (a."res.service.name" <=> rt.entry_service), 'service',
                coalesce(a."attr.http.route", a."attr.peer.service", a."attr.server.address") IS NOT NULL, 'http',
                'same_service') AS found_by
    FROM around a
    LEFT JOIN request_trace rt ON rt.trace_id = a.trace_id
    WHERE (a.trace_id, a.span_id) NOT IN (SELECT trace_id, span_id FROM wrapper)
      AND if(rt.trace_id IS NULL,
             a.name IN ('auth', 'rate_limit', 'route', 'global_queue', 'kv_transfer'),
             coalesce(a.span_id = rt.entry_span_id, false) OR a.name = 'kv_transfer'
                 OR NOT has(rt.services, a."res.service.name"))
)
SELECT
    if(c.found_by = 'entry', 'gateway', c.name) AS component,
    multiIf(c.found_by = 'entry', 'entry', c.name = 'kv_transfer', 'kv_transfer', 'call') AS role,
    coalesce(c."attr.http.route", c.name) AS operation,
    c.found_by AS found_by,
    c."res.infertrace.component.kind" AS component_kind,
    c."res.service.name" AS service,
    coalesce(c."res.service.instance.id", concat(c."res.host.name", ':', toString(c."res.process.pid")),
             c."res.service.name") AS instance,
    c."res.cloud.region" AS region,
    coalesce(c."attr.gen_ai.request.id", c.trace_request_id) AS request_id,
    coalesce(c."attr.infertrace.tenant.id", c."attr.metadata.user_api_key_team_id", c."attr.user.id",
             c.trace_tenant) AS tenant,
    coalesce(own.model, c."attr.gen_ai.request.model", via.model, c.trace_model) AS model,
    c.trace_id AS trace_id,
    c.span_id AS span_id,
    c.parent_span_id AS parent_span_id,
    c.start_ns AS start_ns,
    c.end_ns AS end_ns,
    c.end_ns - c.start_ns AS latency_ns,
    coalesce(c."attr.infertrace.component.outcome",
             multiIf(c.status_code = 2 OR c."attr.http.response.status_code" >= 500, 'error',
                     c."attr.http.response.status_code" >= 400, 'rejected', 'ok')) AS outcome,
    c."attr.http.response.status_code" AS http_status,
    c."attr.infertrace.route.target" AS route_target,
    c."attr.error.type" AS error_type,
    c.status_code AS status_code,
    c."attr.gen_ai.usage.input_tokens" AS input_tokens,
    c."attr.gen_ai.usage.output_tokens" AS output_tokens,
    c."attr.infertrace.kv_transfer.bytes" AS kv_bytes,
    c."attr.infertrace.kv_transfer.source" AS kv_source,
    c."attr.infertrace.kv_transfer.destination" AS kv_destination,
    c."attr.infertrace.kv_transfer.link" AS kv_link,
    c."attr.infertrace.component.queue_ns" AS queue_ns,
    c."attr.http.request.resend_count" AS resend_count
FROM call c
LEFT JOIN alias own ON own.name = c."attr.gen_ai.request.model"
LEFT JOIN alias via ON via.name = c.trace_model
