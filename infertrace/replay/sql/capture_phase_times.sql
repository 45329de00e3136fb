-- capture_phase_times: each request's measured time in the model, per phase, as request-level telemetry reports it.
--
-- Answers: how long did each of the model's requests spend prefilling (first scheduling to first token) and
-- decoding (first token to last), when the engines export no step spans (vLLM's `llm_request` span:
-- gen_ai.latency.time_in_model_prefill; its first and last token). `infertrace replay --calibrate` fits the cost
-- model to these when the store holds no engine step. A disaggregated request's prefill is its prefill worker's,
-- its decode from that first token to the decode worker's last.
-- Parameters: $model, $since_ns, $until_ns (arrival window, [since, until)).
-- Columns: request_id, prefill_ns, decode_ns (NULL where not measured).
SELECT
    request_id,
    arg_min(prefill_ns, arrival_ns) AS prefill_ns,
    max(finish_ns) - arg_min(first_token_ns, arrival_ns) AS decode_ns
FROM requests
WHERE model = $model AND error_type IS NULL
GROUP BY request_id
HAVING min(arrival_ns) >= $since_ns AND min(arrival_ns) < $until_ns
ORDER BY request_id
