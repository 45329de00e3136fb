-- itl_stall_chunks (ClickHouse form of infertrace/analyzers/sql/itl_stall_chunks.sql): the prefill chunks computed
-- in given steps, with the requests they belong to. Same columns, same order; read that file.
-- Parameters: {instances}, {step_indexes}: parallel arrays naming the steps.
-- {step_membership}, {requests}: the ClickHouse forms of the relations (relations/).
WITH
wanted AS (
    SELECT pair.1 AS instance, pair.2 AS step_index
    FROM (SELECT arrayJoin(arrayZip({instances:Array(String)}, {step_indexes:Array(Int64)})) AS pair)
),
membership AS (SELECT * FROM ({step_membership})),
preempted AS (
    SELECT request_id, instance, min(first_step_index) AS first_preempted_step
    FROM membership WHERE role = 'preempted' GROUP BY request_id, instance
)
SELECT m.instance AS instance, m.first_step_index AS step_index, m.request_id AS request_id,
       m.chunk_tokens AS chunk_tokens, m.computed_tokens AS computed_tokens,
       CAST(coalesce(p.first_preempted_step < m.first_step_index, false) AS Bool) AS recompute,
       r.tenant AS tenant, r.input_tokens AS input_tokens, r.cached_tokens AS cached_tokens
FROM membership m
JOIN wanted w ON w.instance = m.instance AND w.step_index = m.first_step_index
LEFT JOIN preempted p ON p.request_id = m.request_id AND p.instance = m.instance
LEFT JOIN (SELECT request_id, tenant, input_tokens, cached_tokens FROM ({requests})) r ON r.request_id = m.request_id
WHERE m.role = 'prefill'
ORDER BY m.instance, m.first_step_index, m.request_id, m.trace_id, m.span_id
