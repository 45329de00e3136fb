-- itl_token_itls: every inter-token latency of every request, with how many tokens had it, per engine,
-- without expanding tokens: the first token of a decode run waited for its gap (`itl_token_gaps`, which
-- carries that ITL); every later token of the run waited for exactly one decode step, so all the run's
-- decodes share that ITL.
--
-- Answers: the ITL distribution (p50, p99) of each engine, cheaply.
-- Parameters: none.
-- Columns: instance, itl_ns, tokens (how many tokens had this ITL).
SELECT instance, itl_ns, 1::BIGINT AS tokens
FROM itl_token_gaps
WHERE itl_ns IS NOT NULL
UNION ALL
SELECT instance, duration_ns, num_decodes::BIGINT
FROM steps
WHERE run_position > 0
