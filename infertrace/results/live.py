"""The snapshot a long-running reader shows of a store that a collector keeps writing (the dashboard, the
metrics endpoint).

Results are keyed by the segments they came from, so every new segment makes a snapshot with none. A reader
that computed them itself on each new segment would redo the whole store's analyses every few seconds under
steady load (tens of seconds each on an hour of a busy fleet): a dashboard page would never open quickly and a
Prometheus scrape would time out. Instead, `shown_snapshot` gives the current snapshot when its results are
materialised (or none ever were: the reader computes them, once), and otherwise the newest materialised one
(`materialized.latest`) while a background process materialises the current one: the collector's, or one this
process starts (`background.spawn`; one per store at a time). `lag` says how far behind the shown snapshot is.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from infertrace.results import background
from infertrace.results.materialized import is_materialised, latest
from infertrace.store.segments import list_segments

log = logging.getLogger(__name__)

_CHILDREN: dict[str, subprocess.Popen[bytes]] = {}  # per store: the materialisation this process started last


def current_segments(root: str | Path) -> tuple[str, ...]:
    """The store's current segments, as paths relative to it (`Store.open(segments=…)` takes them)."""
    root = Path(root)
    return tuple(sorted(p.relative_to(root).as_posix() for p in list_segments(root)))


def shown_snapshot(root: str | Path) -> tuple[str, ...]:
    """The current segments, or the newest materialised snapshot's while the current one is being materialised."""
    root = Path(root)
    now = current_segments(root)
    if not now or is_materialised(root, (Path(s).name for s in now)):
        return now
    shown = latest(root)
    if shown is None or not all((root / s).is_file() for s in shown.segments):
        return now  # nothing materialised yet, or compaction removed its files: the reader computes it
    child = _CHILDREN.get(str(root))
    if child is not None and child.poll() not in (None, 0, background.BUSY):
        return now  # this process's background materialisation failed (`background.LOG` says why)
    if (child is None or child.poll() is not None) and not background.busy(root):
        try:
            _CHILDREN[str(root)] = background.spawn(root, root / background.LOG)
        except OSError as e:  # a read-only store: the reader computes the current snapshot itself
            log.warning("cannot materialise %s in the background: %s", root, e)
            return now
        log.info("materialising %s in the background (its errors in %s)", root, root / background.LOG)
    return shown.segments


@dataclass(frozen=True)
class Lag:
    """How far a shown snapshot is behind the store: its spans were stored until `data_until` (Unix seconds),
    and `newer_segments` segments have been stored since."""

    data_until: float
    newer_segments: int

    def until_utc(self) -> str:
        """`data_until` as people read it: 2026-01-01 12:00:00 UTC."""
        return datetime.fromtimestamp(self.data_until, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def lag(root: str | Path, shown: tuple[str, ...]) -> Lag | None:
    """The lag of a snapshot `shown_snapshot` gave, or None when it is the store's current one."""
    newer = set(current_segments(root)) - set(shown)
    record = latest(Path(root))
    if not newer or record is None or record.segments != shown:
        return None
    return Lag(record.data_until, len(newer))
