"""`infertrace evaluate --jobs N`: scenarios scored in parallel processes give the same sections, in the same order,
as scored one after another."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertrace.cli import app
from infertrace.evaluation import ScenarioPool


def _slow_first(scenario: Path) -> str:
    if scenario.name == "a":
        time.sleep(1.0)  # finishes after the others
    if scenario.name == "bad":
        raise FileNotFoundError(f"{scenario}: no ground truth")
    return scenario.name.upper()


def test_a_pool_of_processes_returns_the_scores_in_the_scenarios_order_not_the_order_they_finish_in() -> None:
    seen: list[tuple[int, int]] = []
    scenarios = [Path(name) for name in ("a", "b", "c")]
    assert ScenarioPool(2, lambda done, total: seen.append((done, total))).map(_slow_first, scenarios) == \
        ["A", "B", "C"]
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]


def test_a_scenario_that_fails_in_a_worker_raises_its_own_error() -> None:
    with pytest.raises(FileNotFoundError, match="bad: no ground truth"):
        ScenarioPool(2).map(_slow_first, [Path("b"), Path("bad"), Path("c")])


def test_evaluate_refuses_a_jobs_count_under_one_and_parallel_scoring_through_chdb(tmp_path: Path) -> None:
    runner = CliRunner()
    zero = runner.invoke(app, ["evaluate", str(tmp_path), "--jobs", "0"])
    assert zero.exit_code == 2 and "--jobs must be ≥ 1, got 0" in zero.output
    chdb = runner.invoke(app, ["evaluate", str(tmp_path), "--jobs", "2", "--backend", "chdb"])
    assert chdb.exit_code == 2 and "--jobs 2 with --backend chdb" in chdb.output
    with pytest.raises(ValueError, match="jobs must be ≥ 1"):
        ScenarioPool(0)


@pytest.mark.slow
def test_evaluate_with_two_jobs_gives_every_section_as_one_job_does(tmp_path: Path) -> None:
    runner = CliRunner()
    bank = tmp_path / "one"
    generated = runner.invoke(app, [
        "scenarios", "generate", "--out", str(bank), "--seed", "0", "--count", "6", "--duration", "60",
        "--family", "prefill_storm", "--family", "router_degradation", "--family", "engine_regression",
        "--family", "assistant_prefill_runaway", "--family", "cpu_decode_host", "--family", "cross_dc_read_write",
        "--no-progress"])
    assert generated.exit_code == 0, generated.output
    whatif = runner.invoke(app, ["scenarios", "whatif", "--out", str(bank), "--seed", "11", "--count", "2",
                                 "--duration", "40"])
    assert whatif.exit_code == 0, whatif.output
    shutil.copytree(bank, tmp_path / "two")  # each run ingests its own stores
    sections = {}
    for jobs, where in ((1, "one"), (2, "two")):
        out = runner.invoke(app, ["evaluate", str(tmp_path / where), "--format", "json", "--jobs", str(jobs)])
        assert out.exit_code == 0, out.output
        sections[jobs] = json.loads(out.stdout.replace(str(tmp_path / where), "BANK"))
        sections[jobs]["itl"].pop("seconds")  # wall-clock time
    one, two = sections[1], sections[2]
    assert one["rca"]["cases"] == 3 and one["rca"]["lift"]["cases"] == 1 and one["pd"]["rca"]["cases"] == 1
    assert one["itl"]["scenarios"] == 6 and one["pd"]["cases"] == 1 and one["whatif"]["scenarios"] == 2
    assert list(two) == list(one) == ["itl", "rca", "pd", "whatif"]
    assert two == one
