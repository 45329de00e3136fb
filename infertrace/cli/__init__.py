"""The `infertrace` command line: one module per command group, each command a thin shell over one library
function (the engine's through `reference_engine.api`, the toolkit's own otherwise). `conventions.Group`
gives every command the shared conventions (INFERTRACE_STORE, help without noise)."""

from __future__ import annotations

from typing import Annotated

import typer

from infertrace.cli import analysis, engine, evaluation, exports, replay, site, store
from infertrace.cli.conventions import HELP_OPTION_NAMES, Group, configure_logging, show_version

app = typer.Typer(cls=Group, no_args_is_help=True, context_settings={"help_option_names": HELP_OPTION_NAMES},
                  help="Why did LLM inference latency go wrong? Simulate, ingest, analyse, report.")


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=show_version, is_eager=True, help="Print infertrace's version and exit")] = False,
    log_level: Annotated[str, typer.Option(
        envvar="INFERTRACE_LOG_LEVEL", help="Log records at this level and above to stderr: debug, info, "
                                            "warning or error")] = "warning",
) -> None:
    """Why did LLM inference latency go wrong? Simulate, ingest, analyse, report.

    Every command that takes --store also reads $INFERTRACE_STORE. Times (--since, --until, time parameters of
    runbook queries) are UTC ISO 8601, epoch seconds or ns, `now`, or a time back from now: -15m, 2h, 1d.
    """
    configure_logging(log_level)


app.command()(engine.simulate)
app.command()(engine.calibrate)
app.command()(store.ingest)
app.command()(store.collect)
app.add_typer(store.store_app, name="store")
app.add_typer(evaluation.scenarios_app, name="scenarios")
app.command()(analysis.query)
app.command()(evaluation.evaluate)
app.command()(analysis.report)
app.command()(replay.replay)
app.command()(exports.export)
app.command("serve-metrics")(exports.serve_metrics)
app.command()(site.dashboard)
app.command()(site.demo)


def main() -> None:
    app()
