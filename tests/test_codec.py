"""How a result's large lists are stored: built column by column (`encode_column`), the same Arrow column as
encoding each value and converting the rows, and read back (`decode_column`) as the values written."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infertrace.results.codec import decode_column, encode, encode_column
from infertrace.results.materialized import _arrow_type


@dataclass(frozen=True)
class Token:
    index: int
    gap_ms: float | None


@dataclass(frozen=True)
class Stall:
    engine: str
    step: int
    stalled: bool
    victims: tuple[str, ...]
    tokens: tuple[Token, ...]
    worst: Token | None
    share: float


def _tokens(draw: st.DrawFn) -> Token:
    index = draw(st.integers(-2**40, 2**40))
    gap = draw(st.one_of(st.none(), st.floats(allow_nan=False, width=64)))
    return Token(np.int64(index) if draw(st.booleans()) else index, gap)  # numpy scalars, as analyzers leave them


tokens = st.composite(_tokens)()
stalls = st.builds(Stall, engine=st.text(max_size=8), step=st.integers(0, 2**62), stalled=st.booleans(),
                   victims=st.lists(st.text(max_size=4), max_size=4).map(tuple),
                   tokens=st.lists(tokens, max_size=4).map(tuple), worst=st.one_of(st.none(), tokens),
                   share=st.one_of(st.integers(0, 9), st.floats(allow_nan=False)))


@settings(max_examples=60, deadline=None)
@given(st.lists(stalls, min_size=1, max_size=30))
def test_a_column_built_field_by_field_equals_the_rows_encoded_one_by_one(values: list[Stall]) -> None:
    struct = _arrow_type(Stall)
    column = encode_column(values, Stall, struct)
    assert column.equals(pa.array([encode(v) for v in values], type=struct))
    assert decode_column(column, Stall) == values


def test_a_value_arrow_cannot_hold_is_refused_not_stored() -> None:
    struct = _arrow_type(Stall)
    wrong = Stall("e", 1, True, ("a",), (Token(1, 2.0),), None, share="half")  # type: ignore[arg-type]
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        encode_column([wrong], Stall, struct)
