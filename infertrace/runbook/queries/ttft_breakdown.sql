-- title: TTFT breakdown for a model
-- question: Of a model's time to first token (from the gateway), how much is gateway components, engine
--   queue, prefill and KV transfer, at the median and the tail?
-- when: TTFT is high or jittery for one model and you need to know which phase to look at.
-- param model text: The model.
-- param since time = null: Window start (arrival at the engine).
-- param until time = null: Window end (exclusive).
-- example: model=llama-3-8b
WITH r AS (
    SELECT r.*, g.start_ns AS gateway_start_ns
    FROM requests r
    LEFT JOIN component_calls g ON g.trace_id = r.trace_id AND g.component = 'gateway'
    WHERE r.model = $model
      AND ($since IS NULL OR r.arrival_ns >= $since)
      AND ($until IS NULL OR r.arrival_ns < $until)
),
phase AS (
    SELECT 'gateway' AS phase, 1 AS ord, arrival_ns - gateway_start_ns AS ns FROM r WHERE gateway_start_ns IS NOT NULL
    UNION ALL SELECT 'engine_queue', 2, queue_ns FROM r
    UNION ALL SELECT 'prefill', 3, prefill_ns FROM r
    UNION ALL SELECT 'kv_transfer', 4, kv_transfer_ns FROM r WHERE kv_transfer_ns IS NOT NULL
    UNION ALL SELECT 'ttft_engine', 5, ttft_ns FROM r
    UNION ALL SELECT 'ttft_client', 6, first_token_ns - gateway_start_ns FROM r WHERE gateway_start_ns IS NOT NULL
)
SELECT
    phase,
    count(*) AS requests,
    round(avg(ns) / 1e6, 3) AS mean_ms,
    round(quantile_cont(ns, 0.5) / 1e6, 3) AS p50_ms,
    round(quantile_cont(ns, 0.95) / 1e6, 3) AS p95_ms,
    round(quantile_cont(ns, 0.99) / 1e6, 3) AS p99_ms,
    round(max(ns) / 1e6, 3) AS max_ms
FROM phase
GROUP BY phase, ord
ORDER BY ord
