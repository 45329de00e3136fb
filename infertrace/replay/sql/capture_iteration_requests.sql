-- capture_iteration_requests: every request an engine timed, as vLLM's iteration log is placed by and its steps'
-- shapes are estimated from.
--
-- Answers: which requests an engine was prefilling (first scheduling to first token) and decoding (first token
-- to finish) at a time, with their prompt and output lengths: an iteration line counts its context (prefill)
-- tokens and its generation requests, not their context lengths nor whose chunks it ran.
-- Columns: request_id, instance, tenant, model, scheduled_ns, first_token_ns, finish_ns, input_tokens,
--   cached_tokens, output_tokens.
SELECT request_id, instance, tenant, model, scheduled_ns, first_token_ns, finish_ns, input_tokens, cached_tokens,
       output_tokens
FROM requests
WHERE instance IS NOT NULL AND first_token_ns IS NOT NULL
ORDER BY instance, first_token_ns, request_id
