-- prefix_cache_tiers: per request, where its cached prompt tokens came from at its first scheduling — the GPU's
-- prefix cache, the host-memory tier, the remote tier — and how many prompt tokens it recomputed because this
-- engine had cached them before and evicted them from every tier (with the extra capacity, in KV blocks, that
-- would have kept them); with its engine's tier sizes, GPU KV blocks and the time its steps spent copying KV back.
--
-- Answers: what the host tier (or a pooled store) behind the GPU adds to the prefix hit rate, what it costs in
-- copy time, and what more capacity would buy. Only engines with a tier or reuse accounting report the
-- `infertrace.prefill.kv_*` attributes; others have no rows here.
-- Parameters: none.
-- Columns: instance, model, block_size, gpu_blocks (KV blocks on the GPU), host_tier_blocks, remote_tier_blocks
--   (0: none), load_ns (all steps' time copying KV back), request_id, input_tokens, device_tokens, host_tokens,
--   remote_tokens, evicted_tokens, evicted_reuse_blocks.
WITH first_prefill AS (
    SELECT
        "res.service.instance.id" AS instance,
        "attr.gen_ai.request.id" AS request_id,
        arg_min("attr.infertrace.prefill.kv_hit.device_tokens", start_ns) AS device_tokens,
        arg_min("attr.infertrace.prefill.kv_hit.host_tokens", start_ns) AS host_tokens,
        arg_min("attr.infertrace.prefill.kv_hit.remote_tokens", start_ns) AS remote_tokens,
        arg_min("attr.infertrace.prefill.kv_evicted_tokens", start_ns) AS evicted_tokens,
        arg_min("attr.infertrace.prefill.kv_evicted_reuse_blocks", start_ns) AS evicted_reuse_blocks
    FROM spans
    WHERE name = 'prefill' AND "attr.infertrace.prefill.kv_hit.device_tokens" IS NOT NULL
    GROUP BY 1, 2
),
request AS (
    SELECT
        "res.service.instance.id" AS instance,
        "attr.gen_ai.request.id" AS request_id,
        any_value("attr.gen_ai.usage.input_tokens") AS input_tokens
    FROM spans
    WHERE name = 'llm_request'
    GROUP BY 1, 2
),
engine AS (
    SELECT
        "res.service.instance.id" AS instance,
        any_value("res.infertrace.engine.model") AS model,
        any_value("res.infertrace.engine.block_size") AS block_size,
        max("attr.infertrace.step.kv.total_blocks") AS gpu_blocks,
        coalesce(any_value("res.infertrace.engine.kv_host_tier_blocks"), 0) AS host_tier_blocks,
        coalesce(any_value("res.infertrace.engine.kv_remote_tier_blocks"), 0) AS remote_tier_blocks,
        coalesce(sum("attr.infertrace.step.kv_load_ns"), 0) AS load_ns
    FROM spans
    WHERE name = 'engine_step'
    GROUP BY 1
)
SELECT
    e.instance, e.model, e.block_size, e.gpu_blocks, e.host_tier_blocks, e.remote_tier_blocks, e.load_ns,
    p.request_id, r.input_tokens, p.device_tokens, coalesce(p.host_tokens, 0) AS host_tokens,
    coalesce(p.remote_tokens, 0) AS remote_tokens, coalesce(p.evicted_tokens, 0) AS evicted_tokens,
    coalesce(p.evicted_reuse_blocks, 0) AS evicted_reuse_blocks
FROM first_prefill p
JOIN engine e USING (instance)
JOIN request r USING (instance, request_id)
ORDER BY e.instance, p.request_id
