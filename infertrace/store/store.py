"""A store directory opened for queries: DuckDB views over the Parquet segments and the derived relations.

    store = Store.open("traces/")
    store.sql("SELECT model, quantile_cont(ttft_ns, 0.99) FROM requests GROUP BY model").fetchall()
    store.relation("tokens").df()

The connection is in memory and private to the reader: it holds no lock on the store, so any number of
readers work while a collector or `infertrace ingest` writes. A reader sees the segments that existed when
it opened (or last called `refresh()`): one consistent snapshot for all its queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import pyarrow as pa

from infertrace.store.schema import base_schema
from infertrace.store.segments import list_segments

# Derived relations, in dependency order; each is `relations/<name>.sql`.
RELATIONS: tuple[str, ...] = ("requests", "steps", "step_membership", "tokens", "component_calls")


def relation_sql(name: str) -> str:
    """The SELECT (with its header comment) that defines a derived relation."""
    if name not in RELATIONS:
        raise KeyError(f"unknown relation {name!r}; known: {', '.join(RELATIONS)}")
    return resources.files("infertrace.store").joinpath("relations", f"{name}.sql").read_text(encoding="utf-8")


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class Store:
    """Read side of a store directory. Views: `spans_raw` (every stored span row), `spans` (each span once),
    and the derived relations in `RELATIONS`."""

    def __init__(self, root: Path, con: duckdb.DuckDBPyConnection) -> None:
        self.root = root
        self.con = con
        self.segments: list[Path] = []
        self.duplicate_rows = 0
        self.refresh()

    @classmethod
    def open(cls, root: str | Path, threads: int | None = None) -> Store:
        """Opens a store directory for reading. Raises FileNotFoundError when it does not exist."""
        path = Path(root)
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no such store directory")
        con = duckdb.connect(":memory:")
        con.execute("SET enable_progress_bar = false")
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        return cls(path, con)

    def refresh(self) -> None:
        """Takes a new snapshot: the segments written since are included from now on."""
        self.segments = list_segments(self.root)
        con = self.con
        if self.segments:
            files = ", ".join(_sql_string(str(p)) for p in self.segments)
            con.execute(f"CREATE OR REPLACE VIEW spans_raw AS SELECT * FROM read_parquet([{files}], "
                        f"union_by_name = true, hive_partitioning = false)")
        else:
            empty = pa.table({f.name: pa.array([], type=f.type) for f in base_schema()})
            con.register("_empty_spans", empty)
            con.execute("CREATE OR REPLACE VIEW spans_raw AS SELECT * FROM _empty_spans")
        total, distinct = con.execute(
            "SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans_raw").fetchone() or (0, 0)
        self.duplicate_rows = total - distinct
        if self.duplicate_rows:
            # The same span written twice in different batches (e.g. a file ingested and also received by
            # the collector): keep one copy.
            con.execute("CREATE OR REPLACE VIEW spans AS SELECT * FROM spans_raw "
                        "QUALIFY row_number() OVER (PARTITION BY trace_id, span_id) = 1")
        else:
            con.execute("CREATE OR REPLACE VIEW spans AS SELECT * FROM spans_raw")
        for name in RELATIONS:
            con.execute(f"CREATE OR REPLACE VIEW {name} AS {relation_sql(name)}")

    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> duckdb.DuckDBPyRelation:
        """Runs a query over the views; values are bound as parameters, never formatted into the SQL."""
        if params is None:
            return self.con.sql(query)
        return self.con.sql(query, params=params)

    def relation(self, name: str) -> duckdb.DuckDBPyRelation:
        """A derived relation (or `spans`, `spans_raw`) as a DuckDB relation."""
        if name not in (*RELATIONS, "spans", "spans_raw"):
            raise KeyError(f"unknown relation {name!r}; known: spans, spans_raw, {', '.join(RELATIONS)}")
        return self.con.table(name)

    def materialize(self, names: Sequence[str] = RELATIONS) -> None:
        """Computes relations once into temporary tables of this connection (faster repeated queries on a
        fixed snapshot; `refresh()` turns them back into views)."""
        for name in names:
            self.relation(name)
            self.con.execute(f"CREATE OR REPLACE TEMP TABLE {name}_m AS SELECT * FROM {name}")
            self.con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {name}_m")

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
