-- instance_collisions: engine instances whose spans cannot all be one engine's run: several processes, or step
-- spans that overlap in time or number their steps again.
--
-- Answers: do two engines export the same service.instance.id (one id written into every replica's
-- OTEL_RESOURCE_ATTRIBUTES), or did an engine restart under the same id? One engine runs one step at a time, so
-- its `engine_step` spans never overlap, and it numbers its steps once per run; spans of several processes
-- (host.name, process.pid, vllm.process_id) under one id are several engines. The analyses key an engine's steps
-- by (instance, step_index): under such an id they mix steps of different engines or runs. The analysis is
-- `infertrace.analyzers.instances`.
-- Parameters: none.
-- Columns: instance (service.instance.id), processes (distinct host.name, process.pid and vllm.process_id
--   among its spans that carry any), step_spans, overlapping (step spans starting more than 1 µs before an
--   earlier one of the instance ended), repeated (step spans whose first step index an earlier one had).
WITH steps AS (
    SELECT
        "res.service.instance.id" AS instance,
        start_ns < max(end_ns) OVER (PARTITION BY "res.service.instance.id" ORDER BY start_ns, end_ns
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) - 1000 AS overlapped,
        row_number() OVER (PARTITION BY "res.service.instance.id", "attr.infertrace.step.index"
                           ORDER BY start_ns) > 1 AS renumbered
    FROM spans
    WHERE name = 'engine_step' AND "res.service.instance.id" IS NOT NULL
),
by_steps AS (
    SELECT instance, count(*) AS step_spans, count(*) FILTER (WHERE overlapped) AS overlapping,
           count(*) FILTER (WHERE renumbered) AS repeated
    FROM steps GROUP BY instance
),
by_process AS (
    SELECT "res.service.instance.id" AS instance,
           count(DISTINCT ("res.host.name", "res.process.pid", "res.vllm.process_id")) AS processes
    FROM spans
    WHERE "res.service.instance.id" IS NOT NULL
      AND ("res.host.name" IS NOT NULL OR "res.process.pid" IS NOT NULL OR "res.vllm.process_id" IS NOT NULL)
    GROUP BY ALL
)
SELECT
    coalesce(s.instance, p.instance) AS instance,
    coalesce(p.processes, 0) AS processes,
    coalesce(s.step_spans, 0) AS step_spans,
    coalesce(s.overlapping, 0) AS overlapping,
    coalesce(s.repeated, 0) AS repeated
FROM by_steps s
FULL JOIN by_process p ON p.instance = s.instance
WHERE p.processes > 1 OR s.overlapping > 0 OR s.repeated > 0
ORDER BY instance
