-- title: A request's waterfall
-- question: Where did request X spend its time, one bar per stage in order: each gateway component call
--   (gateway, auth, rate limit, route, global queue) with its instance and outcome, then the engine request
--   with its queue, each prefill chunk (the engine step that computed it), preemptions, decode and KV
--   transfer?
-- when: Explaining one slow request end to end, as a trace viewer's waterfall would; the dashboard draws it.
-- param request_id text: The request id (gen_ai.request.id).
-- example: request_id=tenant-a-000010
WITH req AS (
    SELECT * FROM request_legs WHERE request_id = $request_id
),
stage AS (
    SELECT CASE component WHEN 'gateway' THEN 0 ELSE 1 END AS depth, component AS stage, instance, start_ns, end_ns,
           concat_ws(' ', outcome, CAST(http_status AS VARCHAR), route_target) AS detail
    FROM component_calls
    WHERE request_id = $request_id OR trace_id IN (SELECT trace_id FROM req)
    UNION ALL
    SELECT 0, 'engine request', instance, arrival_ns, finish_ns,
           concat_ws(' ', outcome, input_tokens || ' in', output_tokens || ' out', cached_tokens || ' cached')
    FROM req
    UNION ALL
    SELECT 1, 'queue', instance, arrival_ns, scheduled_ns, NULL FROM req WHERE scheduled_ns > arrival_ns
    UNION ALL
    SELECT 1, 'prefill', instance, scheduled_ns, first_token_ns, prefill_chunks || ' chunks'
    FROM req WHERE first_token_ns > scheduled_ns
    UNION ALL
    SELECT 2, CASE role WHEN 'prefill' THEN 'prefill chunk' ELSE 'preempted' END, instance, start_ns, end_ns,
           CASE role WHEN 'prefill' THEN chunk_tokens || ' tokens, ' || computed_tokens || ' cached' END
    FROM step_membership
    WHERE request_id = $request_id AND role IN ('prefill', 'preempted')
    UNION ALL
    SELECT 1, 'decode', instance, first_token_ns, finish_ns, output_tokens || ' tokens' FROM req
    WHERE finish_ns > first_token_ns
)
SELECT
    row_number() OVER (ORDER BY start_ns, depth, end_ns DESC) AS row,
    stage, depth, instance,
    make_timestamp_ns(start_ns) AS start,
    make_timestamp_ns(end_ns) AS "end",
    round((start_ns - min(start_ns) OVER ()) / 1e6, 3) AS start_ms,
    round((end_ns - start_ns) / 1e6, 3) AS duration_ms,
    detail
FROM stage
WHERE start_ns IS NOT NULL AND end_ns IS NOT NULL
ORDER BY row
