-- itl_stall_chunks: the prefill chunks computed in given steps, with the requests they belong to.
--
-- Answers: who prefilled in a stalled step (the culprits), how much (chunk tokens over tokens already in
-- the KV cache), whether the chunk recomputed a request that had been preempted, and the request's tenant,
-- prompt and prefix-cache hit.
-- Parameters: $instances, $step_indexes: parallel lists naming the steps.
-- Columns: instance, step_index, request_id, chunk_tokens, computed_tokens, recompute, tenant,
--   input_tokens, cached_tokens.
WITH wanted AS (
    SELECT unnest($instances::VARCHAR[]) AS instance, unnest($step_indexes::BIGINT[]) AS step_index
),
preempted AS (
    SELECT request_id, instance, min(first_step_index) AS first_preempted_step
    FROM step_membership WHERE role = 'preempted' GROUP BY ALL
)
SELECT m.instance, m.first_step_index AS step_index, m.request_id, m.chunk_tokens, m.computed_tokens,
       coalesce(p.first_preempted_step < m.first_step_index, false) AS recompute,
       r.tenant, r.input_tokens, r.cached_tokens
FROM step_membership m
JOIN wanted w ON w.instance = m.instance AND w.step_index = m.first_step_index
LEFT JOIN preempted p ON p.request_id = m.request_id AND p.instance = m.instance
LEFT JOIN itl_request_tokens r ON r.request_id = m.request_id
WHERE m.role = 'prefill'
ORDER BY m.instance, m.first_step_index, m.request_id, m.trace_id, m.span_id
