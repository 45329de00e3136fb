-- itl_request_prompts (ClickHouse form of infertrace/analyzers/itl.py's ITL_REQUEST_PROMPTS_SQL): the prompt length
-- and prefix-cache hit of given requests (the stalls' culprits), from `requests` (as itl_request_tokens.sql).
-- Parameters: {ids}: request ids. Columns: request_id, input_tokens, cached_tokens.
-- {requests}: the ClickHouse form of the relation (relations/).
SELECT request_id, input_tokens, cached_tokens
FROM ({requests})
-- IN a set of the ids: `has` on the list scans the whole list for each row (over 10 min at 10M spans)
WHERE request_id IN (SELECT arrayJoin({ids:Array(String)}))
ORDER BY request_id, input_tokens, cached_tokens
