-- title: Prefill pool against decode pool load
-- question: For each disaggregated model, how loaded is its prefill pool against its decode pool: legs
--   served, share of time in steps, requests waiting, KV usage, queue time of the legs, step time?
-- when: A disaggregated model's TTFT or ITL rose: a prefill pool that saturates shows busy share near 1 and
--   prefill legs queueing; a decode pool that does shows waiting decode legs and longer steps. Colocated
--   models' engines are listed as the colocated pool, for comparison.
-- param since time = null: Window start (arrival of the leg at its engine; step end for steps).
-- param until time = null: Window end (exclusive).
WITH legs AS (
    SELECT model, role, instance, queue_ns
    FROM request_legs
    WHERE ($since IS NULL OR arrival_ns >= $since) AND ($until IS NULL OR arrival_ns < $until)
),
pool AS (
    SELECT DISTINCT model, role, instance FROM request_legs
),
step AS (
    SELECT p.model, p.role, count(DISTINCT s.instance) AS engines,
           round(sum(s.duration_ns) / nullif(count(DISTINCT s.instance) * (max(s.end_ns) - min(s.start_ns)), 0), 4)
               AS busy_share,
           round(avg(s.waiting), 1) AS mean_waiting,
           max(s.waiting) AS max_waiting,
           round(max(s.kv_used_blocks / nullif(s.kv_total_blocks, 0)), 4) AS max_kv_usage,
           round(quantile_cont(s.duration_ns, 0.5) / 1e6, 3) AS step_p50_ms,
           round(quantile_cont(s.duration_ns, 0.99) / 1e6, 3) AS step_p99_ms
    FROM steps s JOIN pool p ON p.instance = s.instance
    WHERE ($since IS NULL OR s.end_ns >= $since) AND ($until IS NULL OR s.end_ns < $until)
    GROUP BY p.model, p.role
)
SELECT
    l.model,
    l.role AS pool,
    count(DISTINCT l.instance) AS engines,
    count(*) AS legs,
    round(quantile_cont(l.queue_ns, 0.5) / 1e6, 3) AS queue_p50_ms,
    round(quantile_cont(l.queue_ns, 0.99) / 1e6, 3) AS queue_p99_ms,
    s.busy_share, s.mean_waiting, s.max_waiting, s.max_kv_usage, s.step_p50_ms, s.step_p99_ms
FROM legs l
LEFT JOIN step s ON s.model = l.model AND s.role = l.role
GROUP BY l.model, l.role, s.busy_share, s.mean_waiting, s.max_waiting, s.max_kv_usage, s.step_p50_ms, s.step_p99_ms
ORDER BY l.model, CASE l.role WHEN 'prefill' THEN 0 WHEN 'decode' THEN 1 ELSE 2 END
