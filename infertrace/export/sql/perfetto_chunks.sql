-- perfetto_chunks: every prefill chunk a Perfetto export draws inside its request's prefill phase.
--
-- Answers: in which step (start, end) each request computed each chunk of its prompt, how many tokens it
-- computed and how many were already cached.
-- Parameters: $since, $until (ns; NULL: unbounded; a chunk is kept when its step ends in [since, until)),
--   $instances (list of engine instances; NULL: all).
SELECT request_id, instance, start_ns, end_ns, chunk_tokens, computed_tokens
FROM step_membership
WHERE role = 'prefill'
  AND ($since IS NULL OR end_ns >= $since) AND ($until IS NULL OR end_ns < $until)
  AND ($instances IS NULL OR list_contains($instances, instance))
ORDER BY instance, request_id, start_ns
