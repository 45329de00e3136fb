-- trace_propagation: requests seen at a gateway's entry span whose trace holds no engine span, and engine requests
-- whose trace holds no gateway entry span, per model (and per engine instance for the latter).
--
-- Answers: does the gateway pass its trace context (W3C traceparent) on to the engines? Where it does not, every
-- request is two traces: the gateway's, answered but with no engine in it, and the engine's, with no gateway in
-- it. Requests the gateway refused or failed (4xx, 5xx, an error status) never reach an engine and are left out.
-- The analysis is `infertrace.analyzers.propagation`.
-- Parameters: none.
-- Columns: side ('gateway' | 'engine'), model (the entry's model attribute, NULL when it names none; the engine
--   request's model), instance (NULL on the gateway side), alone (requests whose trace lacks the other side),
--   requests (all of that side's answered requests for the model, or the instance's).
WITH answered AS (
    SELECT trace_id, model
    FROM component_calls
    WHERE role = 'entry' AND coalesce(http_status, 200) < 400 AND coalesce(status_code, 0) <> 2
),
engine_traces AS (SELECT DISTINCT trace_id FROM requests),
entry_traces AS (SELECT DISTINCT trace_id FROM component_calls WHERE role = 'entry')
SELECT 'gateway' AS side, model, NULL AS instance,
       sum(CASE WHEN trace_id NOT IN (SELECT trace_id FROM engine_traces) THEN 1 ELSE 0 END) AS alone,
       count(*) AS requests
FROM answered
GROUP BY model
UNION ALL
SELECT 'engine' AS side, model, coalesce(prefill_instance, instance) AS instance,
       sum(CASE WHEN trace_id NOT IN (SELECT trace_id FROM entry_traces) THEN 1 ELSE 0 END) AS alone,
       count(*) AS requests
FROM requests
WHERE outcome = 'ok'
GROUP BY model, coalesce(prefill_instance, instance)
ORDER BY side, model, instance
