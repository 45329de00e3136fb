-- instance_collisions: engine instances whose spans cannot all be one engine's run (several processes, step
-- spans that overlap in time or number their steps again), or whose run lacks step spans.
--
-- Answers: do two engines export the same service.instance.id (one id written into every replica's
-- OTEL_RESOURCE_ATTRIBUTES), or did an engine restart under the same id? One engine runs one step at a time, so
-- its `engine_step` spans never overlap, and it numbers its steps once per run; spans of several processes
-- (host.name, process.pid, vllm.process_id) under one id are several engines. The analyses key an engine's steps
-- by (instance, step_index): under such an id they mix steps of different engines or runs. And were step spans
-- lost (an exporter's queue full, sampling)? One run's step indexes have no gaps, so the indexes between its
-- first and last step that no span covers are steps whose spans the store never got.
-- The analysis is `infertrace.analyzers.instances`.
-- Parameters: none.
-- Columns: instance (service.instance.id), processes (distinct host.name, process.pid and vllm.process_id
--   among its spans that carry any), step_spans, overlapping (step spans starting more than 1 µs before an
--   earlier one of the instance ended), repeated (step spans whose first step index an earlier one had),
--   first_step, last_step (lowest and highest step index its spans cover), steps (steps its spans cover:
--   a span covers its run of steps).
WITH steps AS (
    SELECT
        "res.service.instance.id" AS instance,
        "attr.infertrace.step.index" AS first_index,
        coalesce(len("attr.infertrace.step.durations_ns"), "attr.infertrace.step.count", 1) AS run_steps,
        start_ns < max(end_ns) OVER (PARTITION BY "res.service.instance.id" ORDER BY start_ns, end_ns
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) - 1000 AS overlapped,
        row_number() OVER (PARTITION BY "res.service.instance.id", "attr.infertrace.step.index"
                           ORDER BY start_ns) > 1 AS renumbered
    FROM spans
    WHERE name = 'engine_step' AND "res.service.instance.id" IS NOT NULL
),
by_steps AS (
    SELECT instance, count(*) AS step_spans, count(*) FILTER (WHERE overlapped) AS overlapping,
           count(*) FILTER (WHERE renumbered) AS repeated,
           min(first_index) AS first_step, max(first_index + run_steps - 1) AS last_step, sum(run_steps) AS steps
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
    coalesce(s.repeated, 0) AS repeated,
    s.first_step,
    s.last_step,
    coalesce(s.steps, 0)::BIGINT AS steps
FROM by_steps s
FULL JOIN by_process p ON p.instance = s.instance
WHERE p.processes > 1 OR s.overlapping > 0 OR s.repeated > 0 OR s.steps < s.last_step - s.first_step + 1
ORDER BY instance
