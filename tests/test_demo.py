"""`infertrace demo` end to end: it simulates the canonical incident, ingests it, prints a report whose top
cause is the injected router, and says how to open the dashboard on that store; a second run reuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertrace.cli import app
from infertrace.store.store import Store


@pytest.mark.slow
def test_demo_simulates_ingests_reports_and_points_at_the_dashboard(tmp_path: Path) -> None:
    out = tmp_path / "demo-store"
    result = CliRunner().invoke(app, ["demo", "--out", str(out), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    truth = json.loads((out / "scenario" / "ground_truth.json").read_text(encoding="utf-8"))
    incidents = doc["sections"]["incidents"]["incidents"]
    assert incidents and incidents[0]["causes"][0]["id"] == truth["root_cause"]["instances"][0]
    assert set(incidents[0]["models"]) == set(truth["root_cause"]["models"])
    assert doc["sections"]["itl"]["stalls"] > 0
    assert f"infertrace dashboard --store {out}" in result.stderr
    assert "Injected: router_latency on router-0" in result.stderr
    with Store.open(out) as store:
        spans = store.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    assert spans == truth["summary"]["spans"]

    again = CliRunner().invoke(app, ["demo", "--out", str(out), "--format", "markdown"])
    assert again.exit_code == 0, again.stderr
    assert "## Incidents and ranked causes" in again.stdout
    with Store.open(out) as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall()[0][0] == spans  # nothing added twice


def test_demo_refuses_a_file_as_its_store_and_a_too_short_run(tmp_path: Path) -> None:
    file = tmp_path / "not-a-dir"
    file.write_text("x", encoding="utf-8")
    refused = CliRunner().invoke(app, ["demo", "--out", str(file)])
    assert refused.exit_code == 2 and "not a directory" in refused.stderr
    short = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "d"), "--duration", "10"])
    assert short.exit_code == 2 and "--duration" in short.stderr
