"""Report golden files: the report over each sample incident in sample_traces/, in every format, must equal
tests/golden/<sample>.<ext>. After an intended change (an analyzer's numbers, the layout), regenerate with
`INFERTRACE_UPDATE_GOLDEN=1 python -m pytest tests/test_report_golden.py -m "slow or not slow"` and review the
diff. Two samples run by default; all of them with -m slow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infertrace.report import FORMATS, build_report, render
from infertrace.store.store import Store
from tests.incident_stores import SAMPLES, sample_store

GOLDEN = Path(__file__).resolve().parent / "golden"
EXTENSIONS = {"table": "txt", "markdown": "md", "json": "json", "html": "html"}
DEFAULT = ("prefill_storm", "rate_limiter_flapping")
ALL = tuple(sorted(p.parent.name for p in SAMPLES.glob("*/ground_truth.json")))


def _rendered(sample: str) -> dict[str, str]:
    with Store.open(sample_store(sample).store) as store:
        doc = build_report(store)
    return {fmt: render(doc, fmt) for fmt in FORMATS}


def _check(sample: str) -> None:
    rendered = _rendered(sample)
    for fmt, text in rendered.items():
        path = GOLDEN / f"{sample}.{EXTENSIONS[fmt]}"
        if os.environ.get("INFERTRACE_UPDATE_GOLDEN"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        assert path.exists(), f"{path} missing: regenerate with INFERTRACE_UPDATE_GOLDEN=1"
        assert text == path.read_text(encoding="utf-8"), f"{sample} {fmt} report differs from {path}"


def test_golden_samples_cover_every_sample_incident() -> None:
    assert set(DEFAULT) <= set(ALL) and len(ALL) >= 5
    assert {p.stem for p in GOLDEN.glob("*.json")} == set(ALL)


@pytest.mark.parametrize("sample", DEFAULT)
def test_report_equals_its_golden_files_in_every_format(sample: str) -> None:
    _check(sample)


@pytest.mark.slow
@pytest.mark.parametrize("sample", [s for s in ALL if s not in DEFAULT])
def test_report_on_every_other_sample_equals_its_golden_files(sample: str) -> None:
    _check(sample)
