-- capture_routes: the router's choice for each routed request of a model, in routing order.
--
-- Answers: how did the router spread the model's requests over its replicas (round robin, least loaded, or
-- one replica per shared prefix), so that a replay routes as the capture did.
-- Parameters: $model, $since_ns, $until_ns (route start).
-- Columns: start_ns, target (service.instance.id), system_prompt_id (of the engine request; NULL when none).
WITH routed AS (
    SELECT trace_id, start_ns, "attr.infertrace.route.target" AS target
    FROM spans
    WHERE name = 'route' AND "attr.infertrace.route.target" IS NOT NULL
      AND start_ns >= $since_ns AND start_ns < $until_ns
)
SELECT r.start_ns, r.target, any_value(q.system_prompt_id) AS system_prompt_id
FROM routed r
JOIN request_legs q ON q.trace_id = r.trace_id AND q.instance = r.target
WHERE q.model = $model
GROUP BY r.trace_id, r.start_ns, r.target
ORDER BY r.start_ns
