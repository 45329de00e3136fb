-- title: A request's token timeline
-- question: When did request X receive each token, with what inter-token latency, from which engine step?
-- when: To see whether a slow stream was a few big stalls or uniformly slow decoding.
-- param request_id text: The request id.
-- param min_itl_ms float = 0: Only tokens with at least this ITL (0: every token).
-- example: request_id=tenant-a-000010
SELECT
    token_index,
    make_timestamp_ns(time_ns) AS time,
    round(itl_ns / 1e6, 3) AS itl_ms,
    step_index,
    instance,
    from_prefill
FROM tokens
WHERE request_id = $request_id AND (itl_ns IS NULL OR itl_ns >= CAST($min_itl_ms * 1e6 AS BIGINT))
ORDER BY token_index
