"""The `infertrace` command line: one module per command group, each command a thin shell over one library
function (the engine's through `reference_engine.api`, the toolkit's own otherwise)."""

from __future__ import annotations

import typer

from infertrace.cli import analysis, engine, evaluation, site, store

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Why did LLM inference latency go wrong? Simulate, ingest, analyse, report.")


@app.callback()
def _root() -> None:
    """Why did LLM inference latency go wrong? Simulate, ingest, analyse, report."""


app.command()(engine.simulate)
app.command()(engine.calibrate)
app.command()(store.ingest)
app.command()(store.collect)
app.add_typer(store.store_app, name="store")
app.add_typer(evaluation.scenarios_app, name="scenarios")
app.command()(analysis.query)
app.command()(evaluation.evaluate)
app.command()(analysis.report)
app.command()(site.dashboard)
app.command()(site.demo)


def main() -> None:
    app()
