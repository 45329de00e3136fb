"""How bench_engine.py and bench_replicas.py measure their contenders side by side: each run a fresh process (its
wall time, and the CPU time of it and every process it started), the contenders interleaved in an order rotated
at each repetition, the load average noted after each run."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_WORKLOAD = Path(__file__).resolve().parents[2] / "shared" / "workloads" / "azure_conv_2023.csv"


def parser(doc: str, modes: Sequence[str], repeat: int) -> argparse.ArgumentParser:
    """The options both benchmarks take; `--worker MODE` runs one mode in the process itself (fresh_process)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    p.add_argument("--duration", type=float, default=3600.0)
    p.add_argument("--repeat", type=int, default=repeat, help="interleaved repetitions; medians are reported")
    p.add_argument("--blis", type=Path, help="a BLIS binary, in the directory of its defaults.yaml")
    p.add_argument("--json", type=Path, help="also write every run's figures here")
    p.add_argument("--baseline", type=Path, help="another checkout to time against this one, interleaved")
    p.add_argument("--worker", choices=modes, help=argparse.SUPPRESS)
    p.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return p


def use_tree(tree: Path | None) -> None:
    """In a worker: import the engine code of the checkout `tree` (`--baseline`), ahead of this checkout's and of
    the import hook of an editable install of it."""
    if tree is not None:
        sys.path.insert(0, str(tree))
        sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fresh_process(script: str, arguments: list[str]) -> dict[str, Any]:
    """Runs `script ARGUMENTS` in a new interpreter: the JSON object it prints last, with `process_wall_s` and
    `process_cpu_s` (the worker and whatever it started and waited for, e.g. a span writer)."""
    cpu, start = _cpu_of_children(), time.perf_counter()
    done = subprocess.run([sys.executable, script, *arguments], capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = time.perf_counter() - start
    result["process_cpu_s"] = _cpu_of_children() - cpu
    return result


def interleaved(contenders: Sequence[str], repeat: int, run: Callable[[str], dict[str, Any]],
                label: str = "") -> dict[str, list[dict[str, Any]]]:
    """`repeat` runs of each contender, repetition i in the order rotated by i; progress on stderr."""
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
    for i in range(repeat):
        for contender in [*contenders[i % len(contenders):], *contenders[:i % len(contenders)]]:
            result = run(contender)
            result["load_average"] = os.getloadavg()[0]
            runs[contender].append(result)
            print(f"  {label}{contender}: {result.get('sim_wall_s', result['process_wall_s']):.2f} s sim, "
                  f"{result['process_wall_s']:.2f} s process (load {result['load_average']:.1f})",
                  file=sys.stderr, flush=True)
    return runs
