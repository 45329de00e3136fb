"""Attribute values on their way into the store: OTLP JSON `AnyValue` decoding, conversion to a declared
type, the text kept in the attribute maps, the limits every span is held to, and the notes that count what
was changed to store a span rather than reject it.

Limits, like the OpenTelemetry Collector's and Tempo's (both truncate rather than drop a span):

- at most `MAX_ATTRIBUTES` attributes per span and per resource: declared keys are always kept, other keys
  past the limit are dropped;
- a key longer than `MAX_KEY_CHARS` is dropped;
- a string value (or a map value's text) longer than `MAX_VALUE_CHARS` is truncated to it;
- a span name longer than `MAX_NAME_CHARS` is truncated; at most `MAX_EVENTS` events per span are kept.

Each of these, and each conversion, is counted in `Notes` (per span row), which the ingest summary, the
collector's answer and log line, and the segment's metadata report.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any, Final

import numpy as np

MAX_ATTRIBUTES: Final = 1024
MAX_KEY_CHARS: Final = 256
MAX_VALUE_CHARS: Final = 16 * 1024
MAX_NAME_CHARS: Final = 1024
MAX_EVENTS: Final = 4096
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# What a note says happened to a value.
CONVERTED: Final = "converted"  # to its key's declared type (e.g. vLLM's JSON-encoded finish reasons)
KEPT_AS_TEXT: Final = "kept_as_text"  # of a declared key, not convertible: kept in the attribute map
TRUNCATED: Final = "truncated"
DROPPED: Final = "dropped"
REDACTED: Final = "redacted"  # prompt or completion text, never stored (infertrace.store.content)
NOTE_KINDS: Final = (CONVERTED, KEPT_AS_TEXT, TRUNCATED, DROPPED, REDACTED)


class BadRecord(ValueError):
    """A span or line that cannot be stored; the message is the reason kept in quarantine."""


class Unconverted(dict[str, Any]):
    """A span of another format (e.g. Zipkin's) that could not be converted to OTLP: the original span, with the
    reason. Ingest rejects it with that reason and keeps the original in quarantine; the spans beside it are
    stored."""

    def __init__(self, original: dict[str, Any], reason: str) -> None:
        super().__init__(original)
        self.reason = reason


class NotConvertible(ValueError):
    """A value whose meaning in the declared type is not clear."""


def check_text(value: str, what: str) -> str:
    """`value` when it can be stored as UTF-8 (not, e.g., a lone surrogate from a JSON `\\ud800` escape)."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRecord(f"{what} is not valid Unicode ({e.reason} at character {e.start})") from None
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise BadRecord(f"{what}: expected an integer, got a boolean")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            raise BadRecord(f"{what}: {value[:40]!r} is not an integer") from None
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        raise BadRecord(f"{what}: expected an integer, got {type(value).__name__}")
    return number


def int64(value: Any, what: str) -> int:
    number = _int(value, what)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise BadRecord(f"{what}: {number} does not fit in 64 bits")
    return number


def _double(value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise BadRecord(f"{what}: expected a double, got a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    raise BadRecord(f"{what}: expected a double, got {type(value).__name__}")


def decode_value(value: Any, key: str) -> tuple[str, Any] | None:
    """An OTLP JSON `AnyValue` as (kind, Python value); kinds are `string`, `int`, `double`, `bool`, a list
    of one of them (`int[]`, ...), `[]` for an empty array, or `json` (text) for a key-value list, bytes or
    a mixed array. None for an empty value."""
    if not isinstance(value, dict):
        raise BadRecord(f"attribute {key!r}: value is not an object")
    if len(value) == 1:
        ((tag, raw),) = value.items()
    elif not value:
        return None
    else:
        known = [t for t in value if t.endswith("Value")]
        if len(known) != 1:
            raise BadRecord(f"attribute {key!r}: value must have exactly one of stringValue, intValue, ...")
        tag, raw = known[0], value[known[0]]
    if tag == "stringValue":
        if not isinstance(raw, str):
            raise BadRecord(f"attribute {key!r}: stringValue is not a string")
        return "string", check_text(raw, f"attribute {key!r}")
    if tag == "intValue":
        return "int", int64(raw, f"attribute {key!r}")
    if tag == "doubleValue":
        return "double", _double(raw, f"attribute {key!r}")
    if tag == "boolValue":
        if not isinstance(raw, bool):
            raise BadRecord(f"attribute {key!r}: boolValue is not a boolean")
        return "bool", raw
    if tag == "arrayValue":
        values = raw.get("values", []) if isinstance(raw, dict) else None
        if not isinstance(values, list):
            raise BadRecord(f"attribute {key!r}: arrayValue has no values list")
        items = [decode_value(v, key) for v in values]
        kinds = {k for k, _ in filter(None, items)}
        if not kinds:
            return "[]", []
        if len(kinds) == 1 and (kind := kinds.pop()) in _SCALAR_KINDS:
            return kind + "[]", [None if i is None else i[1] for i in items]
        return "json", json.dumps(values, separators=(",", ":"))
    if tag in ("kvlistValue", "bytesValue"):
        return "json", json.dumps({tag: raw}, separators=(",", ":"))
    raise BadRecord(f"attribute {key!r}: unknown value type {tag!r}")


def encode_value(value: Any) -> dict[str, Any]:
    """A JSON-decoded value as an OTLP JSON `AnyValue`, the inverse of `decode_value` for what it stores: a
    list becomes an array without its nulls, and an object or a null is kept as its JSON text."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [encode_value(v) for v in value if v is not None]}}
    return {"stringValue": value if isinstance(value, str) else json.dumps(value)}


_SCALAR_KINDS: Final = ("string", "int", "double", "bool")
_INTEGER: Final = re.compile(r"-?[0-9]{1,19}")


def fast_value(value: dict[str, Any]) -> tuple[str, Any]:
    """The common shapes of `AnyValue`, without the checks `decode_value` makes; raises on anything else
    (the caller then takes the checked path)."""
    ((tag, raw),) = value.items()
    if tag == "stringValue":
        if raw.__class__ is str and raw.isascii():
            return "string", raw
    elif tag == "intValue":
        number = int(raw)
        if _INT64_MIN <= number <= _INT64_MAX and raw.__class__ is not bool:
            return "int", number
    elif tag == "arrayValue":
        values = raw["values"]
        if not values:
            return "[]", []
        first = next(iter(values[0]))
        if first == "intValue":
            numbers = [int(v["intValue"]) for v in values]
            if min(numbers) >= _INT64_MIN and max(numbers) <= _INT64_MAX and all(
                    len(v) == 1 and v["intValue"].__class__ is not bool for v in values):
                return "int[]", numbers
        elif first == "stringValue":
            strings = [v["stringValue"] for v in values]
            if set(map(type, strings)) == {str} and all(len(v) == 1 and v["stringValue"].isascii() for v in values):
                return "string[]", strings
        elif first == "boolValue":
            flags = [v["boolValue"] for v in values]
            if set(map(type, flags)) == {bool} and all(len(v) == 1 for v in values):
                return "bool[]", flags
    elif tag == "boolValue":
        if raw.__class__ is bool:
            return "bool", raw
    elif tag == "doubleValue" and raw.__class__ is float:
        return "double", raw
    raise ValueError("not a common shape")


# ------------------------------------------------------------------------------------ conversions
def _double_text(value: float) -> str:
    if math.isfinite(value):
        return repr(value)
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def as_text(kind: str, value: Any) -> str:
    """A decoded value as the text kept in an attribute map (not yet truncated)."""
    if kind == "string" or kind == "json":
        return value
    if kind == "int":
        return str(value)
    if kind == "double":
        return _double_text(value)
    if kind == "bool":
        return "true" if value else "false"
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _scalar(kind: str, value: Any, declared: str) -> Any:
    """A scalar (decoded, or an item of a JSON list) as `declared`, a scalar kind; NotConvertible if unclear."""
    if value is None:
        return None
    if declared == "string":
        if kind == "string":
            return value
        if kind in ("int", "double", "bool"):
            return as_text(kind, value)
    elif declared == "int":
        if kind == "int":
            return value
        if kind == "double" and math.isfinite(value) and value.is_integer() and _INT64_MIN <= value <= _INT64_MAX:
            return int(value)
        if kind == "string":
            text = value.strip()
            if _INTEGER.fullmatch(text):
                number = int(text)
                if _INT64_MIN <= number <= _INT64_MAX:
                    return number
    elif declared == "double":
        if kind in ("int", "double"):
            return float(value)
        if kind == "string":
            text = value.strip()
            if text in ("NaN", "Infinity", "-Infinity"):
                return float(text.replace("Infinity", "inf"))
            try:
                number = float(text)
            except ValueError:
                raise NotConvertible from None
            if math.isfinite(number):
                return number
    elif declared == "bool":
        if kind == "bool":
            return value
        if kind == "string" and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    raise NotConvertible


def _json_kind(item: Any) -> str:
    if isinstance(item, bool):
        return "bool"
    if isinstance(item, int):
        return "int"
    if isinstance(item, float):
        return "double"
    if isinstance(item, str):
        return "string"
    raise NotConvertible


def convert(kind: str, value: Any, declared: str) -> Any:
    """A decoded value as its key's declared type, when the meaning is clear: a number for a number of the
    other kind (an int-valued double for an int), a numeric string for a number, a scalar for a string, a
    JSON-encoded list (vLLM's `gen_ai.response.finish_reasons`) or a single item for a list. Raises
    NotConvertible otherwise (the caller keeps the value as text in the attribute map)."""
    if kind == declared:
        return value
    if not declared.endswith("[]"):
        return _scalar(kind, value, declared)
    item = declared[:-2]
    if kind == "[]":
        return []
    if kind.endswith("[]"):
        return [_scalar(kind[:-2], v, item) for v in value]
    if kind == "string":
        text = value.strip()
        if text.startswith("["):
            try:
                items = json.loads(text)
            except (ValueError, RecursionError):
                raise NotConvertible from None
            if isinstance(items, list):
                return [None if v is None else _scalar(_json_kind(v), v, item) for v in items]
    if kind in _SCALAR_KINDS:
        return [_scalar(kind, value, item)]
    raise NotConvertible


def truncate(text: str) -> str:
    return text[:MAX_VALUE_CHARS]


# ------------------------------------------------------------------------------------------ notes
class Notes:
    """What was changed to store spans rather than reject them: (row, what, key) triples, where `what` is
    one of NOTE_KINDS. Rows are span rows of the batch, so a batch split into segments counts per segment."""

    def __init__(self) -> None:
        self._rows: list[np.ndarray] = []
        self._labels: list[tuple[str, str]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, rows: Iterable[int] | np.ndarray, what: str, key: str) -> None:
        array = np.asarray(rows if isinstance(rows, np.ndarray) else list(rows), dtype=np.int64)
        if len(array):
            self._rows.append(array)
            self._labels.append((what, key))

    def rollback(self, size: int) -> None:
        del self._rows[size:], self._labels[size:]

    def take(self, kept: np.ndarray) -> Notes:
        """The notes of the rows `kept` (ascending span indices), renumbered as the rows of `table.take(kept)`."""
        out = Notes()
        for rows, (what, key) in zip(self._rows, self._labels, strict=True):
            out.add(np.searchsorted(kept, rows[np.isin(rows, kept)]), what, key)
        return out

    def counts(self, rows: np.ndarray | None = None) -> dict[str, dict[str, int]]:
        """{what: {key: count}}, over every row, or over the rows in `rows` (span indices)."""
        if not self._rows:
            return {}
        labels = sorted(set(self._labels))
        index = {label: i for i, label in enumerate(labels)}
        codes = np.repeat(np.array([index[label] for label in self._labels]), [len(r) for r in self._rows])
        if rows is not None:
            codes = codes[np.isin(np.concatenate(self._rows), rows)]
        out: dict[str, dict[str, int]] = {}
        for i, n in enumerate(np.bincount(codes, minlength=len(labels)).tolist()):
            if n:
                what, key = labels[i]
                out.setdefault(what, {})[key] = n
        return out


def merge_counts(into: dict[str, dict[str, int]], more: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    for what, per_key in more.items():
        target = into.setdefault(what, {})
        for key, n in per_key.items():
            target[key] = target.get(key, 0) + int(n)
    return into


_SAID = {CONVERTED: "converted {n} attribute values to their declared type",
         KEPT_AS_TEXT: "kept {n} values of an unexpected type as text in the attribute map",
         TRUNCATED: "truncated {n} values over the size limits",
         DROPPED: "dropped {n} attributes or events over the limits",
         REDACTED: "removed {n} prompt or completion texts"}


def describe(counts: dict[str, dict[str, int]], top: int = 3) -> str:
    """One sentence, e.g. `converted 12 attribute values to their declared type (gen_ai.response.finish_reasons:
    12)`; empty when nothing was noted."""
    parts = []
    for what in NOTE_KINDS:
        per_key = counts.get(what) or {}
        if not per_key:
            continue
        keys = sorted(per_key.items(), key=lambda kv: (-kv[1], kv[0]))
        listed = ", ".join(f"{k}: {n}" for k, n in keys[:top]) + (", …" if len(keys) > top else "")
        parts.append(_SAID[what].format(n=sum(per_key.values())) + f" ({listed})")
    return "; ".join(parts)
