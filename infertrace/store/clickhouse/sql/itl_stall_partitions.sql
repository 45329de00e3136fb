-- itl_stall_partitions (ClickHouse form of infertrace/analyzers/sql/itl_stall_partitions.sql): the candidate
-- steps (a prefill chunk or a host pause) cut, per engine, into ranges of at most {steps} distinct step indexes.
-- Parameters: {steps}. Columns: instance, first_step, last_step, candidates. {steps} as a block: relations/steps.sql.
SELECT instance, min(step_index) AS first_step, max(step_index) AS last_step, toInt64(count()) AS candidates
FROM (
    SELECT instance, step_index,
           intDiv(toInt64(dense_rank() OVER (PARTITION BY instance ORDER BY step_index)) - 1, {steps:Int64}) AS part
    FROM ({steps})
    WHERE num_prefills > 0 OR pause_ns > 0
)
GROUP BY instance, part
ORDER BY instance, first_step
