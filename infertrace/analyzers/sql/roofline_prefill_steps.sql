-- roofline_prefill_steps: per engine, the prefill-only steps the roofline analyzer measures (no decode in the
-- step, no host pause), the offloaded-expert evidence those steps' spans carry, and the engine's KV pool use.
--
-- Answers: how fast does each engine prefill, what does its configuration say (tensor parallel degree,
-- micro-batch, expert layers in host memory, step budget), and how much of its prefill time went to copying
-- experts over the host link or computing them on the host CPU. The KV pool's peak use against its size is how
-- much device memory could take expert layers back.
-- Parameters: none.
-- Columns: instance, model, hardware, tp, microbatch_tokens, cpu_moe_layers (0: none), max_num_batched_tokens,
--   block_size, kv_peak_blocks (most blocks held at the end of any span), kv_total_blocks, tokens (list, per
--   prefill-only step), durations_ns (list), host_link_bytes, transfer_ns, host_compute_ns (sums over those
--   steps; null when the engine reports no offloaded experts).
WITH engine AS (
    SELECT
        "res.service.instance.id" AS instance,
        any_value("res.infertrace.hardware.count") AS tp,
        any_value("res.infertrace.engine.prefill_microbatch_tokens") AS microbatch_tokens,
        any_value("res.infertrace.engine.cpu_moe_layers") AS cpu_moe_layers,
        any_value("res.infertrace.engine.max_num_batched_tokens") AS max_num_batched_tokens,
        any_value("res.infertrace.engine.block_size") AS block_size,
        max("attr.infertrace.step.kv.used_blocks") AS kv_peak_blocks,
        max("attr.infertrace.step.kv.total_blocks") AS kv_total_blocks
    FROM spans
    WHERE name = 'engine_step'
    GROUP BY 1
),
prefill AS (
    SELECT
        "res.service.instance.id" AS instance,
        any_value("res.infertrace.engine.model") AS model,
        any_value("res.infertrace.hardware") AS hardware,
        list("attr.infertrace.step.prefill_tokens" ORDER BY start_ns) AS tokens,
        list("attr.infertrace.step.durations_ns"[1] ORDER BY start_ns) AS durations_ns,
        sum("attr.infertrace.step.offload.host_link_bytes") AS host_link_bytes,
        sum("attr.infertrace.step.offload.transfer_ns") AS transfer_ns,
        sum("attr.infertrace.step.offload.host_compute_ns") AS host_compute_ns
    FROM spans
    WHERE name = 'engine_step'
      AND coalesce("attr.infertrace.step.decode_tokens", 0) = 0
      AND coalesce("attr.infertrace.step.prefill_tokens", 0) > 0
      AND coalesce("attr.infertrace.step.pause_ns", 0) = 0
    GROUP BY 1
)
SELECT
    p.instance, p.model, p.hardware, coalesce(e.tp, 1) AS tp, coalesce(e.microbatch_tokens, 0) AS microbatch_tokens,
    coalesce(e.cpu_moe_layers, 0) AS cpu_moe_layers, e.max_num_batched_tokens, e.block_size, e.kv_peak_blocks,
    e.kv_total_blocks, p.tokens, p.durations_ns, p.host_link_bytes, p.transfer_ns, p.host_compute_ns
FROM prefill p
JOIN engine e USING (instance)
ORDER BY p.instance
