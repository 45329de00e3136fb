-- title: Engine step timeline around a moment
-- question: What did an engine compute step by step around a timestamp: step durations, prefill and decode
--   tokens, running and waiting requests, KV usage, preemptions, host pauses?
-- when: You have a spike's time and engine instance and want to see the steps that produced it.
-- param instance text: Engine instance (service.instance.id).
-- param at time: The moment to centre on.
-- param window_ms float = 500: Steps ending within this many milliseconds either side.
-- example: instance=llama-3-8b-0 at=2026-01-01T00:00:30Z
SELECT
    step_index,
    make_timestamp_ns(start_ns) AS step_start,
    make_timestamp_ns(end_ns) AS step_end,
    round((end_ns - $at) / 1e6, 3) AS end_ms_from_at,
    round(duration_ns / 1e6, 3) AS duration_ms,
    prefill_tokens,
    num_prefills,
    decode_tokens,
    num_decodes,
    running,
    waiting,
    kv_used_blocks,
    num_preempted,
    round(pause_ns / 1e6, 3) AS pause_ms
FROM steps
WHERE instance = $instance
  AND end_ns BETWEEN $at - CAST($window_ms * 1e6 AS BIGINT) AND $at + CAST($window_ms * 1e6 AS BIGINT)
ORDER BY step_index
