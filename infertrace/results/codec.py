"""Analyzer results (frozen dataclasses) to JSON-ready values and back, guided by their type annotations.

    data = encode(result)                      # dicts, lists, numbers, strings, None
    again = decode(data, ItlAnalysis)          # the same dataclasses, tuples, dicts and sets

Only data is read back: a result file names no code to run, so opening a store written by someone else runs
nothing of theirs. Dicts are written as lists of [key, value] pairs (keys may be tuples), sets as sorted lists,
numpy scalars as Python numbers. A type the annotations do not describe raises TypeError when encoding, so a
result that cannot be stored faithfully is never stored at all.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

_PRIMITIVES = (int, float, str, bool)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def encode(value: Any) -> Any:
    """A JSON-ready form of `value` (a dataclass result, or anything it holds)."""
    if value is None or isinstance(value, _PRIMITIVES):
        return value
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy scalar
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return [[encode(k), encode(v)] for k, v in value.items()]
    if isinstance(value, set | frozenset):
        return sorted((encode(v) for v in value), key=repr)
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    raise TypeError(f"cannot store a {type(value).__name__} in an analysis result")


def decode(data: Any, hint: Any) -> Any:
    """The value of type `hint` that `encode` turned into `data`."""
    return decoder(hint)(data)


def _identity(value: Any) -> Any:
    return value


def _optional(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else inner(value)


@functools.cache
def decoder(hint: Any) -> Callable[[Any], Any]:
    """A function that decodes values of type `hint`, made once per type (results hold many of each)."""
    if hint is Any or hint in (int, str, bool):
        return _identity
    if hint is float:
        return _optional(float)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _optional(decoder(options[0]))
        if all(o in _PRIMITIVES for o in options):  # e.g. int | str: stored as it is
            return _identity
        raise TypeError(f"cannot read a stored value as {hint!r}")
    if dataclasses.is_dataclass(hint):
        hints = _hints(hint)
        fields = [(f.name, decoder(hints[f.name])) for f in dataclasses.fields(hint)]

        def make(data: dict[str, Any]) -> Any:
            return None if data is None else hint(**{name: read(data[name]) for name, read in fields if name in data})

        return make
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = decoder(args[0])
            return (lambda data: tuple(data)) if item is _identity else (lambda data: tuple(map(item, data)))
        items = [decoder(a) for a in args]
        return lambda data: tuple(read(v) for read, v in zip(items, data, strict=True))
    if origin is list:
        item = decoder(args[0])
        return lambda data: list(map(item, data))
    if origin in (set, frozenset):
        item = decoder(args[0])
        return lambda data: origin(map(item, data))
    if origin is dict:
        key, value = decoder(args[0]), decoder(args[1])
        return lambda data: {key(k): value(v) for k, v in data}
    raise TypeError(f"cannot read a stored value as {hint!r}")


def _instances(cls: type, names: list[str], columns: list[list[Any]]) -> list[Any]:
    """Instances of a dataclass from its fields' columns. A frozen dataclass's `__init__` sets each field
    through `object.__setattr__`; filling the instance's `__dict__` at once is several times faster and gives
    the same object (only for classes whose `__init__` does nothing else)."""
    if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__"):
        return [cls(*values) for values in zip(*columns, strict=True)]
    new = object.__new__
    out = []
    for values in zip(*columns, strict=True):
        instance = new(cls)
        instance.__dict__.update(zip(names, values, strict=True))
        out.append(instance)
    return out


def decode_column(array: pa.Array | pa.ChunkedArray, hint: Any) -> list[Any]:
    """Every value of an Arrow column of type `hint` (as `materialized` stores a result's large lists), built
    column by column: a list of many dataclasses with nested lists reads in a fraction of the time a row by
    row `to_pylist` and `decode` take."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    hint = _without_none(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _PRIMITIVES or hint is Any:
        return array.to_pylist()
    if array.null_count:  # rare: a missing nested value; row by row keeps it exact
        read = decoder(hint)
        return [None if v is None else read(v) for v in array.to_pylist()]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        offsets = array.offsets.to_pylist()
        values = decode_column(array.values, args[0])
        return [tuple(values[start:end]) for start, end in itertools.pairwise(offsets)]
    if dataclasses.is_dataclass(hint):
        hints = _hints(hint)
        children = array.flatten()
        columns = [decode_column(child, hints[f.name]) for f, child in zip(dataclasses.fields(hint), children,
                                                                           strict=True)]
        if not columns:
            return [hint() for _ in array]
        return _instances(hint, [f.name for f in dataclasses.fields(hint)], columns)
    read = decoder(hint)
    return [read(v) for v in array.to_pylist()]


def _without_none(hint: Any) -> Any:
    """`X` for `X | None`; any other hint as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(options) == 1:
            return options[0]
    return hint


def encode_column(values: Sequence[Any], hint: Any, arrow_type: pa.DataType) -> pa.Array:
    """The Arrow column of `values` (each of type `hint`, or None) that `pa.array([encode(v) for v in values],
    arrow_type)` gives, built field by field instead of value by value: a result's large lists hold hundreds of
    thousands of dataclasses, and encoding each to a dict first costs seconds. `arrow_type` is a struct, list or
    primitive type made from `hint` (`materialized._arrow_type`); Arrow raises on a value it cannot hold."""
    hint = _without_none(hint)
    if pa.types.is_struct(arrow_type):
        hints = _hints(hint)
        mask = _nulls(values)
        children = [encode_column([getattr(v, f.name) for v in values] if mask is None else
                                  [None if v is None else getattr(v, f.name) for v in values],
                                  hints[f.name], arrow_type.field(f.name).type)
                    for f in dataclasses.fields(hint)]
        return pa.StructArray.from_arrays(children, fields=list(arrow_type), mask=mask)
    if pa.types.is_list(arrow_type):
        lengths = [0 if v is None else len(v) for v in values]
        flat = list(itertools.chain.from_iterable(v for v in values if v is not None))
        items = encode_column(flat, typing.get_args(hint)[0], arrow_type.value_type)
        offsets = pa.array(itertools.accumulate(lengths, initial=0), pa.int32())
        return pa.ListArray.from_arrays(offsets, items, type=arrow_type, mask=_nulls(values))
    return pa.array(values, type=arrow_type)


def _nulls(values: Sequence[Any]) -> pa.Array | None:
    """Which values are None, as a mask; None when none is."""
    if not any(v is None for v in values):
        return None
    return pa.array([v is None for v in values], pa.bool_())
