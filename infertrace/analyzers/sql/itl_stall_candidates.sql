-- itl_stall_candidates: every engine step that may have stalled decoding requests (it computed a prefill
-- chunk, or the host paused inside it), with its victims: the requests whose gap between two tokens
-- contains the step (`itl_token_gaps`).
--
-- A step inside a run of decode steps (a host pause ends a run at the step it fell in) also stalls the
-- run's own decodes, whose previous token came at the end of the step before.
-- Answers: for each such step, how long it took, what it computed, who waited for it and with how much
-- context (the victims' decode-only step cost depends on their number and summed context).
-- Parameters: $max_gap_steps: gaps longer than this many steps are not expanded (a request that waits
--   that long between two tokens is not being stalled by single steps); $instance, $first_step, $last_step:
--   the engine and the range of its step indexes (inclusive) whose steps are returned (`itl_stall_partitions`);
--   a gap reaching past the range contributes only its steps inside it, so each step gets the same victims
--   whichever range it is read in.
-- Columns: instance, model, policy, step_index, start_ns, end_ns, duration_ns, pause_ns, prefill_tokens,
--   num_prefills, num_decodes, decode_context_tokens, victims (list of request ids), victim_context_tokens
--   (sum of the victims' context: prompt plus tokens received so far), victim_itls_ns (each victim's ITL
--   across the step, in the order of `victims`).
WITH candidate AS (
    SELECT instance, model, policy, step_index, start_ns, end_ns, duration_ns, pause_ns, prefill_tokens,
           num_prefills, num_decodes, decode_context_tokens, trace_id, span_id, run_position
    FROM steps
    WHERE (num_prefills > 0 OR pause_ns > 0)
      AND instance IS NOT DISTINCT FROM $instance AND step_index BETWEEN $first_step AND $last_step
),
gap AS (
    SELECT g.request_id, g.instance, g.first_step_index, g.prev_last_step_index, g.tokens_before, g.itl_ns,
           unnest(range(greatest(g.prev_last_step_index + 1, $first_step),
                        least(g.first_step_index, $last_step) + 1)) AS step_index
    FROM itl_token_gaps g
    WHERE g.gap_steps <= $max_gap_steps AND g.itl_ns IS NOT NULL AND g.instance IS NOT DISTINCT FROM $instance
      AND g.first_step_index >= $first_step AND g.prev_last_step_index + 1 <= $last_step
),
victim AS (
    SELECT gap.*, r.input_tokens
    FROM gap
    JOIN candidate c ON c.instance = gap.instance AND c.step_index = gap.step_index
    LEFT JOIN itl_request_tokens r ON r.request_id = gap.request_id
),
in_run AS (
    SELECT m.request_id, c.instance, c.step_index, 0::BIGINT AS context_tokens, c.duration_ns AS itl_ns
    FROM candidate c
    JOIN step_membership m ON m.trace_id = c.trace_id AND m.span_id = c.span_id AND m.role = 'decode'
    WHERE c.run_position > 0 AND m.instance IS NOT DISTINCT FROM $instance AND m.first_step_index <= $last_step
),
every_victim AS (
    SELECT request_id, instance, step_index, coalesce(input_tokens, 0) + tokens_before AS context_tokens, itl_ns
    FROM victim
    UNION ALL
    SELECT * FROM in_run
),
grouped AS (
    -- Sorting each step's (victim, ITL) pairs once after a plain list() is several times cheaper than two
    -- list(… ORDER BY request_id) aggregates; a request is a victim of a step at most once.
    SELECT instance, step_index,
           list_sort(list(struct_pack(request_id := request_id, itl_ns := itl_ns))) AS pairs,
           sum(context_tokens)::BIGINT AS victim_context_tokens
    FROM every_victim
    GROUP BY instance, step_index
)
SELECT c.* EXCLUDE (trace_id, span_id, run_position),
       coalesce(list_transform(g.pairs, lambda x: x.request_id), []::VARCHAR[]) AS victims,
       coalesce(g.victim_context_tokens, 0) AS victim_context_tokens,
       coalesce(list_transform(g.pairs, lambda x: x.itl_ns), []::BIGINT[]) AS victim_itls_ns
FROM candidate c
LEFT JOIN grouped g ON g.instance = c.instance AND g.step_index = c.step_index
ORDER BY c.instance, c.step_index, c.trace_id, c.span_id
