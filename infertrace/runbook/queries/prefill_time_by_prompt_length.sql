-- title: Prefill time by prompt length
-- question: How does a model's prefill time grow with the uncached prompt length (power-of-two buckets)?
--   Linear growth is weight-bound; faster-than-linear growth is the quadratic attention term.
-- when: TTFT is dominated by prefill and you want to know whether long prompts explain it.
-- param model text: The model.
-- example: model=llama-3-8b
SELECT
    CAST(pow(2, floor(log2(greatest(input_tokens - coalesce(cached_tokens, 0), 1)))) AS BIGINT) AS uncached_tokens_from,
    count(*) AS requests,
    round(avg(input_tokens - coalesce(cached_tokens, 0)), 1) AS mean_uncached_tokens,
    round(quantile_cont(prefill_ns, 0.5) / 1e6, 3) AS prefill_p50_ms,
    round(quantile_cont(prefill_ns, 0.95) / 1e6, 3) AS prefill_p95_ms,
    round(quantile_cont(ttft_ns, 0.5) / 1e6, 3) AS ttft_p50_ms
FROM requests
WHERE model = $model AND prefill_chunks = 1
GROUP BY ALL
ORDER BY uncached_tokens_from
