-- itl_stall_candidates (ClickHouse form of infertrace/analyzers/sql/itl_stall_candidates.sql, with the prompt
-- lengths of itl_request_tokens.sql it reads inline): every step of one engine's range
-- that may have stalled decoding requests, with its victims. Same columns, same rules, same order; read those files.
-- Parameters: {max_gap_steps}, {instance} (NULL: the steps without one), {first_step}, {last_step}.
-- {steps}, {step_membership}, {itl_token_gaps}, {requests}: the ClickHouse forms (relations/).
WITH
candidate AS (
    SELECT instance, model, policy, step_index, start_ns, end_ns, duration_ns, pause_ns, prefill_tokens,
           num_prefills, num_decodes, decode_context_tokens, trace_id, span_id, run_position
    FROM ({steps})
    WHERE (num_prefills > 0 OR pause_ns > 0)
      AND instance <=> {instance:Nullable(String)} AND step_index BETWEEN {first_step:Int64} AND {last_step:Int64}
),
membership AS (SELECT * FROM ({step_membership})),
gap AS (
    SELECT request_id, instance, first_step_index, prev_last_step_index, tokens_before, itl_ns,
           arrayJoin(range(greatest(prev_last_step_index + 1, {first_step:Int64}),
                           least(first_step_index, {last_step:Int64}) + 1)) AS step_index
    FROM ({itl_token_gaps})
    WHERE gap_steps <= {max_gap_steps:Int64} AND itl_ns IS NOT NULL AND instance <=> {instance:Nullable(String)}
      AND first_step_index >= {first_step:Int64} AND prev_last_step_index + 1 <= {last_step:Int64}
),
victim AS (
    SELECT gap.request_id AS request_id, gap.instance AS instance, gap.step_index AS step_index,
           coalesce(r.input_tokens, 0) + gap.tokens_before AS context_tokens, gap.itl_ns AS itl_ns
    FROM gap
    JOIN candidate c ON c.instance = gap.instance AND c.step_index = gap.step_index
    LEFT JOIN (SELECT request_id, input_tokens FROM ({requests})) r ON r.request_id = gap.request_id
),
in_run AS (
    SELECT m.request_id AS request_id, c.instance AS instance, c.step_index AS step_index,
           toInt64(0) AS context_tokens, c.duration_ns AS itl_ns
    FROM candidate c
    JOIN membership m ON m.trace_id = c.trace_id AND m.span_id = c.span_id AND m.role = 'decode'
    WHERE c.run_position > 0 AND m.instance <=> {instance:Nullable(String)}
      AND m.first_step_index <= {last_step:Int64}
),
grouped AS (
    SELECT instance, step_index, arraySort(groupArray((request_id, itl_ns))) AS pairs,
           toInt64(sum(context_tokens)) AS victim_context_tokens
    FROM (SELECT * FROM victim UNION ALL SELECT * FROM in_run)
    GROUP BY instance, step_index
)
SELECT c.instance AS instance, c.model AS model, c.policy AS policy, c.step_index AS step_index,
       c.start_ns AS start_ns, c.end_ns AS end_ns, c.duration_ns AS duration_ns, c.pause_ns AS pause_ns,
       c.prefill_tokens AS prefill_tokens, c.num_prefills AS num_prefills, c.num_decodes AS num_decodes,
       c.decode_context_tokens AS decode_context_tokens,
       arrayMap(x -> x.1, g.pairs) AS victims,
       coalesce(g.victim_context_tokens, 0) AS victim_context_tokens,
       arrayMap(x -> x.2, g.pairs) AS victim_itls_ns
FROM candidate c
LEFT JOIN grouped g ON g.instance = c.instance AND g.step_index = c.step_index
ORDER BY c.instance, c.step_index, c.trace_id, c.span_id
