-- title: KV transfer time by link and size
-- question: For disaggregated prefill/decode, how does the time to move a prompt's KV cache grow with its size
--   on each link: per link and size band (powers of two in MB), how many transfers, their p50/p99 time and
--   the bandwidth achieved?
-- when: TTFT rose for a disaggregated model: tell a slow or congested link (every band slower, achieved GB/s
--   down) from longer prompts (more transfers in the large bands at the usual bandwidth).
-- param since time = null: Window start (transfer start).
-- param until time = null: Window end (exclusive).
-- needs component_calls WHERE component = 'kv_transfer' AND kv_bytes IS NOT NULL: KV transfers with their size
--   (`kv_transfer` spans with infertrace.kv_transfer.bytes: prefill/decode disaggregation)
WITH t AS (
    SELECT kv_link AS link, kv_bytes, latency_ns,
           CAST(power(2, floor(log2(greatest(kv_bytes / 1e6, 1)))) AS BIGINT) AS band_mb
    FROM component_calls
    WHERE component = 'kv_transfer' AND kv_bytes IS NOT NULL
      AND ($since IS NULL OR start_ns >= $since) AND ($until IS NULL OR start_ns < $until)
)
SELECT
    link,
    band_mb AS size_from_mb,
    2 * band_mb AS size_to_mb,
    count(*) AS transfers,
    round(quantile_cont(latency_ns, 0.5) / 1e6, 3) AS p50_ms,
    round(quantile_cont(latency_ns, 0.99) / 1e6, 3) AS p99_ms,
    round(sum(kv_bytes) / nullif(sum(latency_ns), 0), 3) AS achieved_gb_per_s
FROM t
GROUP BY ALL
ORDER BY link, size_from_mb
