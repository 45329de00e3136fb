"""Issue 22's counting checks, as figures: per fleet or scenario, `requests` rows against the gateway's calls (and
the simulator's own count, for the fleets), disaggregated rows, leg problems, and the largest difference between a
request's TTFT phases (`ttft_breakdown`'s: gateway, prefill queue, prefill, KV transfer, decode queue, first
decode) and its client TTFT.

    .venv/bin/python benchmarks/pd_request_counts.py fleets          # tests/test_request_legs.py's two fleets
    .venv/bin/python benchmarks/pd_request_counts.py BANK            # each scenario of a bank

Gateway calls a rate limiter rejected (429) reach no engine and have no `requests` row: they are printed apart.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from infertrace.evaluation import load_truth, open_scenario_store, scenario_dirs
from infertrace.store.store import Store

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("gateway_ns + queue_ns + prefill_ns + coalesce(kv_transfer_ns, 0) + coalesce(decode_queue_ns, 0) "
          "+ coalesce(first_decode_ns, 0) - client_ttft_ns")
COUNTS = f"""SELECT (SELECT count(*) FROM requests), (SELECT count(DISTINCT request_id) FROM requests),
    (SELECT count(*) FROM component_calls WHERE component = 'gateway'),
    (SELECT count(*) FROM component_calls WHERE component = 'gateway' AND http_status = 429),
    (SELECT count(*) FROM requests WHERE serving = 'disaggregated'), (SELECT count(leg_problem) FROM requests),
    (SELECT count(*) FROM requests WHERE outcome = 'ok'),
    (SELECT max(abs({PHASES})) FROM requests WHERE outcome = 'ok'),
    (SELECT count(*) FROM requests WHERE outcome = 'ok' AND abs({PHASES}) > 1000000)"""


def figures(store: Store, name: str, simulated: int | None = None) -> str:
    n, distinct, gateway, rejected, disaggregated, problems, ok, worst, over = store.sql(COUNTS).fetchall()[0]
    return (f"{name}: requests {n} (distinct {distinct}); gateway calls {gateway}, {rejected} of them 429s"
            + ("" if simulated is None else f"; simulated {simulated}")
            + f"; disaggregated {disaggregated}; leg problems {problems}; answered {ok}: max |phases − client TTFT| "
            f"{worst} ns, {over} over 1 ms")


def main(target: str) -> None:
    if target != "fleets":
        for scenario in scenario_dirs(target):
            with open_scenario_store(scenario) as store:
                print(figures(store, load_truth(scenario)["scenario"]), flush=True)
        return
    sys.path.insert(0, str(ROOT))
    from tests.fleet_traces import fleet_from_toml
    from tests.test_request_legs import CPU_DECODE, _run

    example = fleet_from_toml((ROOT / "examples" / "fleets" / "disaggregated.toml").read_text(encoding="utf-8"))
    work = Path(tempfile.mkdtemp(prefix="pd-counts-"))
    for name, spec, duration_s, seed in (("examples/fleets/disaggregated.toml, 30 s, seed 1", example, 30.0, 1),
                                         ("L4 prefill + CPU-host decode, 60 s, seed 2", fleet_from_toml(CPU_DECODE),
                                          60.0, 2)):
        (work / str(seed)).mkdir()
        run = _run(spec, work / str(seed), duration_s, seed)
        with Store.open(run.store) as store:
            print(figures(store, name, run.gateway_requests), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
