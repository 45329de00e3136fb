"""The snapshot a long-running reader shows of a store that a collector keeps writing (the dashboard, the
metrics endpoint).

Results are keyed by the segments they came from, so every new segment makes a snapshot with none. A reader
that computed them itself on each new segment would redo the whole store's analyses every few seconds under
steady load (tens of seconds each on an hour of a busy fleet): a dashboard page would never open quickly and a
Prometheus scrape would time out. Instead, `shown_snapshot` gives the current snapshot when its results are
materialised (or none ever were: the reader computes them, once), and otherwise the newest materialised one
(`materialized.latest`) while a background process materialises the current one: the collector's, or one this
process starts (`background.spawn`; one per store at a time). `lag` says how far behind the shown snapshot is.

A store a collector keeps for days (`--retain 7d`) would make every snapshot's analyses cover every day it holds,
each new burst of segments costing as much as the whole store: an analysis window (`window_s`: `collect
--analysis-window 6h`, `dashboard --analysis-window 6h`) makes a snapshot only the segments holding spans of the
store's last `window_s` seconds of data (`store.window_segments`), so each costs what the window holds. Segments
are taken or left whole, so a snapshot may reach further back than the window (`covered` says how far), and a
request in flight at the window's start whose earlier spans are in a segment left out is seen from the window on.
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
from infertrace.store.store import read_footer, window_segments

log = logging.getLogger(__name__)

_CHILDREN: dict[str, subprocess.Popen[bytes]] = {}  # per store: the materialisation this process started last


def current_segments(root: str | Path, window_s: float | None = None) -> tuple[str, ...]:
    """The store's current segments, as paths relative to it (`Store.open(segments=…)` takes them); with a
    `window_s`, those of the window (`window_segments`)."""
    root = Path(root)
    if window_s is not None:
        return window_segments(root, window_s)
    return tuple(sorted(p.relative_to(root).as_posix() for p in list_segments(root)))


@dataclass(frozen=True)
class Covered:
    """What a snapshot covers: its segments of the store's, and the times of their spans (Unix ns; None when no
    footer gives them)."""

    segments: int
    store_segments: int
    first_ns: int | None
    last_ns: int | None


def covered(root: str | Path, snapshot: tuple[str, ...]) -> Covered:
    """The times a snapshot's segments cover, from their footers."""
    root = Path(root)
    infos = [info for info in (read_footer(root / s) for s in snapshot) if not isinstance(info, str)]
    firsts = [i.first_start_ns for i in infos if i.first_start_ns is not None]
    lasts = [i.last_end_ns for i in infos if i.last_end_ns is not None]
    return Covered(len(snapshot), len(list_segments(root)), min(firsts, default=None), max(lasts, default=None))


def shown_snapshot(root: str | Path, window_s: float | None = None) -> tuple[str, ...]:
    """The current segments (of the window, with `window_s`), or the newest materialised snapshot's while the
    current one is being materialised."""
    root = Path(root)
    now = current_segments(root, window_s)
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
            _CHILDREN[str(root)] = background.spawn(root, root / background.LOG, window_s)
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


def lag(root: str | Path, shown: tuple[str, ...], window_s: float | None = None) -> Lag | None:
    """The lag of a snapshot `shown_snapshot` gave (with the same `window_s`), or None when it is the store's
    current one."""
    root = Path(root)
    record = latest(root)
    if record is None or record.segments != shown:
        return None
    newer = [s for s in set(current_segments(root, window_s)) - set(shown)
             if _written_after(root / s, record.data_until)]
    return Lag(record.data_until, len(newer)) if newer else None


def _written_after(path: Path, when: float) -> bool:
    """Whether the segment was written after `when` (Unix seconds): a segment older than a snapshot's newest that
    is not in it was left out by an analysis window, not stored since."""
    try:
        return path.stat().st_mtime > when
    except OSError:
        return False
