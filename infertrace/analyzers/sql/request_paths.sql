-- request_paths: one row per (request trace, serving node it passed through), read from the spans alone.
--
-- Answers: which component instances (auth, rate limiter, router, global queue, KV link, or whatever a
-- gateway's spans show) and which engine instances each request touched, and for which model and tenant.
-- This is the fleet's topology as the traces show it: no configuration file needed. A request rejected by the
-- rate limiter touched auth and the limiter only; a disaggregated request touched a prefill worker, a link and
-- a decode worker.
-- Parameters: none.
-- Order: start_ns, then every other column. Root-cause ranking sums floats in row order: its result must not
-- depend on the order in which DuckDB's threads, or the backend, happen to return rows.
-- Columns: trace_id, kind (auth, rate_limiter, router, scheduler, link, engine, prefill_worker,
--   decode_worker; NULL for a component of another source, which `--components` may name), instance
--   (service.instance.id or its fallback; the link's name for links), span_name, operation (its http.route, else
--   its name; an engine's: the source of its spans), service, found_by (see component_calls; 'engine' for
--   engines), model, tenant, start_ns, latency_ns, outcome ('ok' | 'rejected' | 'timeout' | 'error'),
--   http_status, queue_ns (the part of latency_ns spent waiting for a free worker of the component; NULL when
--   it does not queue, and for engines).
SELECT trace_id, component_kind AS kind, instance, component AS span_name, operation, service, found_by, model,
       tenant, start_ns, latency_ns, outcome, http_status, queue_ns
FROM component_calls
WHERE role = 'call' AND instance IS NOT NULL
UNION ALL
SELECT trace_id, 'link' AS kind, kv_link AS instance, 'kv_transfer', 'kv_transfer', service, found_by, model, tenant,
       start_ns, latency_ns, outcome, http_status, queue_ns
FROM component_calls
WHERE role = 'kv_transfer' AND kv_link IS NOT NULL
UNION ALL
SELECT trace_id,
       CASE role WHEN 'prefill' THEN 'prefill_worker' WHEN 'decode' THEN 'decode_worker' ELSE component_kind END AS kind,
       instance, source AS span_name, source AS operation, service, 'engine' AS found_by, model, tenant, arrival_ns AS start_ns, e2e_ns AS latency_ns, outcome,
       NULL::BIGINT AS http_status, NULL::BIGINT AS queue_ns
FROM request_legs
WHERE instance IS NOT NULL
ORDER BY start_ns, trace_id, kind, instance, span_name, operation, service, found_by, model, tenant, latency_ns,
         outcome, http_status, queue_ns
