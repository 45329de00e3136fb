-- selection_values: every model and tenant the store knows, from the engines' requests and the gateways' calls.
--
-- Answers: what can `--model` and `--tenant` select? A value that matches nothing is an error, answered with
-- these (and the closest ones).
-- Parameters: none.
-- Columns: what ('model' | 'tenant'), value.
SELECT DISTINCT 'model' AS what, model AS value FROM requests WHERE model IS NOT NULL
UNION
SELECT DISTINCT 'model', model FROM component_calls WHERE model IS NOT NULL
UNION
SELECT DISTINCT 'tenant', tenant FROM requests WHERE tenant IS NOT NULL
UNION
SELECT DISTINCT 'tenant', tenant FROM component_calls WHERE tenant IS NOT NULL
ORDER BY what, value
