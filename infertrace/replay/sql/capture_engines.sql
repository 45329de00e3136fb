-- capture_engines: the engine configuration of each instance serving a model, as its resource says.
--
-- Answers: how was the model deployed when the traffic was captured: replicas (or prefill and decode
-- workers), hardware and tensor-parallel degree, scheduling policy, token budget, sequence limit, chunked
-- prefill, prefix caching, prefill micro-batch, and the KV blocks each engine had (from its step spans).
-- Parameters: $model.
-- Columns: instance, role (engine, prefill_worker, decode_worker), hardware, tensor_parallel, policy,
--   max_num_batched_tokens, max_num_seqs, chunked_prefill, prefix_caching, prefill_microbatch, block_size,
--   executor, kv_total_blocks (NULL without step spans), step_spans.
WITH engine_spans AS (
    SELECT
        "res.service.instance.id" AS instance,
        "res.infertrace.component.kind" AS role,
        "res.infertrace.hardware" AS hardware,
        "res.infertrace.hardware.count" AS tensor_parallel,
        "res.infertrace.engine.policy" AS policy,
        "res.infertrace.engine.max_num_batched_tokens" AS max_num_batched_tokens,
        "res.infertrace.engine.max_num_seqs" AS max_num_seqs,
        "res.infertrace.engine.chunked_prefill" AS chunked_prefill,
        "res.infertrace.engine.prefix_caching" AS prefix_caching,
        "res.infertrace.engine.prefill_microbatch_tokens" AS prefill_microbatch,
        "res.infertrace.engine.block_size" AS block_size,
        "res.infertrace.engine.executor" AS executor,
        CASE WHEN name = 'engine_step' THEN "attr.infertrace.step.kv.total_blocks" END AS kv_total_blocks,
        name
    FROM spans
    WHERE name IN ('llm_request', 'engine_step')
      AND coalesce("res.infertrace.engine.model", "attr.gen_ai.response.model", "attr.gen_ai.request.model") = $model
)
SELECT
    instance,
    any_value(role) AS role,
    any_value(hardware) AS hardware,
    any_value(tensor_parallel) AS tensor_parallel,
    any_value(policy) AS policy,
    any_value(max_num_batched_tokens) AS max_num_batched_tokens,
    any_value(max_num_seqs) AS max_num_seqs,
    any_value(chunked_prefill) AS chunked_prefill,
    any_value(prefix_caching) AS prefix_caching,
    any_value(prefill_microbatch) AS prefill_microbatch,
    any_value(block_size) AS block_size,
    any_value(executor) AS executor,
    max(kv_total_blocks) AS kv_total_blocks,
    count(*) FILTER (WHERE name = 'engine_step') AS step_spans
FROM engine_spans
GROUP BY instance
ORDER BY instance
