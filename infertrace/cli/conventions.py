"""What every command shares without repeating it: the store's environment variable, help text shown as written
(no type noise, no markup), `--version` and `--log-level`, relative times, and where `simulate` sends traces.

`Group` is the root command's class: when the command tree is built it walks every command under it (also
command groups added later) and applies the conventions, so a new command gets them by being registered.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import typer
from rich.logging import RichHandler
from rich.markup import escape
from typer.core import TyperGroup

from infertrace.cli.console import err

STORE_ENV = "INFERTRACE_STORE"
WINDOW_ENV = "INFERTRACE_ANALYSIS_WINDOW"
HELP_OPTION_NAMES = ["-h", "--help"]
LOG_LEVELS = ("debug", "info", "warning", "error")


class Group(TyperGroup):
    """The `infertrace` group. Every option named `--store` reads $INFERTRACE_STORE when not given, and every
    `--analysis-window` $INFERTRACE_ANALYSIS_WINDOW (the dashboard's pages read it too); help texts
    are plain text (a `[default: …]` written in one is shown, not taken for markup); flags show no `<bool>`
    and repeatable options their element type."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in _walk(self):
            _apply_conventions(command)

    def get_params(self, ctx: Any) -> list[Any]:
        _apply_conventions(self)  # the completion options are added to the root after it is made
        return super().get_params(ctx)


def _walk(command: Any) -> Iterator[Any]:
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _walk(sub)


def _plain(text: str) -> str:
    """Help text as written: no rich markup, and the first paragraph one line (the command list shows it)."""
    first, sep, rest = text.strip().partition("\n\n")
    return escape(" ".join(first.split()) + sep + rest)


def _apply_conventions(command: Any) -> None:
    from typer._click import Context

    if command.help and not getattr(command, "_conventions_applied", False):
        command.help = _plain(command.help)
    command._conventions_applied = True
    for param in command.params:
        if getattr(param, "_conventions_applied", False):
            continue
        param._conventions_applied = True
        if getattr(param, "help", None):
            param.help = escape(param.help)
        if param.param_type_name == "option" and param.name in ("store", "analysis_window"):
            param.envvar = STORE_ENV if param.name == "store" else WINDOW_ENV
            param.show_envvar = True
        if param.metavar is None:
            if getattr(param, "is_flag", False):
                param.metavar = ""
                continue
            shown = param.display_type(Context(command))
            if shown.startswith("<list[") and shown.endswith("]>"):
                element = f"<{shown[len('<list['):-2]}>"
                if param.param_type_name == "argument":
                    param.metavar = param.name.upper()
                    param.display_type_rich = lambda ctx, element=element: element
                else:
                    param.metavar = element
    # The help option is made on first use and cached; make it now so that it shows no type either.
    help_option = command.get_help_option(Context(command, help_option_names=HELP_OPTION_NAMES))
    if help_option is not None:
        help_option.metavar = ""


def version() -> str:
    try:
        return metadata.version("infertrace")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


def show_version(value: bool) -> None:
    if value:
        typer.echo(f"infertrace {version()}")
        raise typer.Exit()


def configure_logging(level: str) -> None:
    """Log records (ours, the OpenTelemetry SDK's, the HTTP clients') at `level` and above to standard error."""
    if level.lower() not in LOG_LEVELS:
        from infertrace.cli.console import did_you_mean, fail

        raise fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {level!r}"
                   f"{did_you_mean(level, LOG_LEVELS)}")
    handler = RichHandler(console=err, show_path=False, markup=False, rich_tracebacks=False)
    logging.basicConfig(level=level.upper(), handlers=[handler], format="%(name)s: %(message)s", force=True)


# -------------------------------------------------------------------------------------------- times
_UNITS_NS = {"s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9, "w": 7 * 86400 * 10**9}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration_ns(text: str) -> int | None:
    """`15m`, `2h`, `1h30m`, `90s`, `1.5d` → nanoseconds; None when `text` is not a duration."""
    compact = text.strip().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        return None
    return round(sum(float(n) * _UNITS_NS[u] for n, u in parts))


def parse_when(text: str, now_ns: int | None = None) -> int:
    """A point in time as on-call types it: `now`, a duration back from now (`-15m`, `15m`, `2h`, `1h30m`),
    or what `parse_time_ns` reads (ISO 8601, UTC unless it says otherwise; epoch seconds; epoch ns).
    Raises ValueError naming the text."""
    from infertrace.runbook import parse_time_ns

    now = time.time_ns() if now_ns is None else now_ns
    stripped = text.strip()
    if stripped.lower() == "now":
        return now
    back = parse_duration_ns(stripped[1:] if stripped.startswith("-") else stripped)
    if back is not None:
        return now - back
    try:
        return parse_time_ns(stripped)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: give ISO 8601 (2026-01-01T00:05:00Z, UTC unless it says "
                         f"otherwise), epoch seconds or ns, `now`, or a time back from now (-15m, 2h, 1d)") from None


# ------------------------------------------------------------------------------- simulate's output
_OTLP_PROTOCOL_ENV = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def otlp_endpoint_from_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """The OTLP/HTTP traces endpoint the OpenTelemetry environment variables name, resolved as the SDK's
    exporter resolves it: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT` +
    `/v1/traces`. None when neither is set. Raises ValueError for a protocol other than OTLP/HTTP."""
    for name in _OTLP_PROTOCOL_ENV:
        protocol = environ.get(name, "").strip()
        if protocol and protocol not in ("http/protobuf", "http/json"):
            raise ValueError(f"${name}={protocol}: simulate exports OTLP over HTTP (http/protobuf); point it "
                             f"at an OTLP/HTTP receiver such as `infertrace collect` or a Collector's port 4318")
        if protocol:
            break
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base.rstrip("/") + "/v1/traces"
    return None


def trace_destination(out: Any, otlp_endpoint: str | None) -> str | None:
    """The OTLP endpoint `simulate` sends to (None: it writes `out`). Without `--out` or `--otlp-endpoint` the
    OpenTelemetry environment variables decide; without those either, the traces would go nowhere: a usage
    error (exit 2). Headers, timeout and compression come from the usual `OTEL_EXPORTER_OTLP_*` variables."""
    from infertrace.cli.console import fail

    if out is not None or otlp_endpoint is not None:
        return otlp_endpoint
    try:
        endpoint = otlp_endpoint_from_env()
    except ValueError as e:
        raise fail(str(e)) from None
    if endpoint is None:
        raise fail("nowhere to send the traces: give --out FILE, --otlp-endpoint URL, or set "
                   "OTEL_EXPORTER_OTLP_ENDPOINT (e.g. http://127.0.0.1:4318)")
    err.print(f"Sending traces to {endpoint} (from the OTEL_EXPORTER_OTLP_* environment)", markup=False,
              highlight=False)
    return endpoint


def warn_if_outside(store: dict[str, Any], since_ns: int | None, until_ns: int | None) -> None:
    """Says on stderr when a --since/--until window misses every stored span (`store`: the report document's
    store section, with `first_span`/`last_span` in ISO 8601), so an empty report does not read as a calm one."""
    from infertrace.report.model import iso
    from infertrace.runbook import parse_time_ns

    if not store.get("first_span") or not store.get("last_span"):
        return
    first, last = parse_time_ns(store["first_span"]), parse_time_ns(store["last_span"])
    if (since_ns is not None and since_ns > last) or (until_ns is not None and until_ns <= first):
        err.print(f"note: the window {iso(since_ns) or '…'} to {iso(until_ns) or '…'} holds none of the store's "
                  f"spans, which run from {store['first_span']} to {store['last_span']}", markup=False,
                  highlight=False)


# ------------------------------------------------------------------------------- windows
def parse_window(since: str | None, until: str | None) -> tuple[int | None, int | None]:
    """--since/--until as ns (None when not given). Raises ValueError naming the bad time, or the window."""
    since_ns = parse_when(since) if since is not None else None
    until_ns = parse_when(until) if until is not None else None
    if since_ns is not None and until_ns is not None and since_ns >= until_ns:
        raise ValueError(f"--since {since} is not before --until {until}")
    return since_ns, until_ns


def duration_option(seconds: float) -> str:
    """A duration as an option takes it (what `parse_duration_ns` reads back): 6h, 90m, 2d, 45s, 0.5s."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{seconds!r}s"


def parse_analysis_window(text: str | None, option: str) -> float | None:
    """An analysis window (`collect --analysis-window 6h`, `dashboard --analysis-window 6h`) as seconds; None when not
    given. Raises ValueError naming the option and the text."""
    if text is None:
        return None
    ns = parse_duration_ns(text)
    if not ns:
        raise ValueError(f"{option} {text!r} is not a positive duration like 30m, 6h, 1h30m or 2d")
    return ns / 1e9
