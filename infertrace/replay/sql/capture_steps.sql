-- capture_steps: a model's engine step spans in a window, as measured steps for calibrating the cost model.
--
-- Answers: what did each step compute (prefill chunks: new and already-cached tokens; decodes and their summed
-- context) and how long did it take: the engine's own measurements, which `infertrace replay --calibrate` fits
-- the cost model to. A span of a run of decode steps gives every step (each one's context one token longer per
-- decode); steps a host pause fell in are left out (their time is not the batch's cost).
-- Parameters: $model, $since_ns, $until_ns (span start).
-- Columns: hardware, tensor_parallel, chunk_tokens (int[]), computed_tokens (int[]), samples_token (bool[]),
--   num_decodes, decode_context_tokens (at the span's first step), durations_ns (int[]), pause_ns.
SELECT
    "res.infertrace.hardware" AS hardware,
    "res.infertrace.hardware.count" AS tensor_parallel,
    coalesce("attr.infertrace.step.prefill.chunk_tokens", []) AS chunk_tokens,
    coalesce("attr.infertrace.step.prefill.computed_tokens", []) AS computed_tokens,
    coalesce("attr.infertrace.step.prefill.samples_token", []) AS samples_token,
    coalesce(len("attr.infertrace.step.decode.request_ids"), 0) AS num_decodes,
    coalesce("attr.infertrace.step.decode.context_tokens", 0) AS decode_context_tokens,
    "attr.infertrace.step.durations_ns" AS durations_ns,
    coalesce("attr.infertrace.step.pause_ns", 0) AS pause_ns
FROM spans
WHERE name = 'engine_step' AND "res.infertrace.engine.model" = $model
  AND "res.infertrace.component.kind" IS DISTINCT FROM 'decode_worker'
  AND start_ns >= $since_ns AND start_ns < $until_ns
ORDER BY start_ns
