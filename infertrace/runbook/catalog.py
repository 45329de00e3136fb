"""The runbook's queries: one `.sql` file each under `queries/`, described by its header comment.

A header is the file's leading `--` comment lines:

    -- title: Prefills that collided with a request's slow tokens
    -- question: Which prefills shared the engine steps in which request X waited for its slowest tokens?
    -- when: A user reports one slow stream and you have its request id.
    -- param request_id text: Request id (gen_ai.request.id).
    -- param min_itl_ms float = 0: Only tokens whose ITL is at least this many milliseconds.
    -- example: request_id=tenant-a-000042
    -- needs tokens WHERE itl_ns IS NOT NULL: tokens after a request's first (per-token times)
    -- either: requests, component_calls

A field continues on following lines indented by more than one space after `--`. Parameters appear in the
SQL as `$name` and are bound by DuckDB; values are never formatted into the SQL text. A parameter without
`= default` is required; `= null` makes it optional (the SQL treats NULL as "no filter").

Parameter types: `text`, `int`, `float`, `time` (ISO 8601, UTC when no offset is given, or epoch seconds,
or epoch nanoseconds; bound as int64 ns since the epoch, like every time in the store) and `text[]`
(comma-separated).

A `needs` line names rows the query summarises, beyond there being any in the relations it reads: the relation, a
condition on its columns and what such rows are. When a query finds nothing, `explain.notes` says which of its
needs no row of the store meets (a store from an engine that never sets the attribute, a fleet without the
component), so that the empty answer is not read as "nothing wrong". An `either` line names relations that are
alternative sources of the same rows (requests that reached an engine, or seen at a gateway alone): an empty one is
said only when all of them are empty.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

PARAMETER_TYPES = ("text", "int", "float", "time", "text[]")

_FIELD = re.compile(r"^--\s(\w+)\s*:\s?(.*)$")
_PARAM_LINE = re.compile(r"^--\sparam\s+(.+)$")
_NEEDS_LINE = re.compile(r"^--\sneeds\s+(.+)$")
_NEEDS = re.compile(r"^(\w+)\s+WHERE\s+(.+?):\s+(.+)$")
_PARAM = re.compile(r"^(\w+)\s+(text\[\]|text|int|float|time)(?:\s*=\s*(\S+))?$")
_CONTINUATION = re.compile(r"^--\s{2,}(\S.*)$")
_PLACEHOLDER = re.compile(r"\$([A-Za-z_]\w*)")


class RunbookError(ValueError):
    """A query or parameter problem that the caller can fix (unknown name, missing or malformed value)."""


@dataclass(frozen=True)
class Parameter:
    name: str
    type: str
    default: str | None  # raw text as in the header; None: required; "null": optional, no filter
    description: str

    @property
    def required(self) -> bool:
        return self.default is None

    def convert(self, raw: Any) -> Any:
        """The value to bind: `raw` is the command line's text, or already a Python value."""
        if raw is None or (isinstance(raw, str) and raw.strip().lower() == "null"):
            return None
        try:
            if self.type == "text":
                return str(raw)
            if self.type == "int":
                return int(raw)
            if self.type == "float":
                return float(raw)
            if self.type == "time":
                return parse_time_ns(raw)
            if isinstance(raw, str):
                return [part.strip() for part in raw.split(",") if part.strip()]
            return [str(v) for v in raw]
        except (TypeError, ValueError) as e:
            raise RunbookError(f"parameter {self.name} ({self.type}): cannot read {raw!r}: {e}") from None


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def parse_time_ns(raw: Any) -> int:
    """ISO 8601 (UTC unless it says otherwise), epoch seconds, or epoch nanoseconds → int64 ns.
    ValueError (naming the input) for anything else, including `inf`, `nan` and times outside int64 ns."""
    if isinstance(raw, datetime):
        moment = raw if raw.tzinfo else raw.replace(tzinfo=UTC)
        return int(moment.timestamp()) * 10**9 + moment.microsecond * 1000
    text = str(raw).strip()
    try:
        number = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{text!r} is not a time: give ISO 8601 (2026-01-01T00:00:00Z), epoch seconds "
                             f"or epoch nanoseconds") from None
        moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        seconds = int((moment - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())
        return _in_range(seconds * 10**9 + moment.microsecond * 1000, text)
    if not math.isfinite(number):
        raise ValueError(f"{text!r} is not a time: give a finite epoch time or ISO 8601")
    if abs(number) >= 1e14:  # nanoseconds (anything after 1970-01-02 in ns is above this)
        return _in_range(int(text) if text.lstrip("-").isdigit() else int(number), text)
    return _in_range(round(number * 1e9), text)


def _in_range(ns: int, text: str) -> int:
    if not _INT64_MIN <= ns <= _INT64_MAX:
        raise ValueError(f"{text!r} is outside the times the store can hold (years 1678 to 2262)")
    return ns


@dataclass(frozen=True)
class Need:
    relation: str
    condition: str  # SQL over the relation's columns
    description: str  # what the rows that meet it are, and which sources have them


@dataclass(frozen=True)
class Query:
    name: str
    title: str
    question: str
    when: str
    parameters: tuple[Parameter, ...]
    example: str  # `k=v k=v` that makes a useful run; may be empty
    sql: str
    needs: tuple[Need, ...] = ()
    either: tuple[str, ...] = ()  # relations that are alternative sources of the same rows

    def parameter(self, name: str) -> Parameter:
        for p in self.parameters:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.parameters) or "none"
        raise RunbookError(f"query {self.name} has no parameter {name!r}; its parameters: {known}")

    def bind(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every declared parameter's value (from `values`, else its default), converted to its type."""
        for name in values:
            self.parameter(name)
        bound: dict[str, Any] = {}
        for p in self.parameters:
            if p.name in values:
                bound[p.name] = p.convert(values[p.name])
            elif p.required:
                raise RunbookError(f"query {self.name} needs --param {p.name}=… ({p.type}: {p.description})")
            else:
                bound[p.name] = p.convert(p.default)
        return bound

    def example_values(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.example.split()) if self.example else {}


def parse_query(name: str, text: str) -> Query:
    entries: list[list[str]] = []  # [key, value] in header order; a continuation extends the last one
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        field = _FIELD.match(line)
        param = _PARAM_LINE.match(line)
        needs = _NEEDS_LINE.match(line)
        continued = _CONTINUATION.match(line)
        if param:
            entries.append(["param", param.group(1).strip()])
        elif needs:
            entries.append(["needs", needs.group(1).strip()])
        elif field:
            entries.append([field.group(1), field.group(2).strip()])
        elif continued and entries:
            entries[-1][1] += " " + continued.group(1).strip()
    fields = {key: value for key, value in entries if key not in ("param", "needs")}
    for required in ("title", "question", "when"):
        if not fields.get(required):
            raise RunbookError(f"queries/{name}.sql: header has no '-- {required}:' line")
    parameters = []
    for spec in (value for key, value in entries if key == "param"):
        head, _, description = spec.partition(":")
        match = _PARAM.match(head.strip())
        if not match:
            raise RunbookError(f"queries/{name}.sql: cannot read parameter line {spec!r}; "
                               f"expected 'NAME TYPE [= DEFAULT]: description' with TYPE in {PARAMETER_TYPES}")
        parameters.append(Parameter(match.group(1), match.group(2), match.group(3), description.strip()))
    declared = {p.name for p in parameters}
    used = set(_PLACEHOLDER.findall(_strip_comments(text)))
    if declared != used:
        raise RunbookError(f"queries/{name}.sql: declared parameters {sorted(declared)} but the SQL uses "
                           f"{sorted(used)}")
    needs = []
    for spec in (value for key, value in entries if key == "needs"):
        match = _NEEDS.match(spec)
        if not match:
            raise RunbookError(f"queries/{name}.sql: cannot read needs line {spec!r}; expected "
                               "'RELATION WHERE CONDITION: what such rows are'")
        needs.append(Need(match.group(1), match.group(2).strip(), match.group(3).strip()))
    either = tuple(r.strip() for r in fields.get("either", "").split(",") if r.strip())
    return Query(name, fields["title"], fields["question"], fields["when"], tuple(parameters),
                 fields.get("example", ""), text, tuple(needs), either)


def _strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def load_queries() -> dict[str, Query]:
    """Every runbook query, by name (the file name without `.sql`), sorted by name."""
    folder = resources.files("infertrace.runbook").joinpath("queries")
    queries = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            name = entry.name[:-4]
            queries[name] = parse_query(name, entry.read_text(encoding="utf-8"))
    return queries


def get_query(name: str) -> Query:
    queries = load_queries()
    if name not in queries:
        raise RunbookError(f"no runbook query named {name!r}; `infertrace query --list` shows them")
    return queries[name]
