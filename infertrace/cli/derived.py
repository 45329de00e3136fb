"""What `ingest` and `collect` do after writing: materialise the new snapshot's analysis results
(`infertrace.results`), so the dashboard and `report` open in seconds."""

from __future__ import annotations

from pathlib import Path

from infertrace.cli.console import err


def materialize_store(root: Path, progress: bool) -> None:
    """Derived relations, then each analysis, with a progress bar naming the step; a summary line after."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from infertrace.results import ANALYSES, materialize
    from infertrace.store.store import Store

    started = time.perf_counter()
    columns = (TextColumn("materialising {task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Store.open(root) as store, Progress(*columns, console=err, transient=True, disable=not progress) as bar:
        task = bar.add_task("", total=len(ANALYSES) + 1)
        steps = iter(range(len(ANALYSES) + 2))

        def advance(step: str) -> None:
            bar.update(task, description=step, completed=next(steps))

        spent = materialize(store, on_progress=advance)
    computed = [name for name, seconds in spent.items() if seconds > 0]
    if computed:
        err.print(f"Materialised {', '.join(computed)} in {time.perf_counter() - started:.1f} s "
                  f"(the dashboard and report read them).", markup=False, highlight=False)
