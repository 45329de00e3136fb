-- title: Prefix-cache hit rate by tenant
-- question: What share of each tenant's prompt tokens came from the prefix (KV) cache, per model?
-- when: Prefill load or TTFT rose for a tenant; a tenant changed how it builds prompts; billing questions
--   about cached input tokens.
-- param since time = null: Window start (arrival at the engine).
-- param until time = null: Window end (exclusive).
SELECT
    tenant,
    model,
    count(*) AS requests,
    sum(input_tokens) AS input_tokens,
    sum(coalesce(cached_tokens, 0)) AS cached_tokens,
    round(sum(coalesce(cached_tokens, 0)) / nullif(sum(input_tokens), 0), 4) AS hit_rate,
    round(count(*) FILTER (WHERE system_prompt_id IS NOT NULL) / count(*), 4) AS share_with_system_prompt,
    round(quantile_cont(ttft_ns, 0.5) / 1e6, 3) AS ttft_p50_ms
FROM requests
WHERE ($since IS NULL OR arrival_ns >= $since) AND ($until IS NULL OR arrival_ns < $until)
GROUP BY ALL
ORDER BY tenant, model
