-- title: 429s by tenant and rate limiter
-- question: Which tenants were rejected with 429 by which rate limiter instance, how often, and what
--   share of their calls was that?
-- when: Customers report "Too Many Requests", or gateway error rates rose without engine latency rising.
-- param since time = null: Window start.
-- param until time = null: Window end (exclusive).
-- needs component_calls WHERE component_kind = 'rate_limiter': calls to a rate limiter (spans whose resource
--   has infertrace.component.kind = rate_limiter, as this project's gateway sets; another gateway's rate
--   limiter is a component call of its own name, see `component_latency_over_time`)
SELECT
    instance AS rate_limiter,
    tenant,
    count(*) AS calls,
    count(*) FILTER (WHERE http_status = 429) AS rejected_429,
    round(count(*) FILTER (WHERE http_status = 429) / count(*), 4) AS rejected_share,
    list(DISTINCT model ORDER BY model) AS models,
    make_timestamp_ns(min(start_ns) FILTER (WHERE http_status = 429)) AS first_429,
    make_timestamp_ns(max(start_ns) FILTER (WHERE http_status = 429)) AS last_429
FROM component_calls
WHERE component_kind = 'rate_limiter'
  AND ($since IS NULL OR start_ns >= $since)
  AND ($until IS NULL OR start_ns < $until)
GROUP BY ALL
ORDER BY rejected_429 DESC, rate_limiter, tenant
