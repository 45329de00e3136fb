-- title: TTFT breakdown for a model
-- question: Of a model's time to first token (from the gateway to the first token the client receives), how
--   much is gateway components, the prefill queue, prefill, and, when prefill and decode are disaggregated,
--   KV transfer, the decode queue and the first decode, at the median and the tail? Each request counts once.
-- when: TTFT is high or jittery for one model and you need to know which phase to look at.
-- param model text: The model.
-- param since time = null: Window start (arrival at the first engine).
-- param until time = null: Window end (exclusive).
-- example: model=llama-3-8b
WITH r AS (
    SELECT *
    FROM requests
    WHERE model = $model
      AND ($since IS NULL OR arrival_ns >= $since)
      AND ($until IS NULL OR arrival_ns < $until)
),
phase AS (
    SELECT 'gateway' AS phase, 1 AS ord, gateway_ns AS ns FROM r WHERE gateway_ns IS NOT NULL
    UNION ALL SELECT 'prefill_queue', 2, queue_ns FROM r
    UNION ALL SELECT 'prefill', 3, prefill_ns FROM r
    UNION ALL SELECT 'kv_transfer', 4, kv_transfer_ns FROM r WHERE kv_transfer_ns IS NOT NULL
    UNION ALL SELECT 'decode_queue', 5, decode_queue_ns FROM r WHERE decode_queue_ns IS NOT NULL
    UNION ALL SELECT 'first_decode', 6, first_decode_ns FROM r WHERE first_decode_ns IS NOT NULL
    UNION ALL SELECT 'ttft_engine', 7, ttft_ns FROM r
    UNION ALL SELECT 'ttft_client', 8, client_ttft_ns FROM r WHERE gateway_start_ns IS NOT NULL
    UNION ALL SELECT 'unmatched legs: ' || leg_problem, 9, NULL FROM r WHERE leg_problem IS NOT NULL
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
ORDER BY ord, phase
