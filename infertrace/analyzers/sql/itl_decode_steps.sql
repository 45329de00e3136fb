-- itl_decode_steps: the first step of every run of decode-only steps (no prefill, no pause, no
-- preemption): the engine's own decode step time at a given batch size and context.
--
-- Answers: what a step costs an engine when nothing stalls it. The ITL analyzer fits
-- duration ≈ a + b·num_decodes + c·decode_context_tokens per engine to these rows and scales the fit by
-- the nearest of them in time (an engine that slowed down as a whole is not a spike).
-- Parameters: none.
-- Columns: instance, end_ns, num_decodes, decode_context_tokens, duration_ns.
SELECT instance, end_ns, num_decodes, decode_context_tokens, duration_ns
FROM steps
WHERE num_prefills = 0 AND pause_ns = 0 AND num_preempted = 0 AND num_decodes > 0 AND run_position = 0
ORDER BY instance, end_ns, duration_ns, num_decodes, decode_context_tokens
