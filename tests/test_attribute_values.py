"""An attribute value written back as OTLP JSON (an export, a span printed by the SDK) reads back as the value
it was: `encode_value` is the inverse of `decode_value` for what the store keeps."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from infertrace.store.values import decode_value, encode_value

_INT64 = st.integers(-(2**63), 2**63 - 1)
_FLOAT = st.floats(allow_nan=False, allow_infinity=False)
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@given(value=_INT64 | _FLOAT | st.booleans() | _TEXT)
def test_a_scalar_reads_back_as_itself(value: Any) -> None:
    kind, got = decode_value(encode_value(value), "k")
    assert got == value and type(got) is type(value)
    assert kind == {bool: "bool", int: "int", float: "double", str: "string"}[type(value)]


@given(values=st.lists(_INT64, min_size=1) | st.lists(_FLOAT, min_size=1) | st.lists(_TEXT, min_size=1))
def test_a_list_of_one_type_reads_back_as_that_list(values: list[Any]) -> None:
    kind, got = decode_value(encode_value(values), "k")
    assert kind.endswith("[]") and got == values


def test_nulls_leave_a_list_and_an_object_or_a_null_is_kept_as_its_json_text() -> None:
    assert decode_value(encode_value([1, None, 2]), "k") == ("int[]", [1, 2])
    assert decode_value(encode_value({"a": [1]}), "k") == ("string", json.dumps({"a": [1]}))
    assert decode_value(encode_value(None), "k") == ("string", "null")
