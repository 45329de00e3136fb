-- ttft_components: each engine request's time to first token, split into where it went.
--
-- Answers: is TTFT queueing, the gateway (auth, rate limit, route, global queue), the prefill's own
-- compute, waiting between chunks behind other prefills, or the KV transfer of disaggregated serving?
-- Parameters: none.
-- Columns: request_id, model, instance, tenant, arrival_ns, input_tokens, cached_tokens, preemptions,
--   gateway_ns (gateway span start to the engine's arrival; NULL without a gateway span), queue_ns,
--   prefill_ns (first scheduling to first token), prefill_compute_ns (the steps that computed its chunks;
--   NULL without step spans), prefill_wait_ns (prefill_ns less its compute), kv_transfer_ns, ttft_ns (engine),
--   client_ttft_ns (gateway start to first token, else ttft_ns).
WITH gateway AS (
    SELECT request_id, min(start_ns) AS gateway_start_ns
    FROM component_calls WHERE component = 'gateway' AND request_id IS NOT NULL GROUP BY request_id
),
compute AS (
    SELECT m.request_id, sum(s.duration_ns)::BIGINT AS prefill_compute_ns
    FROM step_membership m
    JOIN steps s ON s.trace_id = m.trace_id AND s.span_id = m.span_id
    WHERE m.role = 'prefill'
    GROUP BY m.request_id
)
SELECT r.request_id, r.model, r.instance, r.tenant, r.arrival_ns, r.input_tokens, r.cached_tokens,
       coalesce(r.preemptions, 0) AS preemptions,
       r.arrival_ns - g.gateway_start_ns AS gateway_ns,
       r.queue_ns, r.prefill_ns, c.prefill_compute_ns,
       greatest(r.prefill_ns - coalesce(r.kv_transfer_ns, 0) - c.prefill_compute_ns, 0) AS prefill_wait_ns,
       r.kv_transfer_ns, r.ttft_ns,
       coalesce(r.first_token_ns - g.gateway_start_ns, r.ttft_ns) AS client_ttft_ns
FROM requests r
LEFT JOIN gateway g ON g.request_id = r.request_id
LEFT JOIN compute c ON c.request_id = r.request_id
WHERE r.outcome = 'ok' AND r.ttft_ns IS NOT NULL
-- in a fixed order: the prefill fit's floating-point sums must not depend on how the spans were stored
ORDER BY r.request_id
