-- tokens: one row per generated token, at the end of the step that produced it, with its inter-token
-- latency.
--
-- Answers: when did each request receive each token; which step produced it; what was the gap since the
-- previous token (ITL). An ITL spike is a token whose itl_ns is far above the engine's decode step time.
-- Columns: request_id, instance, token_index (0-based per request and engine; 0 is the first token), time_ns,
--   itl_ns (time since the request's previous token on the same engine; NULL for its first token there),
--   step_index, trace_id and span_id of the step span, from_prefill (true when a prefill chunk that completed
--   the prompt produced the token: the first token, or the first after a preemption), handover_ns (on the
--   first token a request gets on an engine after tokens on another: the time since that other engine's last
--   token. With disaggregation that is the decode worker's first token, and the gap is the KV transfer, the
--   decode worker's queue and its one-token recompute: labelled here, never counted as an ITL or a stall).
-- Tokens are counted per (request, engine): a disaggregated request's prefill worker produces one token (its
-- leg's, which the client never receives; `request_legs` role 'prefill') and its decode worker all the
-- client's tokens, from token_index 0.
-- A request in a span's decode list gets one token at the end of every step of the span; a prefilling
-- request whose chunk completed its prompt gets one at the end of that step. Differences are exact int64.
-- Cost: within a run of steps a token's ITL is that step's duration, so only the first token of each
-- (request, span) needs the request's previous token: the window runs over memberships (`token_runs`, which
-- aggregates over tokens read instead of this relation), not over tokens.
-- Engines without step spans that still time each token (infertrace/sources/): SGLang's scheduler ends a
-- `prefill_forward` slice at the first token and a `decode_loop` slice at each later one (trace level 3); TGI
-- opens a `send_generation` span per token. Their tokens have no step (step_index NULL; trace_id and span_id
-- are the token's own span), and their instance is the request's.
SELECT
    r.request_id,
    r.instance,
    CAST(r.tokens_before + CASE WHEN r.role = 'decode' THEN s.run_position ELSE 0 END AS BIGINT) AS token_index,
    s.end_ns AS time_ns,
    CASE WHEN r.role = 'decode' AND s.run_position > 0 THEN s.duration_ns ELSE r.first_itl_ns END AS itl_ns,
    s.step_index,
    s.trace_id,
    s.span_id,
    r.from_prefill,
    CASE WHEN r.role = 'prefill' OR s.run_position = 0 THEN r.handover_ns END AS handover_ns
FROM token_runs r
JOIN steps s ON s.trace_id = r.trace_id AND s.span_id = r.span_id
WHERE r.role = 'decode' OR (r.role = 'prefill' AND s.run_position = s.run_steps - 1)
UNION ALL
SELECT request_id, instance, tokens_before AS token_index, first_token_ns AS time_ns, first_itl_ns AS itl_ns,
       NULL::BIGINT AS step_index, trace_id, span_id, from_prefill, NULL::BIGINT AS handover_ns
FROM token_runs
WHERE role = 'span'
