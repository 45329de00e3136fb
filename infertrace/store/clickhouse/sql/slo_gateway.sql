-- slo_gateway (ClickHouse form of infertrace/analyzers/slo.py's GATEWAY_SQL): per model, the requests the gateway
-- answered, its errors and its 429s.
--
-- Answers: the SLO summary's error and rejection rates.
-- Parameters: {since}, {until} (ns; NULL for no bound), {model}, {tenant} (NULL for all).
-- Columns: model, n, errors, rejected.
-- {component_calls}: the ClickHouse form of the relation (relations/).
SELECT model, toInt64(count()) AS n, toInt64(countIf(outcome = 'error')) AS errors,
       toInt64(countIf(http_status = 429)) AS rejected
FROM ({component_calls})
WHERE component = 'gateway' AND model IS NOT NULL
  AND ({since:Nullable(Int64)} IS NULL OR start_ns >= {since:Nullable(Int64)})
  AND ({until:Nullable(Int64)} IS NULL OR start_ns < {until:Nullable(Int64)})
  AND ({model:Nullable(String)} IS NULL OR model = {model:Nullable(String)})
  AND ({tenant:Nullable(String)} IS NULL OR tenant = {tenant:Nullable(String)})
GROUP BY model
ORDER BY model, n, errors, rejected
