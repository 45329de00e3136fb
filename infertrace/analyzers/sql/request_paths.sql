-- request_paths: one row per (request trace, serving node it passed through), read from the spans alone.
--
-- Answers: which component instances (auth, rate limiter, router, global queue, KV link) and which engine
-- instances each request touched, and for which model and tenant. This is the fleet's topology as the
-- traces show it: no configuration file needed. A request rejected by the rate limiter touched auth and the
-- limiter only; a disaggregated request touched a prefill worker, a link and a decode worker.
-- Parameters: none.
-- Columns: trace_id, kind (auth, rate_limiter, router, scheduler, link, engine, prefill_worker,
--   decode_worker), instance (service.instance.id; the link's name for links), model, tenant, start_ns,
--   latency_ns, outcome ('ok' | 'rejected' | 'timeout' | 'error'), http_status, queue_ns (the part of latency_ns
--   spent waiting for a free worker of the component; NULL when it does not queue; for engines their own queue).
SELECT trace_id, component_kind AS kind, instance, model, tenant, start_ns, latency_ns, outcome, http_status,
       queue_ns
FROM component_calls
WHERE component IN ('auth', 'rate_limit', 'route', 'global_queue') AND instance IS NOT NULL
UNION ALL
SELECT trace_id, 'link' AS kind, kv_link AS instance, model, tenant, start_ns, latency_ns, outcome, http_status,
       queue_ns
FROM component_calls
WHERE component = 'kv_transfer' AND kv_link IS NOT NULL
UNION ALL
SELECT trace_id,
       coalesce("res.infertrace.component.kind", 'engine') AS kind,
       "res.service.instance.id" AS instance,
       coalesce("attr.gen_ai.response.model", "attr.gen_ai.request.model", "res.infertrace.engine.model") AS model,
       "attr.infertrace.tenant.id" AS tenant,
       start_ns,
       end_ns - start_ns AS latency_ns,
       CASE WHEN status_code = 2 OR "attr.error.type" IS NOT NULL THEN 'error' ELSE 'ok' END AS outcome,
       NULL::BIGINT AS http_status,
       NULL::BIGINT AS queue_ns
FROM spans
WHERE name = 'llm_request' AND "res.service.instance.id" IS NOT NULL
