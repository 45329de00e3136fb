-- metrics_request_histograms: per engine and latency metric, how many requests fell into each histogram
-- bucket, and the sum of their values, for the Prometheus histograms `infertrace serve-metrics` exposes.
--
-- Answers: the distribution of TTFT, E2E, queue, prefill and decode times of each engine's requests in
-- vLLM's histogram buckets. Parameters: $ttft, $e2e, $phase (ascending bucket upper bounds in seconds).
-- Columns: model, instance, metric (ttft | e2e | queue | prefill | decode), bucket (0-based index of the first
--   bound ≥ the value; len(bounds) for +Inf), requests, sum_seconds.
WITH timed AS (
    SELECT model, instance, ttft_ns, e2e_ns, queue_ns, prefill_ns, decode_ns
    FROM requests
    WHERE instance IS NOT NULL
),
value AS (
    UNPIVOT timed ON ttft_ns AS 'ttft', e2e_ns AS 'e2e', queue_ns AS 'queue', prefill_ns AS 'prefill',
        decode_ns AS 'decode'
    INTO NAME metric VALUE ns
)
SELECT model, instance, metric,
       len(list_filter(CASE metric WHEN 'ttft' THEN $ttft WHEN 'e2e' THEN $e2e ELSE $phase END,
                       lambda b: b < ns / 1e9)) AS bucket,
       count(*) AS requests,
       sum(ns) / 1e9 AS sum_seconds
FROM value
WHERE ns IS NOT NULL AND ns >= 0
GROUP BY ALL
ORDER BY model, instance, metric, bucket
