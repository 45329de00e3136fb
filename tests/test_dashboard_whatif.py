"""The dashboard's What if page under AppTest, on a copy of the demo incident's store: without a kept replay it
says there is nothing to compare and how to make one; with one it shows the capture, the baseline and each
variant, and their distributions side by side."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from infertrace.cli.replay import what_if
from infertrace.replay.capture import read_capture
from infertrace.replay.deployment import apply_settings
from infertrace.replay.saved import save_whatif
from infertrace.store.store import Store
from tests.incident_stores import demo_store

APP = str(Path(__file__).resolve().parents[1] / "dashboards" / "app.py")


def page(store: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("INFERTRACE_STORE", str(store))
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("views/whatif.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture(scope="module")
def store_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("whatif-dashboard") / "store"
    shutil.copytree(demo_store().store, copy)
    return copy


def test_without_a_kept_replay_the_page_says_there_is_nothing_to_compare(store_copy: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    at = page(store_copy, monkeypatch)
    assert any("keeps no what-if replay" in w.value for w in at.warning)


def test_the_page_shows_a_kept_replay_beside_the_capture_with_its_distributions(
        store_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store.open(store_copy) as store:
        capture = read_capture(store, "llama-3-8b")
    result = what_if(capture, [("chunk=512", apply_settings(capture.deployment, [("chunk", "512")]))], False)
    save_whatif(store_copy, result.to_json())
    at = page(store_copy, monkeypatch)
    table = next(d.value for d in at.dataframe if "config" in d.value.columns)
    assert list(table["config"]) == ["captured", "baseline replay", "chunk=512"]
    assert table["ITL p99"].tolist() == pytest.approx([result.observed.itl_p99_ms,
                                                       result.baseline.predicted.itl_p99_ms,
                                                       result.variants[0].predicted.itl_p99_ms])
    assert any(result.trust.sentence() == m.value for m in [*at.success, *at.warning])
    (chart,) = at.get("vega_lite_chart")
    data = pa.ipc.open_stream(chart.proto.datasets[0].data.data).read_pandas()
    assert set(data["config"]) == {"captured", "baseline replay", "chunk=512"}
    assert json.loads(chart.proto.spec)["encoding"]["x"]["scale"]["type"] == "log"
