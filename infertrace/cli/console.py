"""What every command prints to: standard output (rich renderables in colour on a terminal, plain text
elsewhere), the standard error console, one way to fail on bad input, and "did you mean" for a mistyped name."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable

import typer
from rich.console import Console, RenderableType
from rich.markup import escape

err = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """A usage or input error: one line naming the input and the problem, exit status 2."""
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(2)


def did_you_mean(value: str, known: Iterable[str]) -> str:
    """`" (did you mean X?)"` when a known name is close to `value`, else ""."""
    close = difflib.get_close_matches(value, list(known), n=3, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {' or '.join(close)}?)"


def check_choice(option: str, value: str, choices: Iterable[str]) -> None:
    """Fails (exit 2) unless `value` is one of `choices`, naming the option, the choices and the nearest one."""
    known = list(choices)
    if value not in known:
        raise fail(f"{option} must be one of {', '.join(known)}, got {value!r}{did_you_mean(value, known)}")


def show(renderables: Callable[[int], list[RenderableType]], text: Callable[[], str]) -> None:
    """Prints rich renderables (made for the terminal's width) on a terminal, else the plain text."""
    out = Console()
    if out.is_terminal:
        for r in renderables(out.width):
            out.print(r)
    else:
        plain = text()
        print(plain, end="" if plain.endswith("\n") else "\n")
