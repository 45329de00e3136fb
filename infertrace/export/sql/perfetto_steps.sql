-- perfetto_steps: the engine steps a Perfetto export draws, one row per step, in time order per engine.
--
-- Answers: when each step of each engine ran, what it computed and how full the engine was, for the
-- steps track and the load counters (running, waiting, KV blocks in use) of each engine in the export.
-- Parameters: $since, $until (ns; NULL: unbounded; a step is kept when it ends in [since, until)),
--   $instances (list of engine instances; NULL: all).
SELECT instance, model, step_index, start_ns, end_ns, prefill_tokens, decode_tokens, num_prefills, num_decodes,
       running, waiting, kv_used_blocks, kv_total_blocks, num_preempted, pause_ns
FROM steps
WHERE ($since IS NULL OR end_ns >= $since) AND ($until IS NULL OR end_ns < $until)
  AND ($instances IS NULL OR list_contains($instances, instance))
ORDER BY instance, start_ns, step_index
