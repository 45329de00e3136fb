-- title: Slowest requests in a window
-- question: Which requests had the worst TTFT (or end-to-end latency), with their model, tenant, engine,
--   prompt size and cache hit?
-- when: To get concrete request ids to drill into (request_timeline, prefills_colliding_with_request).
-- param since time = null: Window start (arrival at the engine).
-- param until time = null: Window end (exclusive).
-- param model text = null: Only this model.
-- param tenant text = null: Only this tenant.
-- param order_by text = ttft: ttft or e2e.
-- param top int = 20: How many requests.
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
    outcome
FROM requests
WHERE ($since IS NULL OR arrival_ns >= $since) AND ($until IS NULL OR arrival_ns < $until)
  AND ($model IS NULL OR model = $model) AND ($tenant IS NULL OR tenant = $tenant)
ORDER BY CASE WHEN $order_by = 'e2e' THEN e2e_ns ELSE ttft_ns END DESC NULLS LAST, request_id
LIMIT $top
