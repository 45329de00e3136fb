-- title: Preemptions by engine
-- question: Which engines preempted requests (ran out of KV blocks), when, and how much prompt did the
--   preempted requests have to recompute?
-- when: ITL or E2E spikes without large prefills; KV usage near full; requests taking far longer than
--   their output length explains.
-- param since time = null: Window start.
-- param until time = null: Window end (exclusive).
-- needs step_membership WHERE role = 'preempted': requests preempted in an engine step
WITH p AS (
    SELECT m.instance, m.request_id, m.start_ns
    FROM step_membership m
    WHERE m.role = 'preempted'
      AND ($since IS NULL OR m.start_ns >= $since) AND ($until IS NULL OR m.start_ns < $until)
)
SELECT
    p.instance,
    count(*) AS preemptions,
    count(DISTINCT p.request_id) AS requests_preempted,
    make_timestamp_ns(min(p.start_ns)) AS first_preemption,
    make_timestamp_ns(max(p.start_ns)) AS last_preemption,
    sum(r.input_tokens) AS prompt_tokens_of_preempted,
    round(avg(r.output_tokens), 1) AS mean_output_tokens_of_preempted,
    round(quantile_cont(r.e2e_ns, 0.5) / 1e6, 1) AS e2e_p50_ms_of_preempted
FROM p
LEFT JOIN requests r ON r.request_id = p.request_id
GROUP BY p.instance
ORDER BY preemptions DESC
