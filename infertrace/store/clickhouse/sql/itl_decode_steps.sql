-- itl_decode_steps (ClickHouse form of infertrace/analyzers/sql/itl_decode_steps.sql): the first step of every
-- run of decode-only steps (no prefill, no pause, no preemption), over the window's engine step spans.
--
-- Answers: what a step costs an engine when nothing stalls it (the ITL analyzer's decode-step fit).
-- Parameters: none. {step_spans}: pushdown.step_spans_sql.
-- Columns: instance, end_ns, num_decodes, decode_context_tokens, duration_ns.
-- A span's first step is its run position 0: it ends at the span's start plus its first duration; the host
-- pause is on a span's last step, so it counts here only for a one-step span.
SELECT instance, first_step_end_ns AS end_ns, num_decodes, context_tokens AS decode_context_tokens,
       durations[1] AS duration_ns
FROM ({step_spans})
WHERE length(durations) > 0 AND num_prefills = 0 AND if(length(durations) = 1, pause_ns, 0) = 0
  AND num_preempted = 0 AND num_decodes > 0
ORDER BY instance, end_ns, duration_ns, num_decodes, decode_context_tokens
