-- itl_request_tokens: each request's tenant, prompt length and prefix-cache hit, from `requests`.
--
-- Answers: how long a victim's prompt was (its decode context) and who a culprit prefill belonged to.
-- The ITL analyzer keeps this narrow projection in a temporary table instead of materializing all of
-- `requests` (its phase timings join queue and KV-transfer spans the ITL analysis never reads).
-- Parameters: none.
-- Columns: request_id, tenant, input_tokens, cached_tokens.
SELECT request_id, tenant, input_tokens, cached_tokens
FROM requests
