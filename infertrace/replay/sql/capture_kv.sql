-- capture_kv: KV-cache use of a model's engines in a window, one row per step span.
--
-- Answers: how full was the KV cache (used / total blocks at the end of each step span), for comparing a
-- replay's KV use with the capture's.
-- Parameters: $model, $since_ns, $until_ns (step span start).
-- Columns: used_fraction.
SELECT "attr.infertrace.step.kv.used_blocks" / "attr.infertrace.step.kv.total_blocks" AS used_fraction
FROM spans
WHERE name = 'engine_step' AND "res.infertrace.engine.model" = $model
  AND "attr.infertrace.step.kv.total_blocks" > 0
  AND start_ns >= $since_ns AND start_ns < $until_ns
