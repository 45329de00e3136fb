-- title: Share of TTFT spent moving the KV cache
-- question: For each disaggregated model, what share of the client's time to first token went to the KV
--   transfer (and to the decode worker's queue and first decode), at the median request and over all
--   requests, and how many requests could not be analysed because their legs did not match?
-- when: Deciding whether disaggregation pays for a model, or whether its link is the bottleneck of TTFT.
-- param since time = null: Window start (arrival at the first engine).
-- param until time = null: Window end (exclusive).
-- needs requests WHERE serving = 'disaggregated': requests served by a prefill and a decode engine
--   (prefill/decode disaggregation)
SELECT
    model,
    count(*) FILTER (WHERE leg_problem IS NULL) AS requests,
    count(*) FILTER (WHERE leg_problem IS NOT NULL) AS unmatched,
    any_value(leg_problem) FILTER (WHERE leg_problem IS NOT NULL) AS unmatched_why,
    round(quantile_cont(client_ttft_ns, 0.5) FILTER (WHERE leg_problem IS NULL) / 1e6, 3) AS ttft_p50_ms,
    round(quantile_cont(kv_transfer_ns, 0.5) / 1e6, 3) AS kv_transfer_p50_ms,
    round(quantile_cont(kv_transfer_ns / client_ttft_ns, 0.5), 4) AS kv_share_p50,
    round(sum(kv_transfer_ns) / nullif(sum(client_ttft_ns) FILTER (WHERE kv_transfer_ns IS NOT NULL), 0), 4)
        AS kv_share_of_total,
    round(sum(decode_queue_ns + first_decode_ns)
          / nullif(sum(client_ttft_ns) FILTER (WHERE kv_transfer_ns IS NOT NULL), 0), 4) AS decode_side_share
FROM requests
WHERE serving = 'disaggregated' AND outcome = 'ok'
  AND ($since IS NULL OR arrival_ns >= $since) AND ($until IS NULL OR arrival_ns < $until)
GROUP BY model
ORDER BY kv_share_of_total DESC NULLS LAST
