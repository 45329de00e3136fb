-- title: Prefix-cache hit rate by system prompt
-- question: For each shared system prompt, how many of its tokens were served from the prefix cache, and
--   on how many requests did it miss entirely?
-- when: One tenant's cache hit rate dropped (e.g. fresh tokens placed before the system prompt, a
--   timestamp in the prompt): find which prompt stopped hitting.
-- param tenant text = null: Only this tenant.
-- param since time = null: Window start (arrival at the engine).
-- param until time = null: Window end (exclusive).
-- needs requests WHERE system_prompt_id IS NOT NULL: requests that name their shared system prompt
--   (infertrace.request.system_prompt.id: this project's engine sets it; vLLM, SGLang and TGI do not)
SELECT
    system_prompt_id,
    tenant,
    any_value(system_prompt_tokens) AS system_prompt_tokens,
    count(*) AS requests,
    round(sum(coalesce(cached_tokens, 0)) / nullif(sum(input_tokens), 0), 4) AS hit_rate,
    round(sum(least(coalesce(cached_tokens, 0), system_prompt_tokens))
          / nullif(sum(system_prompt_tokens), 0), 4) AS system_prompt_hit_rate,
    count(*) FILTER (WHERE coalesce(cached_tokens, 0) = 0) AS requests_without_hit
FROM requests
WHERE system_prompt_id IS NOT NULL
  AND ($tenant IS NULL OR tenant = $tenant)
  AND ($since IS NULL OR arrival_ns >= $since) AND ($until IS NULL OR arrival_ns < $until)
GROUP BY ALL
ORDER BY system_prompt_hit_rate, requests DESC
