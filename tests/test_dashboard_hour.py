"""The dashboard stays responsive on one simulated hour of a four-model fleet (with a router incident):
the first load of each page computes its analyses once, and every rerun takes them from the per-snapshot
cache, reading nothing from the store again. Timings are written to test-artifacts/dashboard-hour.json for the
record; how fast a rerun is gets measured in benchmarks/bench_first_render.py, not asserted here (a shared
machine's timings are noise)."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from infertrace.store.ingest import ingest_paths

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("views/fleet.py", "views/itl_spikes.py", "views/incidents.py", "views/prefix_cache.py", "views/runbook.py")


@pytest.mark.slow
def test_every_page_reruns_from_the_cache_on_an_hour_of_a_four_model_fleet(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from reference_engine.scenarios.bank import run_scenario
    from reference_engine.scenarios.families import make_scenario, random_fleet

    root = tmp_path
    fleet = random_fleet(random.Random(4), "hour", num_models=4)
    scenario = make_scenario("router_degradation", 4, duration_s=3600.0, fleet=fleet)
    started = time.monotonic()
    truth = run_scenario(scenario, root / "scenario")
    simulated = time.monotonic() - started
    ingest_paths(root / "store", [root / "scenario" / truth["traces"]])
    assert len(truth["topology"]) == 4 and truth["summary"]["requests"] > 10_000

    monkeypatch.setenv("INFERTRACE_STORE", str(root / "store"))
    monkeypatch.syspath_prepend(str(ROOT / "dashboards"))
    import results  # the module the pages import: every computation reads the store through its reader

    reads: Counter[str] = Counter()
    phase = "cold"
    real_reader = results.reader

    @contextmanager
    def counted_reader(*args: object) -> Iterator[object]:
        reads[phase] += 1
        with real_reader(*args) as store:
            yield store

    monkeypatch.setattr(results, "reader", counted_reader)
    at = AppTest.from_file(str(ROOT / "dashboards" / "app.py"), default_timeout=1800)
    timings: dict[str, dict[str, float]] = {"cold": {}, "warm": {}}
    for phase in ("cold", "warm"):
        for page in PAGES:
            at.switch_page(page)
            t = time.monotonic()
            at.run()
            timings[phase][page] = round(time.monotonic() - t, 2)
            assert not at.exception, (page, [e.value for e in at.exception])
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "dashboard-hour.json").write_text(json.dumps(
        {"requests": truth["summary"]["requests"], "spans": truth["summary"]["spans"],
         "simulate_s": round(simulated, 1), **timings}, indent=1), encoding="utf-8")
    assert reads["cold"] > 0, "the cold pass computed nothing: the spy is not on the pages' path"
    assert reads["warm"] == 0, f"a rerun read the store {reads['warm']} times instead of using the cache"
