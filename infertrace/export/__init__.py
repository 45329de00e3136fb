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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infertrace.store.store import Store

NO_STALL_INPUTS = ("the store has neither engine_step spans nor per-token times to find stalls in (vLLM exports "
                   "neither; `infertrace ingest --client-tokens` adds a streaming client's)")


def stall_source(store: Store) -> str:
    """Where the exports find ITL stalls on this store: 'steps' (engine_step spans: `analyzers.itl`), 'requests'
    (engines that time each token or a client's token times: `analyzers.itl_requests`, windows rather than steps),
    or '' (neither: `NO_STALL_INPUTS`)."""
    from infertrace.analyzers.itl_requests import token_source

    if store.sql("SELECT EXISTS (SELECT 1 FROM steps)").fetchall()[0][0]:
        return "steps"
    return "requests" if token_source(store) is not None else ""


def query_text(name: str) -> str:
    """The text of `infertrace/export/sql/<name>.sql` (header comment included)."""
    path = resources.files("infertrace.export").joinpath("sql", f"{name}.sql")
    if not path.is_file():
        raise KeyError(f"no export query named {name!r}")
    return path.read_text(encoding="utf-8")
