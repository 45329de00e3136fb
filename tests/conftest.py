"""Fixtures several test modules share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infertrace.store.collector import Collector


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    """`infertrace collect` with its defaults on 127.0.0.1 (a free port), into `tmp_path / "store"`; no compaction."""
    c = Collector(tmp_path / "store", "127.0.0.1", 0, compact_interval_s=None)
    c.start()
    yield c
    c.shutdown()
