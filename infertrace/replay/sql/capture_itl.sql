-- capture_itl: every inter-token gap of the window's requests of a model, on the engines that decoded them.
--
-- Answers: the captured ITL distribution that a baseline replay must reproduce. Needs engine step spans
-- (the tokens relation); without them it is empty and the replay says ITL could not be compared.
-- Parameters: $model, $since_ns, $until_ns (the requests' arrival window).
-- Columns: itl_ns.
WITH window_requests AS (
    SELECT request_id FROM requests WHERE model = $model
    GROUP BY request_id
    HAVING min(arrival_ns) >= $since_ns AND min(arrival_ns) < $until_ns
)
SELECT t.itl_ns
FROM tokens t
JOIN window_requests w ON w.request_id = t.request_id
WHERE t.itl_ns IS NOT NULL
