"""First render of each dashboard page, `infertrace report` and the on-call runbook queries, before and after
materialised results, in one run; and what materialisation costs next to ingest.

    .venv/bin/infertrace simulate --fleet examples/fleets/four_models.toml --duration 3600 --seed 1 --out F.jsonl.gz
    .venv/bin/python benchmarks/bench_first_render.py --traces F.jsonl.gz [--json out.json]

Steps, each timed: ingest F into a fresh store (`ingest_paths`, what `infertrace ingest` runs before it
materialises); every page's first render and
`report` with `INFERTRACE_RESULTS=live` (the analyzers run, as before materialisation); materialisation of the
snapshot (derived relations, then every analysis); every page's first render and `report` reading the
materialised results; the same for `infertrace query` on the runbook queries an on-call engineer runs first
(QUERIES: the slowest request's timeline, waterfall, tokens and colliding prefills; the worst ITL gaps; the slowest
requests), each the whole command. Each first render is a fresh process (AppTest, the page opened first, nothing
cached), so no page profits from another's work; the same process then reruns the page (its results cached, as after a
click). Prints a table and the load average at each step. `--skip-live` leaves out the renders without
materialised results (to compare two versions of the materialisation side by side: run it with each on
PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboards" / "app.py"
PAGES = ("views/fleet.py", "views/itl_spikes.py", "views/incidents.py", "views/prefix_cache.py", "views/runbook.py",
         "views/request.py")
QUERIES = ("request_timeline", "request_waterfall", "request_tokens", "prefills_colliding_with_request",
           "worst_itl_gaps", "slowest_requests")  # the first four for the slowest request


def render_once(store: Path, page: str, request_id: str | None) -> tuple[float, float, float]:
    """One page's first render in this fresh process, as a dashboard server that is up renders it (its
    modules imported, nothing computed or cached): wall and CPU seconds of the run; then the wall seconds of
    a rerun of the same page (what a click or a widget change costs once the page's results are cached)."""
    import altair  # noqa: F401  (what a running server has imported already)
    import pandas  # noqa: F401
    from streamlit.testing.v1 import AppTest

    import infertrace.analyzers.itl
    import infertrace.analyzers.prefix_cache
    import infertrace.analyzers.rca
    import infertrace.analyzers.slo
    import infertrace.results  # noqa: F401

    os.environ["INFERTRACE_STORE"] = str(store)
    at = AppTest.from_file(str(APP), default_timeout=3600)
    at.switch_page(page)
    if request_id:
        at.query_params["request_id"] = request_id
    started, cpu = time.perf_counter(), time.process_time()
    at.run()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if at.exception:
        raise SystemExit(f"{page}: {[e.value for e in at.exception]}")
    started = time.perf_counter()
    at.run()
    return seconds, cpu, time.perf_counter() - started


def _load() -> float:
    return round(os.getloadavg()[0], 1)


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, the child's) of a command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - started, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def _page(store: Path, page: str, request_id: str | None, live: bool) -> tuple[float, float, float]:
    env = {**os.environ, "INFERTRACE_RESULTS": "live" if live else ""}
    command = [sys.executable, __file__, "--render", page, "--store", str(store)]
    if request_id:
        command += ["--request-id", request_id]
    out = subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    wall, cpu, rerun = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu), float(rerun)


def _materialize(store: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Materialises the store's snapshot: each step's wall seconds (as `materialize` returns them) and CPU
    seconds (this process's, all threads)."""
    from infertrace.results import materialize
    from infertrace.store.store import Store

    marks: list[tuple[str, float]] = []  # each step's name and the CPU seconds when it started
    with Store.open(store) as opened:
        spent = materialize(opened, on_progress=lambda step: marks.append((step, time.process_time())))
    ends = [c for _, c in marks[1:]] + [time.process_time()]
    return spent, {step: end - c for (step, c), end in zip(marks, ends, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, help="OTLP JSON lines of the 4-model hour")
    parser.add_argument("--store", type=Path, help="with --render: the store")
    parser.add_argument("--render", help=argparse.SUPPRESS)
    parser.add_argument("--request-id", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--skip-live", action="store_true",
                        help="leave out the first renders without materialised results (INFERTRACE_RESULTS=live): "
                             "only ingest, materialisation and the first renders after it")
    args = parser.parse_args()
    if args.render:
        print(*render_once(args.store, args.render, args.request_id))
        return
    if args.traces is None:
        parser.error("--traces is required")

    from infertrace.store.store import Store

    work = Path(tempfile.mkdtemp(prefix="bench-first-render-"))
    store = work / "store"
    cli = [sys.executable, "-m", "infertrace"]
    rows: list[dict[str, object]] = []
    try:
        from infertrace.store.ingest import ingest_paths

        load = _load()
        started, cpu = time.perf_counter(), time.process_time()
        ingest_paths(store, [args.traces])
        ingest_s, ingest_cpu = time.perf_counter() - started, time.process_time() - cpu
        rows.append({"step": "ingest", "seconds": round(ingest_s, 2), "cpu": round(ingest_cpu, 2), "load": load})
        with Store.open(store) as opened:
            request_id = opened.sql("SELECT request_id FROM requests ORDER BY ttft_ns DESC LIMIT 1").fetchall()[0][0]
        results: dict[str, dict[str, float]] = {"before": {}, "after": {}}
        for phase in ("after",) if args.skip_live else ("before", "after"):
            if phase == "after":
                load = _load()
                started, cpu = time.perf_counter(), time.process_time()
                spent, spent_cpu = _materialize(store)
                materialize_s, materialize_cpu = time.perf_counter() - started, time.process_time() - cpu
                rows.append({"step": "materialise", "seconds": round(materialize_s, 2),
                             "cpu": round(materialize_cpu, 2), "load": load,
                             "detail": {k: round(v, 2) for k, v in spent.items()},
                             "detail_cpu": {k: round(v, 2) for k, v in spent_cpu.items()}})
            for page in PAGES:
                load = _load()
                seconds, cpu, rerun = _page(store, page, request_id if page.endswith("request.py") else None,
                                            phase == "before")
                results[phase][page] = round(seconds, 2)
                rows.append({"step": f"{phase}: first render {page}", "seconds": round(seconds, 2),
                             "cpu": round(cpu, 2), "load": load})
                rows.append({"step": f"{phase}: rerun {page}", "seconds": round(rerun, 2), "cpu": "", "load": load})
            load = _load()
            env = {**os.environ, "INFERTRACE_RESULTS": "live" if phase == "before" else ""}
            for name in QUERIES:
                load = _load()
                wanted = ["--param", f"request_id={request_id}"] if name.startswith(("request_", "prefills_")) else []
                query_s, query_cpu = _timed([*cli, "query", "--store", str(store), name, *wanted, "--format", "csv"],
                                            env)
                results[phase][f"query {name}"] = round(query_s, 2)
                rows.append({"step": f"{phase}: infertrace query {name}", "seconds": round(query_s, 2),
                             "cpu": round(query_cpu, 2), "load": load})
            load = _load()
            report_s, report_cpu = _timed([*cli, "report", "--store", str(store), "--fail-on", "never"], env)
            results[phase]["report"] = round(report_s, 2)
            rows.append({"step": f"{phase}: report (the whole command)", "seconds": round(report_s, 2),
                         "cpu": round(report_cpu, 2), "load": load})
        summary = {"ingest_s": round(ingest_s, 2), "materialise_s": round(materialize_s, 2),
                   "materialise_share_of_ingest": round(materialize_s / ingest_s, 3),
                   "materialise_cpu_share_of_ingest": round(materialize_cpu / ingest_cpu, 3), **results,
                   "rows": rows}
        print(f"{'step':52} {'wall s':>8} {'CPU s':>8} {'load':>5}")
        for row in rows:
            print(f"{row['step']:52} {row['seconds']:>8} {row['cpu']:>8} {row['load']:>5}")
        print(f"materialisation / ingest: {materialize_s / ingest_s:.0%} wall, {materialize_cpu / ingest_cpu:.0%} CPU")
        print("materialisation steps (wall s):", {k: round(v, 2) for k, v in spent.items()})
        print("materialisation steps (CPU s):", {k: round(v, 2) for k, v in spent_cpu.items()})
        if args.json:
            args.json.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
