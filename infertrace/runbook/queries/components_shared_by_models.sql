-- title: Components that a set of models' requests shared
-- question: Which gateway components (auth, rate limiter, router, global queue, KV links) served the
--   requests of these models in a window, which other models they serve, and how their latency and
--   failures inside the window compare with outside it?
-- when: Several models degraded together: a component shared by exactly those models is the prime suspect.
-- param models text[]: The degraded models, comma-separated.
-- param since time: Window start.
-- param until time: Window end (exclusive).
-- example: models=llama-3-8b,llama-3-70b since=2026-01-01T00:00:40Z until=2026-01-01T00:01:00Z
WITH calls AS (
    SELECT component, component_kind, coalesce(instance, kv_link) AS instance, model, latency_ns, outcome,
           ($since <= start_ns AND start_ns < $until) AS inside
    FROM component_calls WHERE component <> 'gateway'
),
served AS (
    SELECT component, instance, list(DISTINCT model ORDER BY model) AS models_served
    FROM calls WHERE model IS NOT NULL GROUP BY ALL
)
SELECT
    c.component_kind,
    c.instance,
    s.models_served,
    len(list_intersect(s.models_served, $models)) AS degraded_models_served,
    len(s.models_served) - len(list_intersect(s.models_served, $models)) AS other_models_served,
    count(*) FILTER (WHERE c.inside AND list_contains($models, c.model)) AS calls_in_window,
    round(quantile_cont(c.latency_ns, 0.99) FILTER (WHERE c.inside) / 1e6, 3) AS p99_ms_in,
    round(quantile_cont(c.latency_ns, 0.99) FILTER (WHERE NOT c.inside) / 1e6, 3) AS p99_ms_out,
    count(*) FILTER (WHERE c.inside AND c.outcome <> 'ok') AS failures_in,
    count(*) FILTER (WHERE NOT c.inside AND c.outcome <> 'ok') AS failures_out
FROM calls c
JOIN served s ON s.component = c.component AND s.instance IS NOT DISTINCT FROM c.instance
GROUP BY ALL
HAVING calls_in_window > 0
ORDER BY degraded_models_served DESC, other_models_served, p99_ms_in / nullif(p99_ms_out, 0) DESC NULLS LAST
