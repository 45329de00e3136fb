"""Score a root-cause scenario bank in parallel: what `infertrace evaluate BANK --section rca` computes, with one
process per scenario (at most --jobs at a time) and without the ±60 s onset-sensitivity rows when --no-shifts.

    .venv/bin/python benchmarks/rca_bank.py rca-large/ --jobs 2 --no-shifts --json rca-large.json

Each scenario goes through `evaluation.rca.evaluate_scenario`, as `evaluate` does; the cases are aggregated by
`RcaEvaluation` and printed by `render_rca`, then every case not ranked first (or not in the top three) is listed.
"""

from __future__ import annotations

import argparse
import json
from multiprocessing import Pool
from pathlib import Path

import infertrace.evaluation.rca as rca_eval
from infertrace.evaluation import scenario_dirs
from infertrace.evaluation.rca import LiftResult, RcaEvaluation, ScenarioResult, render_rca


def _score(job: tuple[Path, bool]) -> tuple[list[ScenarioResult], LiftResult | None]:
    path, shifts = job
    if not shifts:
        rca_eval.SHIFTS_S = ()
    found, lift, _ = rca_eval.evaluate_scenario(path)
    return found, lift


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bank", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-shifts", action="store_true", help="skip the ±60 s onset-sensitivity rows (CPU)")
    parser.add_argument("--json", type=Path, help="write the evaluation's JSON document here")
    args = parser.parse_args()
    if args.no_shifts:  # the aggregation reads it too
        rca_eval.SHIFTS_S = ()
    jobs = [(path, not args.no_shifts) for path in scenario_dirs(args.bank)]
    results: list[ScenarioResult] = []
    lifts: list[LiftResult] = []
    with Pool(args.jobs, maxtasksperchild=1) as pool:
        for found, lift in pool.imap(_score, jobs):
            results += found
            if lift is not None:
                lifts.append(lift)
    document = RcaEvaluation(tuple(results), tuple(lifts)).to_json()
    print(render_rca(document))
    for r in results:
        if r.hit_at[0] < 0.999 or r.hit_at[2] < 0.999:
            print(f"not first: {r.scenario} {r.truth}, top {r.top}, hits at 1-3 {[round(h, 2) for h in r.hit_at[:3]]}")
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
