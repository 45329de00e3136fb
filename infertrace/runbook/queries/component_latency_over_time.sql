-- title: Component latency over time
-- question: How did each gateway component instance's p50/p99 latency move per time bucket?
-- when: A shared component is suspected of adding latency; see when it started and whom it served.
-- param component_kind text = null: auth, rate_limiter, router, scheduler, gateway or kv_transfer (null: all).
-- param bucket_s float = 10: Bucket width in seconds.
SELECT
    make_timestamp_ns(CAST(floor(start_ns / ($bucket_s * 1e9)) * ($bucket_s * 1e9) AS BIGINT)) AS bucket,
    component_kind,
    coalesce(instance, kv_link) AS instance,
    count(*) AS calls,
    round(quantile_cont(latency_ns, 0.5) / 1e6, 3) AS p50_ms,
    round(quantile_cont(latency_ns, 0.99) / 1e6, 3) AS p99_ms,
    count(*) FILTER (WHERE outcome <> 'ok') AS failures
FROM component_calls
WHERE ($component_kind IS NULL OR component_kind = $component_kind OR component = $component_kind)
GROUP BY ALL
ORDER BY bucket, component_kind, instance
