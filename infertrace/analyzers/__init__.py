"""Analyzers: pure functions from a store to frozen dataclass results that carry their evidence numbers.

Each analyzer reads the store's derived relations (and the `.sql` files in `infertrace/analyzers/sql/`,
loaded with `query_text` and always run with bound parameters); the report, the CLI and the dashboard only
render what they return.

- `itl.analyze_itl`: ITL spikes attributed to the prefills (or host pauses, or preemption recomputes) in
  the steps between two tokens, from `engine_step` spans.
- `itl_requests.attribute_from_requests`: the same question from request-level spans only (vLLM's
  `llm_request`) and per-token times (a client's, or SGLang's and TGI's token spans): stall windows.
- `itl_iterations.attribute_iterations`: the same from vLLM's iteration log, placed on the spans' clock.
- `ttft.analyze_ttft`: TTFT decomposed into gateway, queue, prefill (own compute and waiting behind other
  prefills) and KV transfer; a fit of prefill time against prompt length per engine.
- `prefix_cache.analyze_prefix_cache`: prefix-cache hit rates, cache-busting tenants, billed-token savings.
- `roofline.analyze_prefill_roofline`: prefill throughput against the hardware roofline.
- `disaggregation.analyze_disaggregation`: prefill/decode disaggregated models (KV transfer, unmatched legs) and
  the TTFT a GPU prefill host would give an engine on a CPU-only host (part of the TTFT analysis).
- `pools.pools`: each disaggregated model's prefill and decode pools, as root-cause candidates.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infertrace.store.store import Store


def query_text(name: str) -> str:
    """The text of `infertrace/analyzers/sql/<name>.sql` (header comment included)."""
    path = resources.files("infertrace.analyzers").joinpath("sql", f"{name}.sql")
    if not path.is_file():
        raise KeyError(f"no analyzer query named {name!r}")
    return path.read_text(encoding="utf-8")


def materialize_once(store: Store, names: tuple[str, ...]) -> None:
    """Computes the named derived relations into temporary tables of the store's connection, unless they
    already are, or are read from the snapshot's materialised Parquet (`infertrace.results.relations.attach`:
    scanning those files is as cheap as the copy would be): several analyzers over one snapshot then read each
    relation once."""
    from infertrace.store.store import READS

    done = {row[0] for row in store.con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()}
    done |= {f"{row[0]}_m" for row in store.con.execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal AND sql LIKE '%AS SELECT * FROM read_parquet(%'"
    ).fetchall()}
    wanted = dict.fromkeys(r for n in names for r in (*READS.get(n, ()), n))  # what they read first
    missing = tuple(n for n in wanted if f"{n}_m" not in done)
    if missing:
        store.materialize(missing)
