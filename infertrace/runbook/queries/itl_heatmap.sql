-- title: ITL over time on an engine
-- question: How were engine X's inter-token latencies distributed over time: how many tokens per time bucket
--   fell into each ITL band (bands double: 1-2 ms, 2-4 ms, ...), and the worst ITL in each cell?
-- when: To see when an engine's decodes stalled and how badly, before picking one stall to explain.
-- param instance text: Engine instance (service.instance.id).
-- param bucket_s float = 10: Time bucket width in seconds.
-- param since time = null: Window start (token time).
-- param until time = null: Window end (exclusive).
-- example: instance=llama-3-8b-0 bucket_s=5
-- Read from the engine's token runs and steps, not a row per token: a run's first token has its own ITL, and each
-- later token of a decode run waited one step of its span (one token per decoding request at each such step).
WITH itl AS (
    SELECT first_token_ns AS time_ns, first_itl_ns AS itl_ns, 1::BIGINT AS n
    FROM token_runs
    WHERE instance = $instance AND first_itl_ns IS NOT NULL
    UNION ALL
    SELECT end_ns, duration_ns, num_decodes
    FROM steps
    WHERE instance = $instance AND run_position > 0 AND num_decodes > 0 AND duration_ns IS NOT NULL
),
token AS (
    SELECT time_ns // CAST($bucket_s * 1e9 AS BIGINT) AS bucket,
           CAST(floor(log2(greatest(itl_ns / 1e6, 0.0625))) AS INTEGER) AS band,
           itl_ns, n
    FROM itl
    WHERE ($since IS NULL OR time_ns >= $since) AND ($until IS NULL OR time_ns < $until)
)
SELECT
    make_timestamp_ns(bucket * CAST($bucket_s * 1e9 AS BIGINT)) AS bucket_start,
    make_timestamp_ns((bucket + 1) * CAST($bucket_s * 1e9 AS BIGINT)) AS bucket_end,
    pow(2, band) AS band_low_ms,
    pow(2, band + 1) AS band_high_ms,
    sum(n)::BIGINT AS tokens,
    round(max(itl_ns) / 1e6, 3) AS max_itl_ms
FROM token
GROUP BY bucket, band
ORDER BY bucket, band
