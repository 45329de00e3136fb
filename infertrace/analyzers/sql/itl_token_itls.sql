-- itl_token_itls: every inter-token latency of every request, with how many tokens had it, per engine,
-- without expanding tokens: the first token of a decode run waited for its gap (`itl_token_gaps`); every
-- later token of the run waited for exactly one decode step, so all the run's decodes share that ITL.
--
-- Answers: the ITL distribution (p50, p99) of each engine, cheaply.
-- Parameters: none.
-- Columns: instance, itl_ns, tokens (how many tokens had this ITL).
SELECT s_to.instance, s_to.end_ns - s_from.end_ns AS itl_ns, 1::BIGINT AS tokens
FROM itl_token_gaps g
JOIN steps s_to ON s_to.instance = g.instance AND s_to.step_index = g.first_step_index
JOIN steps s_from ON s_from.instance = g.instance AND s_from.step_index = g.prev_last_step_index
UNION ALL
SELECT instance, duration_ns, num_decodes::BIGINT
FROM steps
WHERE run_position > 0
