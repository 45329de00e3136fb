-- itl_stall_partitions: the candidate steps of `itl_stall_candidates` (a prefill chunk or a host pause) cut,
-- per engine, into ranges of consecutive step indexes holding at most $steps distinct
-- candidate step indexes each (a repeated index stays in one range: the ranges never overlap).
--
-- Answers: in which pieces to read the stall candidates and their victims, so that what one piece holds in
-- memory is set by $steps, not by the length of the window.
-- Parameters: $steps: candidate steps per range (at least 1).
-- Columns: instance, first_step, last_step (inclusive), candidates; ordered by instance, then first_step (the
--   order of `itl_stall_candidates`).
WITH numbered AS (
    SELECT instance, step_index, (dense_rank() OVER (PARTITION BY instance ORDER BY step_index) - 1) // $steps AS part
    FROM steps
    WHERE num_prefills > 0 OR pause_ns > 0
)
SELECT instance, min(step_index) AS first_step, max(step_index) AS last_step, count(*) AS candidates
FROM numbered
GROUP BY instance, part
ORDER BY instance, first_step
