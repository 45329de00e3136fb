"""What `ingest` and `collect` do beside writing: materialise the new snapshot's analysis results
(`infertrace.results`), so the dashboard and `report` open in seconds; `collect --metrics` also serves the
derived metrics (`infertrace.export.metrics`)."""

from __future__ import annotations

from pathlib import Path

from infertrace.cli.console import err, fail


def materialize_store(root: Path, progress: bool) -> None:
    """Derived relations, then each analysis, with a progress bar naming the step; a summary line after."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from infertrace.results import ANALYSES, materialize
    from infertrace.results.background import busy, materialising
    from infertrace.store.store import Store

    started = time.perf_counter()
    columns = (TextColumn("materialising {task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    if busy(root):
        err.print("Waiting for the materialisation another process has under way on this store (a collector's or a "
                  "dashboard's) …", markup=False, highlight=False, soft_wrap=True)
    try:
        # after any materialisation under way (a collector's, a dashboard's): the same results are not computed
        # twice at once, and most are then already there
        with materialising(root, wait=True), Store.open(root) as store, Progress(
                *columns, console=err, transient=True, disable=not progress) as bar:
            task = bar.add_task("", total=len(ANALYSES) + 3)  # the relations, each analysis, the report, the metrics
            steps = iter(range(len(ANALYSES) + 4))

            def advance(step: str) -> None:
                bar.update(task, description=step, completed=next(steps))

            spent = materialize(store, on_progress=advance)
    except Exception as e:  # the spans are stored: a failed analysis must not fail the ingest
        err.print(f"warning: could not materialise the analyses ({type(e).__name__}: {e}); the dashboard and "
                  f"report compute them when opened", markup=False, highlight=False)
        return
    computed = [name for name, seconds in spent.items() if seconds > 0]
    if computed:
        err.print(f"Materialised {', '.join(computed)} in {time.perf_counter() - started:.1f} s "
                  f"(the dashboard and report read them).", markup=False, highlight=False)


class Helpers:
    """The collector's companions: the background materialiser and the metrics endpoint."""

    def __init__(self) -> None:
        self.materializer = None  # type: ignore[var-annotated]
        self.metrics_server = None  # type: ignore[var-annotated]

    def stop(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
        if self.materializer is not None:
            self.materializer.stop()


def start_helpers(root: Path, metrics: str | None, materialize: bool, window_s: float | None = None) -> Helpers:
    """Starts what `collect --metrics HOST:PORT` and `--materialize` ask for (over the analysis window, with
    `window_s`); fails (exit 2) on a bad address."""
    helpers = Helpers()
    if metrics is not None:
        from infertrace.export.metrics import serve
        from infertrace.store.collector import parse_listen

        try:
            host, port = parse_listen(metrics)
            helpers.metrics_server, _ = serve(root, host, port, window_s)
        except (OSError, ValueError) as e:
            raise fail(f"--metrics {metrics}: {e}") from None
        bound = helpers.metrics_server.server_address
        print(f"infertrace collect: metrics on http://{bound[0]}:{bound[1]}/metrics", flush=True)
    if materialize:
        from infertrace.results.background import Materializer

        helpers.materializer = Materializer(root, window_s=window_s).start()
    return helpers
