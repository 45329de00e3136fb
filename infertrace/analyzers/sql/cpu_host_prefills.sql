-- cpu_host_prefills: each successful colocated request with the engine's hardware, its TTFT phases, and the
-- engine's median decode-only step, for estimating what a GPU prefill host in front of the engine would give.
--
-- Answers: on an engine whose hardware is a CPU-only host, how long did each request wait and prefill, how long
-- is one of the host's decode steps (the first decode after a KV transfer would take one)?
-- Parameters: none.
-- Columns: instance, model, hardware, request_id, arrival_ns, input_tokens, cached_tokens, gateway_ns, queue_ns,
--   prefill_ns, client_ttft_ns, decode_step_ns (the engine's median decode-only step; NULL without step spans).
WITH decode_steps AS (
    SELECT instance, CAST(quantile_cont(duration_ns, 0.5) AS BIGINT) AS decode_step_ns
    FROM steps WHERE prefill_tokens = 0 AND num_decodes > 0
    GROUP BY instance
)
SELECT r.instance, r.model, r.hardware, r.request_id, r.arrival_ns, r.input_tokens, r.cached_tokens,
       r.gateway_ns, r.queue_ns, r.prefill_ns, r.client_ttft_ns, d.decode_step_ns
FROM requests r
LEFT JOIN decode_steps d ON d.instance = r.instance
WHERE r.serving = 'colocated' AND r.outcome = 'ok' AND r.ttft_ns IS NOT NULL AND r.hardware IS NOT NULL
  AND r.input_tokens IS NOT NULL
ORDER BY r.instance, r.arrival_ns, r.request_id
