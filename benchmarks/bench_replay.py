"""What-if replay of an hour of one model's traffic: how long `infertrace replay` takes, stage by stage, beside the
bare engine serving the same requests.

    .venv/bin/python benchmarks/bench_replay.py [--workload PATH] [--duration 3600] [--repeat 3] [--workdir DIR]
    .venv/bin/python benchmarks/bench_replay.py --store DIR --model M     # a store you already have

Without `--store`, the Azure conversation trace's hour is simulated on one Llama-3-8B / H100 engine (prefill-first,
16384-token budget, prefix caching on), traced to a file and ingested (with its materialisation) into DIR/store once,
before anything is timed. Then, each run a fresh process, the contenders interleaved in an order rotated at each
repetition (benchmarks/side_by_side.py), medians reported:

- `command`: the whole `infertrace replay --store S --model M --set chunk=512 --no-save`, as a user types it
  (Python's start-up and imports, opening the store, reading the capture, the baseline and one variant);
- `stages`: in one process, each stage timed apart: reading the capture (`read_capture` on the store with its
  materialised relations attached, as the command opens it), the baseline replay, and one replay per variant of
  VARIANTS (chunk budget, policy, max_num_seqs, replicas, tensor parallelism, P/D split, prefix caching);
- `calibrated`: fitting the cost model to the capture's step spans (`replay --calibrate`), then the baseline replay;
- `engine`: the bare engine (`LLMEngine.run`, no observer) on the capture's requests with the captured config: what
  a replay costs beyond the engine's own loop (the one-model fleet, its router, per-request bookkeeping and the ITL
  and KV statistics every replay reports).

The figure the issue asks about is "runs in seconds for an hour of one model's traffic": the `command` row, and per
variant the simulated seconds per CPU second.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import side_by_side

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = ("command", "stages", "calibrated", "engine")
VARIANTS = ("chunk=512", "policy=decode_first", "max_num_seqs=64", "replicas=2", "tp=2", "pd=1:1",
            "prefix_caching=false")


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> dict[str, float]:
    return {"wall_s": time.perf_counter() - start[0], "cpu_s": time.process_time() - start[1]}


def _capture(store: Path, model: str) -> Any:
    from infertrace.replay.capture import read_capture
    from infertrace.results.relations import open_reader

    with open_reader(store) as opened:
        return read_capture(opened, model)


def _replay(requests: Any, deployment: Any) -> dict[str, float]:
    """One replay as `infertrace replay` runs it (the engine's run, then the distribution it reports), timed."""
    from infertrace.cli.replay import run_distribution
    from reference_engine.api import replay

    start = _clock()
    run = replay(list(requests), deployment)
    run_distribution(run)
    return {**_since(start), "simulated_s": (run.last_finish_ns - run.first_arrival_ns) / 1e9}


def worker(contender: str, store: Path, model: str) -> dict[str, Any]:
    """One run of `contender` in this (fresh) process."""
    result: dict[str, Any] = {"contender": contender}
    if contender == "stages":
        from infertrace.replay.deployment import apply_settings, parse_setting

        start = _clock()
        capture = _capture(store, model)
        result["read capture"] = _since(start)
        result["requests"] = len(capture.requests)
        for name, settings in [("baseline", []), *((v, [parse_setting(p) for p in v.split(",")]) for v in VARIANTS)]:
            result[name] = _replay(capture.requests, apply_settings(capture.deployment, settings))
    elif contender == "calibrated":
        from infertrace.cli.replay import calibrate_from_capture
        from infertrace.results.relations import open_reader

        capture = _capture(store, model)
        start = _clock()
        with open_reader(store) as opened:
            capture, result["sentence"] = calibrate_from_capture(opened, capture)
        result["calibrate"] = _since(start)
        result["calibrated baseline"] = _replay(capture.requests, capture.deployment)
    else:  # engine
        from reference_engine.engine.llm_engine import LLMEngine
        from reference_engine.replay import engine_requests, fleet_of

        capture = _capture(store, model)
        requests = engine_requests(list(capture.requests), model)
        engine = LLMEngine(fleet_of(capture.deployment).models[0].engine_config("bare"))
        start = _clock()
        ended = engine.run(requests)
        result["bare engine"] = {**_since(start), "simulated_s": (max(s.finish_ns or 0 for s in ended)
                                                                 - requests[0].arrival_ns) / 1e9}
    return result


def _command(store: Path, model: str) -> dict[str, Any]:
    """The whole CLI command in a fresh process: its wall time and CPU time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu, start = usage.ru_utime + usage.ru_stime, time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "infertrace", "replay", "--store", str(store), "--model", model,
                           "--set", "chunk=512", "--no-save"], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"infertrace replay failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"contender": "command", "command": {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime - cpu},
            "process_wall_s": wall, "process_cpu_s": usage.ru_utime + usage.ru_stime - cpu, "output": done.stdout}


def _prepare(args: Any) -> tuple[Path, str]:
    """The store to replay: --store, else the workload's hour simulated, traced and ingested into --workdir."""
    if args.store is not None:
        return args.store, args.model
    store = args.workdir / "store"
    if not (store / "spans").is_dir():
        args.workdir.mkdir(parents=True, exist_ok=True)
        trace = args.workdir / "hour.jsonl.zst"
        cli = [sys.executable, "-m", "infertrace"]
        print(f"simulating {args.duration:.0f} s of {args.workload.name} and ingesting it into {store} …",
              file=sys.stderr, flush=True)
        subprocess.run([*cli, "simulate", "--workload", "azure", "--workload-file", str(args.workload),
                        "--duration", str(args.duration), "--seed", "0", "--out", str(trace)],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        subprocess.run([*cli, "ingest", str(trace), "--store", str(store)], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
    return store, args.model


def main() -> None:
    parser = side_by_side.parser(__doc__, CONTENDERS, repeat=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/infertrace-bench-replay"))
    parser.add_argument("--store", type=Path, help="replay this store instead of simulating the workload's hour")
    parser.add_argument("--model", default="llama-3-8b")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.store, args.model)))
        return
    store, model = _prepare(args)
    load_before = os.getloadavg()

    def run(contender: str) -> dict[str, Any]:
        if contender == "command":
            return _command(store, model)
        return side_by_side.fresh_process(__file__, ["--worker", contender, "--store", str(store),
                                                     "--model", model])

    runs = side_by_side.interleaved(CONTENDERS, args.repeat, run)
    stages = runs["stages"][0]
    print(f"store {store}: {model}, {stages['requests']} requests; medians of {args.repeat} fresh processes per "
          f"contender, interleaved; load average before {load_before[0]:.1f}, during the runs "
          f"{min(r['load_average'] for c in runs.values() for r in c):.1f}–"
          f"{max(r['load_average'] for c in runs.values() for r in c):.1f}")
    print("| stage | wall s | CPU s | simulated s | simulated s per CPU s |")
    print("|---|---|---|---|---|")
    rows = [("command", "command"), ("stages", "read capture"), ("stages", "baseline"),
            *(("stages", v) for v in VARIANTS), ("calibrated", "calibrate"), ("calibrated", "calibrated baseline"),
            ("engine", "bare engine")]
    medians: dict[str, dict[str, float]] = {}
    for contender, stage in rows:
        figures = [r[stage] for r in runs[contender]]
        m = {key: statistics.median(f[key] for f in figures) for key in figures[0]}
        medians[stage] = m
        speed = f"{m['simulated_s'] / m['cpu_s']:.0f}×" if "simulated_s" in m else "—"
        simulated = f"{m['simulated_s']:.0f}" if "simulated_s" in m else "—"
        label = ("`infertrace replay … --set chunk=512` (the whole command)" if stage == "command" else stage)
        print(f"| {label} | {m['wall_s']:.2f} | {m['cpu_s']:.2f} | {simulated} | {speed} |")
    base, bare = medians["baseline"], medians["bare engine"]
    print(f"the baseline replay costs {base['cpu_s'] / bare['cpu_s']:.2f}× the bare engine's CPU time on the same "
          f"requests; {runs['calibrated'][0]['sentence']}")
    print(runs["command"][0]["output"].rstrip())
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
