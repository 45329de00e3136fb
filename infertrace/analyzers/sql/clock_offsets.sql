-- clock_offsets: per engine instance behind a gateway, the gaps between a request's gateway entry span and its
-- engine span, each end on its own host's clock.
--
-- Answers: does an engine's clock disagree with the gateway's? A request cannot reach an engine before it
-- entered the gateway, so a negative start gap proves the engine's clock behind the gateway's. The replicas of
-- one model behind the same gateway share a floor of each gap (their 1st percentile: auth, rate limit and route
-- before the engine, the response's way back after it), so a replica whose floors stand apart from its
-- siblings' is apart from them: its clock when the start floor rises by what the end floor falls (or the
-- reverse), its network path when both rise. Either way the split of TTFT between gateway and engine
-- (`requests.gateway_ns`) is off for its requests. The analysis is `infertrace.analyzers.clocks`.
-- Parameters: none.
-- Columns: model, instance (the engine the request reached first: the prefill worker when disaggregated),
--   requests (with a gateway entry span), early (of them, reaching the engine before entering the gateway),
--   start_floor_ns (1st percentile of the start gap: engine arrival less the entry's start), ended (colocated
--   requests that succeeded: the entry waited for the engine's last token), end_floor_ns (1st percentile of
--   their end gap: the entry's end less the engine's finish; NULL without such requests).
WITH entry AS (
    SELECT trace_id, min(start_ns) AS start_ns, max(end_ns) AS end_ns
    FROM component_calls WHERE role = 'entry'
    GROUP BY trace_id
),
gaps AS (
    SELECT r.model, coalesce(r.prefill_instance, r.instance) AS instance,
           r.arrival_ns - e.start_ns AS start_gap_ns,
           CASE WHEN r.serving = 'colocated' AND r.outcome = 'ok' THEN e.end_ns - r.finish_ns END AS end_gap_ns
    FROM requests r
    JOIN entry e ON e.trace_id = r.trace_id
    WHERE coalesce(r.prefill_instance, r.instance) IS NOT NULL
)
SELECT
    model,
    instance,
    count(*) AS requests,
    count(*) FILTER (WHERE start_gap_ns < 0) AS early,
    CAST(quantile_disc(start_gap_ns, 0.01) AS BIGINT) AS start_floor_ns,
    count(end_gap_ns) AS ended,
    CAST(quantile_disc(end_gap_ns, 0.01) AS BIGINT) AS end_floor_ns
FROM gaps
GROUP BY ALL
ORDER BY model, instance
