-- title: Models with elevated TTFT, latency or errors in a window
-- question: During a window, which models' TTFT, end-to-end latency and error/429 rates were above their
--   own level outside it, and by how much?
-- when: Several alerts fired at once ("three models degraded at 14:02"); first triage before the
--   incident view.
-- param since time: Window start (request arrival at the gateway).
-- param until time: Window end (exclusive).
-- example: since=2026-01-01T00:00:40Z until=2026-01-01T00:01:00Z
WITH gw AS (
    SELECT model, start_ns, http_status, outcome,
           ($since <= start_ns AND start_ns < $until) AS inside
    FROM component_calls WHERE component = 'gateway'
),
gw_rates AS (
    SELECT model,
           count(*) FILTER (WHERE inside) AS requests_in,
           count(*) FILTER (WHERE NOT inside) AS requests_out,
           count(*) FILTER (WHERE inside AND outcome = 'error') AS errors_in,
           count(*) FILTER (WHERE NOT inside AND outcome = 'error') AS errors_out,
           count(*) FILTER (WHERE inside AND http_status = 429) AS rejected_429_in,
           count(*) FILTER (WHERE NOT inside AND http_status = 429) AS rejected_429_out
    FROM gw GROUP BY model
),
lat AS (
    SELECT model,
           quantile_cont(ttft_ns, 0.5) FILTER (WHERE $since <= arrival_ns AND arrival_ns < $until) AS ttft_p50_in,
           quantile_cont(ttft_ns, 0.5) FILTER (WHERE NOT ($since <= arrival_ns AND arrival_ns < $until)) AS ttft_p50_out,
           quantile_cont(e2e_ns, 0.5) FILTER (WHERE $since <= arrival_ns AND arrival_ns < $until) AS e2e_p50_in,
           quantile_cont(e2e_ns, 0.5) FILTER (WHERE NOT ($since <= arrival_ns AND arrival_ns < $until)) AS e2e_p50_out
    FROM requests GROUP BY model
)
SELECT
    g.model,
    g.requests_in,
    round(l.ttft_p50_in / 1e6, 1) AS ttft_p50_ms_in,
    round(l.ttft_p50_out / 1e6, 1) AS ttft_p50_ms_out,
    round(l.ttft_p50_in / nullif(l.ttft_p50_out, 0), 2) AS ttft_ratio,
    round(l.e2e_p50_in / 1e6, 1) AS e2e_p50_ms_in,
    round(l.e2e_p50_in / nullif(l.e2e_p50_out, 0), 2) AS e2e_ratio,
    round(g.errors_in / nullif(g.requests_in, 0), 4) AS error_rate_in,
    round(g.errors_out / nullif(g.requests_out, 0), 4) AS error_rate_out,
    round(g.rejected_429_in / nullif(g.requests_in, 0), 4) AS rate_429_in,
    round(g.rejected_429_out / nullif(g.requests_out, 0), 4) AS rate_429_out
FROM gw_rates g
LEFT JOIN lat l ON l.model = g.model
WHERE g.model IS NOT NULL
ORDER BY greatest(coalesce(ttft_ratio, 0), coalesce(e2e_ratio, 0),
                  coalesce(error_rate_in - error_rate_out, 0) * 100, coalesce(rate_429_in - rate_429_out, 0) * 100) DESC
