-- store_coverage: what a store holds that decides which analyses it supports: engine requests per source and
-- how their model and instance were found, step spans, per-token times, cached-token and tenant coverage, and
-- the gateway spans (entry spans, component calls by how they were found).
--
-- Answers: can this store attribute ITL spikes (step spans or per-token times), rank shared components (gateway
-- spans), split TTFT into gateway, queue and prefill, measure the prefix cache? The report and the dashboard say
-- from this what they could not analyse and why.
-- Tokens are counted from `token_runs` (as many as `tokens` has rows, without expanding them).
-- Parameters: none.
-- Columns: what ('source' | 'model_source' | 'instance_source' | 'timing_source' | 'cached_tokens' | 'tenants' |
--   'hardware' | 'step_spans' | 'tokens' | 'entry' | 'entry_without_model' (entries that neither they, an engine
--   nor one model of their trace's CLIENT spans name a model of) | 'entry_model_from_client' (entries whose model
--   is the one their trace's CLIENT spans call: the entry names none and no engine span is in the trace) |
--   'entry_without_engine' (entries with a model, answered without error, whose trace has no engine request: seen
--   at the gateway alone; rejections never reach an engine and are not counted) |
--   'client_calls' (CLIENT spans naming a model in traces with no engine
--   request and no gateway span: an application's calls to an LLM API) | 'calls' | 'environment' | 'alias'), key
--   (the source, the fallback used, the tokens' origin, the entry's service, how calls were found, the spans' deployment
--   environment (resource attribute deployment.environment.name, or the older deployment.environment; NULL where
--   none), 'NAME\tMODEL' for a gateway's name of a model that `component_calls` gives as the engines' MODEL;
--   NULL for plain counts), n (spans for 'environment', entries for 'alias', else requests, calls or tokens).
SELECT 'source' AS what, source AS key, count(*) AS n FROM requests GROUP BY ALL
UNION ALL
SELECT 'model_source', model_source, count(*) FROM requests GROUP BY ALL
UNION ALL
SELECT 'instance_source', instance_source, count(*) FROM requests GROUP BY ALL
UNION ALL
SELECT 'timing_source', timing_source, count(*) FROM requests GROUP BY ALL
UNION ALL
SELECT 'cached_tokens', NULL, count(cached_tokens) FROM requests
UNION ALL
SELECT 'tenants', NULL, count(tenant) FROM requests
UNION ALL
SELECT 'hardware', NULL, count(hardware) FROM requests
UNION ALL
SELECT 'step_spans', NULL, count(*) FROM spans WHERE name = 'engine_step'
UNION ALL
SELECT 'tokens', CASE WHEN role = 'span' THEN 'spans' ELSE 'steps' END, sum(tokens) FROM token_runs GROUP BY ALL
UNION ALL
SELECT 'entry', service, count(*) FROM component_calls WHERE role = 'entry' GROUP BY ALL
UNION ALL
SELECT 'entry_without_model', NULL, count(*) FROM component_calls WHERE role = 'entry' AND model IS NULL
UNION ALL
SELECT 'entry_model_from_client', NULL, count(*)
FROM component_calls c JOIN spans s ON s.trace_id = c.trace_id AND s.span_id = c.span_id
WHERE c.role = 'entry' AND c.model IS NOT NULL AND s."attr.gen_ai.request.model" IS NULL
  AND c.trace_id NOT IN (SELECT trace_id FROM request_legs)
UNION ALL
SELECT 'entry_without_engine', NULL, count(*) FROM component_calls
WHERE role = 'entry' AND model IS NOT NULL AND outcome = 'ok' AND trace_id NOT IN (SELECT trace_id FROM requests)
UNION ALL
SELECT 'client_calls', NULL, count(*) FROM spans
WHERE kind = 3 AND "attr.gen_ai.request.model" IS NOT NULL
  AND trace_id NOT IN (SELECT trace_id FROM requests UNION SELECT trace_id FROM component_calls)
UNION ALL
SELECT 'calls', found_by, count(*) FROM component_calls WHERE role = 'call' GROUP BY ALL
UNION ALL
SELECT 'environment', coalesce(resource_attributes['deployment.environment.name'],
                               resource_attributes['deployment.environment']), count(*)
FROM spans GROUP BY ALL
UNION ALL
SELECT 'alias', s."attr.gen_ai.request.model" || chr(9) || c.model, count(*)
FROM component_calls c JOIN spans s ON s.trace_id = c.trace_id AND s.span_id = c.span_id
WHERE c.role = 'entry' AND s."attr.gen_ai.request.model" <> c.model
GROUP BY ALL
