"""Analysis results materialised in the store, like Prometheus recording rules: each analyzer's result over a
snapshot of the store is computed once (after `infertrace ingest`, and by `infertrace collect` once new
segments settle), written as derived Parquet under `DIR/derived/results/`, and read by the dashboard and the
report instead of running the analyzer again.

    from infertrace.results import materialize, result
    materialize(store)                        # every analysis of the snapshot, computed where missing
    itl = result(store, "itl")                # read back (computed and written when missing or stale)

A result is keyed by the segments it came from (their content-derived names) and by the version of the code
that computed it: a new segment, a compaction or a new analyzer version makes a new key, so a stale result is
never read. See `materialized.py` for the layout.
"""

from infertrace.results.materialized import ANALYSES, materialize, result, snapshot_key

__all__ = ["ANALYSES", "materialize", "result", "snapshot_key"]
