-- title: Engine load over time
-- question: Per time bucket on engine X: how many requests were running and waiting (mean and peak at step
--   ends), how full was the KV cache (peak share of blocks in use), how many preemptions, and what share of
--   the time the engine spent in steps?
-- when: To tell whether a latency rise came with a longer queue, a full KV cache or preemptions (overload),
--   or at unchanged load (a slow step, a colliding prefill).
-- param instance text: Engine instance (service.instance.id).
-- param bucket_s float = 10: Time bucket width in seconds.
-- param since time = null: Window start (step end).
-- param until time = null: Window end (exclusive).
-- example: instance=llama-3-8b-0 bucket_s=5
SELECT
    make_timestamp_ns(end_ns // CAST($bucket_s * 1e9 AS BIGINT) * CAST($bucket_s * 1e9 AS BIGINT)) AS bucket_start,
    count(*) AS steps,
    round(avg(running), 2) AS running_mean,
    max(running) AS running_max,
    round(avg(waiting), 2) AS waiting_mean,
    max(waiting) AS waiting_max,
    round(max(kv_used_blocks / nullif(kv_total_blocks, 0)), 4) AS kv_use_max,
    sum(num_preempted) AS preemptions,
    round(sum(duration_ns) / ($bucket_s * 1e9), 4) AS busy_share
FROM steps
WHERE instance = $instance
  AND ($since IS NULL OR end_ns >= $since) AND ($until IS NULL OR end_ns < $until)
GROUP BY ALL
ORDER BY bucket_start
