-- metrics_engine_totals: per engine, the token, prefix-cache, preemption and outcome totals of its requests,
-- and its load at its last step, for the vLLM-named counters and gauges `infertrace serve-metrics` exposes.
--
-- Answers: how many prompt and generated tokens each engine processed, how many prompt tokens it looked up
-- in and read from its prefix cache, how many preemptions and finished requests (by finish reason) it had,
-- and how many requests were running and waiting and how full its KV cache was when its last step ended.
-- Columns: model, instance, finish_reason, requests, prompt_tokens, generation_tokens, prompt_tokens_queried and
--   cached_tokens (the prompt tokens, and those read from the prefix cache, of the requests whose spans give a
--   cached-token count; NULL where none does: vLLM's spans), preemptions (NULL where no span counts them), all
--   per finish reason (sum them for the engine), running, waiting, kv_used_blocks, kv_total_blocks (at the
--   engine's last step; NULL without step spans).
WITH last_step AS (
    SELECT instance, arg_max(running, end_ns) AS running, arg_max(waiting, end_ns) AS waiting,
           arg_max(kv_used_blocks, end_ns) AS kv_used_blocks, arg_max(kv_total_blocks, end_ns) AS kv_total_blocks
    FROM steps
    GROUP BY instance
)
SELECT r.model, r.instance, coalesce(r.finish_reason, r.outcome) AS finish_reason,
       count(*) AS requests,
       coalesce(sum(r.input_tokens), 0)::BIGINT AS prompt_tokens,
       coalesce(sum(r.output_tokens), 0)::BIGINT AS generation_tokens,
       sum(r.input_tokens) FILTER (WHERE r.cached_tokens IS NOT NULL)::BIGINT AS prompt_tokens_queried,
       sum(r.cached_tokens)::BIGINT AS cached_tokens,
       sum(r.preemptions)::BIGINT AS preemptions,
       any_value(s.running) AS running, any_value(s.waiting) AS waiting,
       any_value(s.kv_used_blocks) AS kv_used_blocks, any_value(s.kv_total_blocks) AS kv_total_blocks
FROM request_legs r
LEFT JOIN last_step s USING (instance)
WHERE r.instance IS NOT NULL
GROUP BY ALL
ORDER BY r.model, r.instance, finish_reason
