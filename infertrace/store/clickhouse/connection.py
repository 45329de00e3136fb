"""Where the spans are: a ClickHouse server (clickhouse-connect over HTTP) or ClickHouse's engine in-process
(chdb), behind the three calls the store needs.

    clickhouse://USER@HOST:8123/DB     a server over HTTP; clickhouses://… over HTTPS
    chdb://PATH[?database=DB]          ClickHouse in this process, its data in directory PATH (tests, a laptop);
                                       one PATH per process (chdb's embedded server), any number of databases

A password never goes in the URL (it would be visible in `ps` and shell history): it is read from
`$INFERTRACE_CLICKHOUSE_PASSWORD`, or from the first line of the file `$INFERTRACE_CLICKHOUSE_PASSWORD_FILE`
names. A URL with a password is refused.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow as pa

PASSWORD_ENV: Final = "INFERTRACE_CLICKHOUSE_PASSWORD"
PASSWORD_FILE_ENV: Final = "INFERTRACE_CLICKHOUSE_PASSWORD_FILE"
SCHEMES: Final = ("clickhouse", "clickhouses", "chdb")
_DATABASE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_clickhouse_url(spec: str | Path) -> bool:
    """True when a `--store`/`--to`/`--from` value names ClickHouse rather than a store directory."""
    return isinstance(spec, str) and spec.split("://", 1)[0] in SCHEMES and "://" in spec


@dataclass(frozen=True)
class Target:
    """A parsed ClickHouse URL (never holds the password)."""

    scheme: str
    host: str
    port: int
    user: str
    database: str
    path: str  # chdb's data directory

    @property
    def table(self) -> str:
        return f"{self.database}.otel_traces"

    def __str__(self) -> str:
        if self.scheme == "chdb":
            return f"chdb://{self.path}" + (f"?database={self.database}" if self.database != "default" else "")
        return f"{self.scheme}://{self.user}@{self.host}:{self.port}/{self.database}"


def parse_url(url: str) -> Target:
    """Raises ValueError naming the URL and what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"{url!r}: expected clickhouse://USER@HOST:PORT/DB, clickhouses://… or chdb://PATH")
    if parts.password is not None:
        raise ValueError(f"{parts.scheme}://…: a password in the URL would show in `ps` and shell history; set "
                         f"${PASSWORD_ENV} or ${PASSWORD_FILE_ENV} instead")
    if parts.scheme == "chdb":
        path = unquote(parts.netloc + parts.path)
        if not path:
            raise ValueError(f"{url!r}: chdb://PATH needs the directory of its data")
        database = parse_qs(parts.query).get("database", ["default"])[-1]
        if not _DATABASE.fullmatch(database):
            raise ValueError(f"{url!r}: database {database!r} is not a plain ClickHouse name")
        return Target("chdb", "", 0, "default", database, path)
    database = parts.path.strip("/") or "default"
    if not _DATABASE.fullmatch(database):
        raise ValueError(f"{url!r}: database {database!r} is not a plain ClickHouse name")
    if not parts.hostname:
        raise ValueError(f"{url!r}: no host")
    try:
        port = parts.port or (8443 if parts.scheme == "clickhouses" else 8123)
    except ValueError as e:
        raise ValueError(f"{url!r}: {e}") from None
    return Target(parts.scheme, parts.hostname, port, unquote(parts.username or "default"), database, "")


def password_from_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The password from the environment (empty when none is set). Raises ValueError for an unreadable file."""
    if environ.get(PASSWORD_ENV):
        return environ[PASSWORD_ENV]
    path = environ.get(PASSWORD_FILE_ENV)
    if not path:
        return ""
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()[0] if Path(path).stat().st_size else ""
    except (OSError, IndexError) as e:
        raise ValueError(f"${PASSWORD_FILE_ENV}={path}: {e}") from None


class ClickHouseError(OSError):
    """ClickHouse (a server, or chdb) refused or failed a call: the message names the target and the first line
    of ClickHouse's own error."""

    def __init__(self, target: Target, error: BaseException) -> None:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        super().__init__(f"{target}: {type(error).__name__}: {first}")


@contextlib.contextmanager
def _reported(target: Target) -> Iterator[None]:
    try:
        yield
    except ClickHouseError:
        raise
    except Exception as e:  # clickhouse-connect's and chdb's own exception types
        raise ClickHouseError(target, e) from e


class Connection(Protocol):
    """What the store needs from ClickHouse: run a statement, read a query's rows as Arrow (parameters bound
    server-side, `{name:Type}`), insert Arrow rows into a table."""

    target: Target

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None: ...

    def query_arrow(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table: ...

    def query_arrow_batches(self, sql: str, params: dict[str, Any] | None = None,
                            rows_per_batch: int = 1_000_000) -> Iterator[pa.Table]:
        """The result streamed: tables of at most about `rows_per_batch` rows, never the whole result at once."""
        ...

    def insert_arrow(self, table: str, rows: pa.Table) -> None: ...

    def close(self) -> None: ...


# Settings of every query: exact values back (ClickHouse's default float parser may miss the last bit), and NULL
# for the columns of an outer join's missing side, as SQL (and DuckDB) has it, not the type's default.
READ_SETTINGS: Final = {"precise_float_parsing": 1, "join_use_nulls": 1}
SETTINGS_CLAUSE: Final = " SETTINGS " + ", ".join(f"{k} = {v}" for k, v in READ_SETTINGS.items())  # chdb: per query


# chdb runs one embedded server per process, on one data directory: connections to it share its session.
_CHDB: dict[str, Any] = {"path": None, "session": None, "users": 0}


def _chdb_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """Bound parameters as chdb takes them: a NULL as ClickHouse's text for it (`\\N`) and a list as an array
    literal, as clickhouse-connect sends them to a server."""
    return {k: "\\N" if v is None else _array_text(v) if isinstance(v, list | tuple) else v
            for k, v in (params or {}).items()}


def _array_text(values: list[Any] | tuple[Any, ...]) -> str:
    def item(v: Any) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, str):
            return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return str(int(v)) if isinstance(v, bool | int) else repr(float(v))
    return "[" + ",".join(item(v) for v in values) + "]"


class ChdbConnection:
    """ClickHouse's engine in this process (chdb), its data in a directory."""

    def __init__(self, target: Target) -> None:
        from chdb import session

        self.target = target
        path = str(Path(target.path).resolve())
        if _CHDB["users"] and _CHDB["path"] != path:
            raise ValueError(f"chdb://{target.path}: this process already runs chdb on {_CHDB['path']} (one data "
                             f"directory per process; use ?database=NAME for another data set)")
        if not _CHDB["users"]:
            Path(path).mkdir(parents=True, exist_ok=True)
            with _reported(target):
                _CHDB.update(path=path, session=session.Session(path))
        _CHDB["users"] += 1
        self._session = _CHDB["session"]
        self._closed = False

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        with _reported(self.target):
            self._session.query(sql, "CSV", params=_chdb_params(params))

    def query_arrow(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        with _reported(self.target):
            return self._session.query(sql + SETTINGS_CLAUSE, "ArrowTable", params=_chdb_params(params))

    def query_arrow_batches(self, sql: str, params: dict[str, Any] | None = None,
                            rows_per_batch: int = 1_000_000) -> Iterator[pa.Table]:
        with _reported(self.target):
            stream = self._session.send_query(sql + SETTINGS_CLAUSE, "Arrow", params=_chdb_params(params))
        try:
            with _reported(self.target):
                batches = iter(stream.record_batch(rows_per_batch=rows_per_batch))
            while True:
                with _reported(self.target):  # ClickHouse's errors surface while fetching
                    batch = next(batches, None)
                if batch is None:
                    return
                yield pa.Table.from_batches([batch])
        finally:
            stream.close()

    def insert_arrow(self, table: str, rows: pa.Table) -> None:
        columns = ", ".join(f"`{name}`" for name in rows.column_names)
        with _reported(self.target):
            # chdb's Python() table function reads the named local variable of the calling frame.
            self._session.query(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM Python(rows)")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _CHDB["users"] -= 1
        if not _CHDB["users"]:
            _CHDB["session"].close()
            _CHDB.update(path=None, session=None)


class ServerConnection:
    """A ClickHouse server over HTTP(S), through clickhouse-connect."""

    def __init__(self, target: Target, password: str) -> None:
        import clickhouse_connect

        self.target = target
        with _reported(target):
            self._client = clickhouse_connect.get_client(
                host=target.host, port=target.port, username=target.user, password=password,
                database=target.database, secure=target.scheme == "clickhouses", settings=READ_SETTINGS)

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        with _reported(self.target):
            self._client.command(sql, parameters=params or {})

    def query_arrow(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        with _reported(self.target):
            return self._client.query_arrow(sql, parameters=params or {}, use_strings=True)

    def query_arrow_batches(self, sql: str, params: dict[str, Any] | None = None,
                            rows_per_batch: int = 1_000_000) -> Iterator[pa.Table]:
        # The server sends blocks (max_block_size rows, 65,409 by default); rows_per_batch does not apply.
        with _reported(self.target):
            stream = self._client.query_arrow_stream(sql, parameters=params or {}, use_strings=True)
        with stream:
            blocks = iter(stream)
            while True:
                with _reported(self.target):
                    block = next(blocks, None)
                if block is None:
                    return
                yield block

    def insert_arrow(self, table: str, rows: pa.Table) -> None:
        with _reported(self.target):
            self._client.insert_arrow(table, rows)

    def close(self) -> None:
        self._client.close()


def connect(url: str) -> Connection:
    """A connection to the ClickHouse a URL names. Raises ValueError for a bad URL or password file."""
    target = parse_url(url)
    if target.scheme == "chdb":
        return ChdbConnection(target)
    return ServerConnection(target, password_from_env())
