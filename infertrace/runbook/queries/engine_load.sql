-- title: Engine load summary
-- question: Per engine instance: how many steps, how busy (share of time in steps), batch sizes, waiting
--   queue, KV usage and preemptions in a window?
-- when: To tell an overloaded engine (queueing, full KV) from a slow one (long steps at normal load).
-- param since time = null: Window start (step end).
-- param until time = null: Window end (exclusive).
SELECT
    instance,
    model,
    hardware,
    policy,
    count(*) AS steps,
    round(sum(duration_ns) / nullif(max(end_ns) - min(start_ns), 0), 4) AS busy_share,
    round(avg(num_decodes), 1) AS mean_decodes,
    max(running) AS max_running,
    round(avg(waiting), 1) AS mean_waiting,
    max(waiting) AS max_waiting,
    round(max(kv_used_blocks / nullif(kv_total_blocks, 0)), 4) AS max_kv_usage,
    sum(num_preempted) AS preemptions,
    round(quantile_cont(duration_ns, 0.5) / 1e6, 3) AS step_p50_ms,
    round(quantile_cont(duration_ns, 0.99) / 1e6, 3) AS step_p99_ms
FROM steps
WHERE ($since IS NULL OR end_ns >= $since) AND ($until IS NULL OR end_ns < $until)
GROUP BY ALL
ORDER BY instance
