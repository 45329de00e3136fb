-- ttft_components: each request's time to first token, split into where it went, each phase from the engine
-- leg it belongs to (`requests`: one row per request, its prefill and decode legs joined when disaggregated).
--
-- Answers: is TTFT queueing, the gateway (auth, rate limit, route, global queue), the prefill's own
-- compute, waiting between chunks behind other prefills, or, when prefill and decode are disaggregated, the
-- KV transfer, the decode worker's queue and its first decode step?
-- Parameters: none.
-- Columns: request_id, model, instance (the engine that prefilled: the prefill worker when disaggregated),
--   tenant, arrival_ns, input_tokens, cached_tokens, preemptions,
--   gateway_ns (gateway span start to the first engine's arrival; NULL without a gateway span), queue_ns,
--   prefill_ns (first scheduling to first token; disaggregated: to the end of the prefill leg),
--   prefill_compute_ns (the steps of that engine that computed its chunks; NULL without step spans),
--   prefill_wait_ns (prefill_ns less its compute), kv_transfer_ns, decode_queue_ns, first_decode_ns (NULL when
--   colocated), ttft_ns (from the first engine's arrival), client_ttft_ns (gateway start to first token, else
--   ttft_ns), serving ('colocated' | 'disaggregated'). gateway_ns + queue_ns + prefill_ns + kv_transfer_ns +
--   decode_queue_ns + first_decode_ns = client_ttft_ns (NULL phases as 0).
WITH compute AS (
    SELECT m.request_id, m.instance, sum(s.duration_ns)::BIGINT AS prefill_compute_ns
    FROM step_membership m
    JOIN steps s ON s.trace_id = m.trace_id AND s.span_id = m.span_id
    WHERE m.role = 'prefill'
    GROUP BY m.request_id, m.instance
)
SELECT r.request_id, r.model, coalesce(r.prefill_instance, r.instance) AS instance, r.tenant, r.arrival_ns,
       r.input_tokens, r.cached_tokens, coalesce(r.preemptions, 0) AS preemptions,
       r.gateway_ns, r.queue_ns, r.prefill_ns, c.prefill_compute_ns,
       greatest(r.prefill_ns - c.prefill_compute_ns, 0) AS prefill_wait_ns,
       r.kv_transfer_ns, r.decode_queue_ns, r.first_decode_ns, r.ttft_ns, r.client_ttft_ns, r.serving
FROM requests r
LEFT JOIN compute c ON c.request_id = r.request_id AND c.instance = coalesce(r.prefill_instance, r.instance)
WHERE r.outcome = 'ok' AND r.ttft_ns IS NOT NULL
-- in a fixed order: the prefill fit's floating-point sums must not depend on how the spans were stored
ORDER BY r.arrival_ns, r.request_id
