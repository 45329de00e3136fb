-- metrics_itl_histogram: per engine, how many tokens' inter-token latencies fell into each histogram bucket,
-- and their sum, for the Prometheus histogram `vllm:inter_token_latency_seconds`.
--
-- Answers: the ITL distribution of each engine in vLLM's buckets. Parameter: $itl (ascending bucket upper
-- bounds in seconds). Columns: instance, bucket (0-based index of the first bound ≥ the ITL;
-- len(bounds) for +Inf), tokens, sum_seconds.
-- The tokens' ITLs as `tokens` gives them, counted without making a row per token: a run's first token has
-- the run's first_itl_ns, and each later token of a decode run the duration of its step, the same for every
-- request decoding in that span (so each such step is counted once per member). Each distinct ITL is put in
-- its bucket once.
WITH members AS (
    SELECT instance, trace_id, span_id, count(*) AS members
    FROM token_runs
    WHERE role = 'decode' AND tokens > 1
    GROUP BY ALL
),
itls AS (
    SELECT instance, first_itl_ns AS itl_ns, 1 AS n FROM token_runs WHERE first_itl_ns IS NOT NULL
    UNION ALL
    SELECT m.instance, s.duration_ns, m.members
    FROM members m JOIN steps s ON s.trace_id = m.trace_id AND s.span_id = m.span_id
    WHERE s.run_position > 0 AND s.duration_ns IS NOT NULL
),
distinct_itls AS (
    SELECT instance, itl_ns, sum(n) AS n FROM itls GROUP BY ALL
)
SELECT instance,
       len(list_filter($itl, lambda b: b < itl_ns / 1e9)) AS bucket,
       sum(n)::BIGINT AS tokens,
       sum(itl_ns::HUGEINT * n) / 1e9 AS sum_seconds
FROM distinct_itls
GROUP BY ALL
ORDER BY instance, bucket
