-- instance_collisions: engine instances whose spans cannot all be one engine's run (several processes, step
-- spans that overlap in time or number their steps again), or whose run lacks step spans.
--
-- Answers: do two engines export the same service.instance.id (one id written into every replica's
-- OTEL_RESOURCE_ATTRIBUTES), or did an engine restart under the same id? One engine runs one step at a time, so
-- its `engine_step` spans never overlap, and it numbers its steps once per run; spans of several processes
-- (host.name, process.pid, vllm.process_id) under one id are several engines. The analyses key an engine's steps
-- by (instance, step_index): under such an id they mix steps of different engines or runs. And were step spans
-- lost (an exporter's queue full, sampling)? One run's step indexes have no gaps, so the indexes between its
-- first and last step that no span covers are steps whose spans the store never got. And were request spans
-- lost? A request that took part in an instance's steps, left its batch (later steps of the instance go on
-- without it) and was not preempted there has finished, and its request span should be in the store.
-- The analysis is `infertrace.analyzers.instances`.
-- Parameters: none.
-- Columns: instance (service.instance.id), processes (distinct host.name, process.pid and vllm.process_id
--   among its spans that carry any), step_spans, overlapping (step spans starting more than 1 µs before an
--   earlier one of the instance ended), repeated (step spans whose first step index an earlier one had),
--   first_step, last_step (lowest and highest step index its spans cover), steps (steps its spans cover:
--   a span covers its run of steps), unseen_requests (requests that took part in its steps and left them, not
--   preempted, with no engine request span in the store).
WITH steps AS (
    SELECT
        "res.service.instance.id" AS instance,
        "attr.infertrace.step.index" AS first_index,
        end_ns,
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
           min(first_index) AS first_step, max(first_index + run_steps - 1) AS last_step, sum(run_steps) AS steps,
           max(end_ns) AS last_end_ns
    FROM steps GROUP BY instance
),
unseen AS (  -- requests in the steps without a request span (none, normally: the join leaves no row to group)
    SELECT m.instance, m.request_id, arg_max(m.role, m.end_ns) AS last_role, max(m.end_ns) AS last_end_ns
    FROM step_membership m
    ANTI JOIN (SELECT DISTINCT request_id FROM request_legs) r ON r.request_id = m.request_id
    WHERE m.instance IS NOT NULL
    GROUP BY ALL
),
by_requests AS (
    SELECT u.instance, count(*) AS unseen_requests
    FROM unseen u
    JOIN by_steps s ON s.instance = u.instance
    WHERE u.last_role <> 'preempted' AND u.last_end_ns < s.last_end_ns
    GROUP BY ALL
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
    coalesce(s.steps, 0)::BIGINT AS steps,
    coalesce(r.unseen_requests, 0) AS unseen_requests
FROM by_steps s
FULL JOIN by_process p ON p.instance = s.instance
LEFT JOIN by_requests r ON r.instance = coalesce(s.instance, p.instance)
WHERE p.processes > 1 OR s.overlapping > 0 OR s.repeated > 0 OR s.steps < s.last_step - s.first_step + 1
   OR r.unseen_requests > 0
ORDER BY instance
