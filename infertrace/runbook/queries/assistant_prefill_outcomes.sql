-- title: Requests with an assistant prefill and their outcomes
-- question: Do requests that supply the start of the reply (assistant prefill) finish differently: more
--   runs to max_tokens, longer outputs, slower end to end, more errors?
-- when: Output lengths or E2E rose for a model and the callers recently started prefilling replies.
-- param model text = null: Only this model.
-- param since time = null: Window start (arrival at the engine).
-- param until time = null: Window end (exclusive).
SELECT
    model,
    coalesce(assistant_prefill_tokens, 0) > 0 AS assistant_prefill,
    count(*) AS requests,
    round(count(*) FILTER (WHERE finish_reason = 'length') / count(*), 4) AS share_hit_max_tokens,
    round(avg(output_tokens), 1) AS mean_output_tokens,
    round(quantile_cont(e2e_ns, 0.5) / 1e6, 1) AS e2e_p50_ms,
    round(quantile_cont(e2e_ns, 0.99) / 1e6, 1) AS e2e_p99_ms,
    count(*) FILTER (WHERE outcome = 'error') AS errors
FROM requests
WHERE ($model IS NULL OR model = $model)
  AND ($since IS NULL OR arrival_ns >= $since) AND ($until IS NULL OR arrival_ns < $until)
GROUP BY ALL
ORDER BY model, assistant_prefill
