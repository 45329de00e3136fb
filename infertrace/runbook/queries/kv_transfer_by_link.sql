-- title: KV transfer times by link
-- question: For disaggregated prefill/decode, how long did moving each prompt's KV cache take on each
--   link, how many bytes, and what bandwidth was achieved?
-- when: TTFT rose for a disaggregated model; the link between prefill and decode workers is suspect.
-- param since time = null: Window start.
-- param until time = null: Window end (exclusive).
-- needs component_calls WHERE component = 'kv_transfer': KV transfers between a prefill and a decode engine
--   (`kv_transfer` spans: prefill/decode disaggregation)
SELECT
    kv_link AS link,
    kv_source AS source,
    kv_destination AS destination,
    count(*) AS transfers,
    round(sum(kv_bytes) / 1e9, 3) AS gigabytes,
    round(quantile_cont(latency_ns, 0.5) / 1e6, 3) AS p50_ms,
    round(quantile_cont(latency_ns, 0.99) / 1e6, 3) AS p99_ms,
    round(max(latency_ns) / 1e6, 3) AS max_ms,
    round(sum(kv_bytes) / nullif(sum(latency_ns), 0), 3) AS achieved_gb_per_s
FROM component_calls
WHERE component = 'kv_transfer'
  AND ($since IS NULL OR start_ns >= $since) AND ($until IS NULL OR start_ns < $until)
GROUP BY ALL
ORDER BY p99_ms DESC
