-- otlp_spans: the stored spans an OTLP export writes, each once, every column.
--
-- Answers: which spans overlap the window (start before $until, end at or after $since; NULL: unbounded),
-- with their fixed fields and every attribute column, for `infertrace export --format otlp`.
SELECT *
FROM spans
WHERE ($since IS NULL OR end_ns >= $since) AND ($until IS NULL OR start_ns < $until)
