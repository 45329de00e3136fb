"""What leaves infertrace for the tools people already have:

- `perfetto.write_perfetto`: a Perfetto trace (protobuf, opens in ui.perfetto.dev and the trace processor) of
  each engine's steps, its requests as async slices with their phases and prefill chunks, load counters, and
  every ITL stall as flows from the culprit prefill to its victims;
- `otlp.write_otlp`: the stored spans as OTLP JSON lines (what `infertrace ingest` and the Collector's file
  receiver read), for another backend;
- `metrics.derived_metrics`: TTFT/ITL histograms, stall counts by culprit tenant and prefix-cache hit rates in
  Prometheus' exposition format, under vLLM's metric names where vLLM has one.

Each reads the store (and the analyzers' results) and renders; none computes an analysis of its own.
"""

from __future__ import annotations

from importlib import resources


def query_text(name: str) -> str:
    """The text of `infertrace/export/sql/<name>.sql` (header comment included)."""
    path = resources.files("infertrace.export").joinpath("sql", f"{name}.sql")
    if not path.is_file():
        raise KeyError(f"no export query named {name!r}")
    return path.read_text(encoding="utf-8")
