-- perfetto_requests: the engine requests a Perfetto export draws as async slices, with their phases.
--
-- Answers: when each request arrived at its engine, was first scheduled, got its first token and finished,
-- and its KV transfer time, for the request lanes of each engine in the export.
-- Parameters: $since, $until (ns; NULL: unbounded; a request is kept when it overlaps [since, until)),
--   $instances (list of engine instances; NULL: all).
SELECT request_id, instance, model, tenant, arrival_ns, scheduled_ns, first_token_ns, finish_ns,
       input_tokens, output_tokens, cached_tokens, preemptions, outcome
FROM request_legs
WHERE arrival_ns IS NOT NULL AND finish_ns IS NOT NULL AND instance IS NOT NULL
  AND ($since IS NULL OR finish_ns >= $since) AND ($until IS NULL OR arrival_ns < $until)
  AND ($instances IS NULL OR list_contains($instances, instance))
ORDER BY instance, arrival_ns, request_id
