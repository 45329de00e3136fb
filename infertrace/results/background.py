"""Materialisation while a collector writes: a thread that notices new segments and, once no new one has
arrived for a few seconds (a burst of exports is over), materialises the new snapshot's results."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from infertrace.results.materialized import materialize
from infertrace.store.segments import list_segments

log = logging.getLogger(__name__)


class Materializer:
    """Watches a store directory; `settle_s` after the last change of its segment list, materialises it."""

    def __init__(self, root: Path, settle_s: float = 5.0, poll_s: float = 1.0) -> None:
        self.root = Path(root)
        self.settle_s = settle_s
        self.poll_s = poll_s
        self.runs = 0  # snapshots materialised
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infertrace-materializer", daemon=True)

    def start(self) -> Materializer:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _snapshot(self) -> tuple[str, ...]:
        return tuple(p.name for p in list_segments(self.root)) if self.root.is_dir() else ()

    def _run(self) -> None:
        from infertrace.store.store import Store

        done = seen = self._snapshot()
        changed_at = time.monotonic()
        while not self._stop.wait(self.poll_s):
            current = self._snapshot()
            if current != seen:
                seen, changed_at = current, time.monotonic()
                continue
            if current == done or not current or time.monotonic() - changed_at < self.settle_s:
                continue
            try:
                with Store.open(self.root) as store:
                    materialize(store)
                self.runs += 1
                done = current
            except Exception:  # never let the collector's helper die: log, and try the next snapshot
                log.exception("materialising %s failed", self.root)
                done = current
