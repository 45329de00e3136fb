-- title: Slowest requests in a window
-- question: Which requests had the worst TTFT (or end-to-end latency), with their model, tenant, engine,
--   prompt size and cache hit? Requests that reached an engine are seen_at 'engine' (arrival at the engine,
--   TTFT and E2E as in `requests`); a request its gateway answered whose trace reaches no engine span (an
--   engine that does not trace, as vLLM by default, or a hosted API) is seen_at 'gateway': arrival and E2E from
--   its entry span, no TTFT, queue or cached tokens.
-- when: To get concrete request ids to drill into (request_timeline, prefills_colliding_with_request).
-- either: requests, component_calls
-- param since time = null: Window start (arrival).
-- param until time = null: Window end (exclusive).
-- param model text = null: Only this model.
-- param tenant text = null: Only this tenant.
-- param order_by text = ttft: ttft or e2e.
-- param top int = 20: How many requests.
WITH r AS (
    SELECT request_id, model, tenant, instance, arrival_ns, ttft_ns, e2e_ns, queue_ns, input_tokens, cached_tokens,
           output_tokens, finish_reason, outcome, 'engine' AS seen_at
    FROM requests
    UNION ALL
    SELECT c.request_id, c.model, c.tenant, c.instance, c.start_ns, NULL, c.latency_ns, NULL, c.input_tokens, NULL,
           c.output_tokens, NULL, c.outcome, 'gateway'
    FROM component_calls c ANTI JOIN requests q ON q.trace_id = c.trace_id
    WHERE c.role = 'entry'
)
SELECT
    request_id,
    model,
    tenant,
    instance,
    make_timestamp_ns(arrival_ns) AS arrival,
    round(ttft_ns / 1e6, 3) AS ttft_ms,
    round(e2e_ns / 1e6, 3) AS e2e_ms,
    round(queue_ns / 1e6, 3) AS queue_ms,
    input_tokens,
    cached_tokens,
    output_tokens,
    finish_reason,
    outcome,
    seen_at
FROM r
WHERE ($since IS NULL OR arrival_ns >= $since) AND ($until IS NULL OR arrival_ns < $until)
  AND ($model IS NULL OR model = $model) AND ($tenant IS NULL OR tenant = $tenant)
ORDER BY CASE WHEN $order_by = 'e2e' THEN e2e_ns ELSE ttft_ns END DESC NULLS LAST,
         CASE WHEN seen_at = 'gateway' THEN e2e_ns END DESC NULLS LAST, request_id, seen_at
LIMIT $top
