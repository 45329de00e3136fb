-- cpu_host_prefills: each colocated request that reached an engine with known hardware, with its TTFT phases,
-- the engine's step budget and its median decode-only step, for estimating what a GPU prefill host in front of
-- the engine would give.
--
-- Answers: on an engine whose hardware is a CPU-only host, when did each request arrive and how long was its
-- prompt (every one would be prefilled on the GPU host, answered or not), how long did the answered ones wait
-- and prefill, how many prompt tokens may one step take (a GPU host with the same settings batches prefills up
-- to it), how long is one of the host's decode steps (the first decode after a KV transfer would take one)?
-- Parameters: none.
-- Columns: instance, model, hardware, request_id, outcome, arrival_ns, input_tokens, cached_tokens, gateway_ns,
--   queue_ns, prefill_ns, ttft_ns, client_ttft_ns, max_num_batched_tokens (the engine's, NULL when its spans do
--   not say), decode_step_ns (the engine's median decode-only step; NULL without step spans).
WITH decode_steps AS (
    SELECT instance, CAST(quantile_cont(duration_ns, 0.5) AS BIGINT) AS decode_step_ns
    FROM steps WHERE prefill_tokens = 0 AND num_decodes > 0
    GROUP BY instance
),
budgets AS (
    SELECT "res.service.instance.id" AS instance,
           max("res.infertrace.engine.max_num_batched_tokens") AS max_num_batched_tokens
    FROM spans
    WHERE "res.infertrace.engine.max_num_batched_tokens" IS NOT NULL
    GROUP BY 1
)
SELECT r.instance, r.model, r.hardware, r.request_id, r.outcome, r.arrival_ns, r.input_tokens, r.cached_tokens,
       r.gateway_ns, r.queue_ns, r.prefill_ns, r.ttft_ns, r.client_ttft_ns, b.max_num_batched_tokens,
       d.decode_step_ns
FROM requests r
LEFT JOIN decode_steps d ON d.instance = r.instance
LEFT JOIN budgets b ON b.instance = r.instance
WHERE r.serving = 'colocated' AND r.hardware IS NOT NULL AND r.input_tokens IS NOT NULL
  AND r.arrival_ns IS NOT NULL
ORDER BY r.instance, r.arrival_ns, r.request_id
