"""Tables and text for a terminal, drawn by rich: the report's `table` format and runbook query results.

On a terminal they are printed as rich renderables (colour, the terminal's width); anywhere else (a pipe, a
file, a golden test) `plain_text` renders them without colour at their natural width, so no cell is wrapped
or cut and the text diffs cleanly.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table

SEVERITY_STYLES = {"critical": "bold red", "warning": "yellow", "info": "blue", "ok": "green"}


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def rich_table(columns: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[bool],
               row_styles: Sequence[str | None] = ()) -> Table:
    """Cells already formatted as text; numeric columns right-aligned; a row's style (e.g. its severity's)."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold", highlight=False,
                  collapse_padding=True)
    for name, right in zip(columns, numeric, strict=True):
        table.add_column(name, justify="right" if right else "left", overflow="fold")
    for i, row in enumerate(rows):
        table.add_row(*row, style=row_styles[i] if i < len(row_styles) else None)
    return table


def plain_text(renderables: Iterable[RenderableType]) -> str:
    """The renderables as plain text, without colour, each at its natural width; trailing spaces removed."""
    console = Console(file=io.StringIO(), width=100_000, color_system=None, force_terminal=False,
                      highlight=False, markup=False, emoji=False, soft_wrap=False)
    for r in renderables:
        console.print(r)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
