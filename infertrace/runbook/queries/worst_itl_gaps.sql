-- title: Worst inter-token gaps and the prefills between them
-- question: Which tokens waited longest for their predecessor in a window, and which prefills ran in the
--   engine steps between the two tokens (the likely culprits)?
-- when: ITL p99 jumped; you want the individual spikes and who caused them before opening the dashboard.
-- param since time = null: Window start (token time).
-- param until time = null: Window end (exclusive).
-- param model text = null: Only this model's engines.
-- param top int = 20: How many gaps.
-- example: top=10
-- Engines without step spans that time each token (SGLang, TGI) have gaps but no steps to find culprits in: their
-- prefill columns are empty (0 and NULL); the model then comes from the engine's request spans.
WITH engine AS (
    SELECT instance, arg_min(model, from_legs) AS model
    FROM (SELECT DISTINCT instance, model, false AS from_legs FROM steps
          UNION ALL
          SELECT DISTINCT instance, model, true FROM request_legs WHERE instance IS NOT NULL)
    GROUP BY instance
),
gap AS (
    SELECT t.request_id, t.instance, e.model, t.token_index, t.time_ns, t.itl_ns, t.time_ns - t.itl_ns AS previous_ns
    FROM tokens t JOIN engine e ON e.instance = t.instance
    WHERE t.itl_ns IS NOT NULL
      AND ($since IS NULL OR t.time_ns >= $since)
      AND ($until IS NULL OR t.time_ns < $until)
      AND ($model IS NULL OR e.model = $model)
    ORDER BY t.itl_ns DESC, t.request_id, t.token_index
    LIMIT $top
),
culprit AS (
    SELECT g.request_id, g.token_index, m.request_id AS prefill_request_id, m.chunk_tokens
    FROM gap g
    JOIN steps st ON st.instance = g.instance AND st.end_ns > g.previous_ns AND st.end_ns <= g.time_ns
    JOIN step_membership m ON m.trace_id = st.trace_id AND m.span_id = st.span_id AND m.role = 'prefill'
    WHERE m.request_id <> g.request_id
)
SELECT
    make_timestamp_ns(g.time_ns) AS token_time,
    g.model,
    g.instance,
    g.request_id,
    g.token_index,
    round(g.itl_ns / 1e6, 3) AS itl_ms,
    count(c.prefill_request_id) AS prefills_between,
    coalesce(sum(c.chunk_tokens), 0) AS prefill_tokens_between,
    arg_max(c.prefill_request_id, c.chunk_tokens) AS largest_prefill_request_id,
    max(c.chunk_tokens) AS largest_chunk_tokens
FROM gap g
LEFT JOIN culprit c ON c.request_id = g.request_id AND c.token_index = g.token_index
GROUP BY ALL
ORDER BY itl_ms DESC, g.request_id, g.token_index
