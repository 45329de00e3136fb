"""The trace store: raw spans as immutable Parquet segments, queried with DuckDB through typed relations."""

from pathlib import Path


def not_a_store(path: Path) -> str:
    """Why `path`, which is not a directory, cannot be opened as a store (a trace file is the usual mistake)."""
    if path.is_file():
        return f"a file, not a store directory (`infertrace ingest --store DIR {path}` reads it into one)"
    return "no such store directory"
