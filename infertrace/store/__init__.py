"""The trace store: raw spans as immutable Parquet segments, queried with DuckDB through typed relations."""
