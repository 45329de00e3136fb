-- metrics_itl_histogram: per engine, how many tokens' inter-token latencies fell into each histogram bucket,
-- and their sum, for the Prometheus histogram `vllm:inter_token_latency_seconds`.
--
-- Answers: the ITL distribution of each engine in vLLM's buckets. Parameter: $itl (ascending bucket upper
-- bounds in seconds). Columns: instance, bucket (0-based index of the first bound ≥ the ITL;
-- len(bounds) for +Inf), tokens, sum_seconds.
SELECT instance,
       len(list_filter($itl, lambda b: b < itl_ns / 1e9)) AS bucket,
       count(*) AS tokens,
       sum(itl_ns) / 1e9 AS sum_seconds
FROM tokens
WHERE itl_ns IS NOT NULL
GROUP BY ALL
ORDER BY instance, bucket
