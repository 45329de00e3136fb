-- capture_unserved: requests for a model that the gateway answered without reaching an engine, by status.
--
-- Answers: what part of the window's traffic a replay of the engines leaves out (401 from auth, 429 from the
-- rate limiter, 503 from a failing router, ...): their outcome does not depend on the engines' config.
-- Parameters: $model, $since_ns, $until_ns (gateway arrival).
-- Columns: http_status, requests.
WITH engine_traces AS (SELECT DISTINCT trace_id FROM spans WHERE name = 'llm_request')
SELECT coalesce(g."attr.http.response.status_code", TRY_CAST(g.span_attributes['http.status_code'] AS BIGINT))
           AS http_status,
       count(*) AS requests
FROM spans g
LEFT JOIN engine_traces e ON e.trace_id = g.trace_id
WHERE g.name = 'gateway' AND g."attr.gen_ai.request.model" = $model AND e.trace_id IS NULL
  AND g.start_ns >= $since_ns AND g.start_ns < $until_ns
GROUP BY ALL
ORDER BY http_status
