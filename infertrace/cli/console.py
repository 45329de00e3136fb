"""What every command prints to: the standard error console, and one way to fail on bad input."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """A usage or input error: one line naming the input and the problem, exit status 2."""
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(2)
