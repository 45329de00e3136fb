-- title: Failures by component and time bucket
-- question: Which component instances rejected or failed calls (HTTP 4xx/5xx, errors, timeouts), how many
--   per time bucket, and for which models?
-- when: Gateway error rate rose; find which component and when.
-- param bucket_s float = 10: Bucket width in seconds.
-- param since time = null: Window start.
-- param until time = null: Window end (exclusive).
SELECT
    make_timestamp_ns(CAST(floor(start_ns / ($bucket_s * 1e9)) * ($bucket_s * 1e9) AS BIGINT)) AS bucket,
    component_kind,
    instance,
    outcome,
    http_status,
    count(*) AS calls,
    list(DISTINCT model ORDER BY model) AS models
FROM component_calls
WHERE outcome <> 'ok' AND component <> 'gateway'
  AND ($since IS NULL OR start_ns >= $since) AND ($until IS NULL OR start_ns < $until)
GROUP BY ALL
ORDER BY bucket, calls DESC
