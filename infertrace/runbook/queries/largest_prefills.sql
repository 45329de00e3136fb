-- title: Largest prefill chunks and the decodes they stalled
-- question: Which prefill chunks were computed in the longest steps, whose were they, how many decoding
--   requests shared each step, and how long was the step?
-- when: ITL p99 is high on a prefill-first engine; find the tenants sending the prompts that stall others.
-- param since time = null: Window start (step end).
-- param until time = null: Window end (exclusive).
-- param model text = null: Only this model's engines.
-- param top int = 20: How many chunks.
SELECT
    make_timestamp_ns(st.end_ns) AS step_end,
    st.instance,
    st.model,
    st.step_index,
    m.request_id AS prefill_request_id,
    r.tenant,
    m.chunk_tokens,
    m.computed_tokens AS cached_before_chunk,
    st.num_decodes AS decodes_in_step,
    round(st.duration_ns / 1e6, 3) AS step_ms
FROM step_membership m
JOIN steps st ON st.trace_id = m.trace_id AND st.span_id = m.span_id
LEFT JOIN requests r ON r.request_id = m.request_id
WHERE m.role = 'prefill'
  AND ($since IS NULL OR st.end_ns >= $since) AND ($until IS NULL OR st.end_ns < $until)
  AND ($model IS NULL OR st.model = $model)
ORDER BY st.duration_ns DESC, m.chunk_tokens DESC, m.request_id
LIMIT $top
