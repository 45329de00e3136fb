"""Materialisation while a collector writes: a thread that notices new segments and, once no new one has
arrived for a few seconds (a burst of exports is over), materialises the new snapshot's results.

The analyses run in a child process at a lower CPU priority (`nice` 10), not in the collector: a long
materialisation must never take the interpreter or the CPU from the write path, whose answers exporters are
waiting for. `python -m infertrace.results.background DIR` is that child: it materialises DIR's snapshot once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from infertrace.store.segments import list_segments

log = logging.getLogger(__name__)

NICENESS = 10


class Materializer:
    """Watches a store directory; `settle_s` after the last change of its segment list, materialises it."""

    def __init__(self, root: Path, settle_s: float = 5.0, poll_s: float = 1.0) -> None:
        self.root = Path(root)
        self.settle_s = settle_s
        self.poll_s = poll_s
        self.runs = 0  # snapshots materialised
        self._stop = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="infertrace-materializer", daemon=True)

    def start(self) -> Materializer:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops watching; a materialisation under way is cut short (what it wrote is whole or absent)."""
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.terminate()
        self._thread.join(timeout_s)

    def _snapshot(self) -> tuple[str, ...]:
        return tuple(p.name for p in list_segments(self.root)) if self.root.is_dir() else ()

    def _materialize(self) -> bool:
        """One child process over the current snapshot; whether it succeeded."""
        self._child = subprocess.Popen([sys.executable, "-m", "infertrace.results.background", str(self.root)],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, stderr = self._child.communicate()
        code, self._child = self._child.returncode, None
        if code != 0 and not self._stop.is_set():
            log.error("materialising %s failed (exit %s): %s", self.root, code,
                      stderr.decode(errors="replace").strip()[-2000:])
        return code == 0

    def _run(self) -> None:
        done = seen = self._snapshot()
        changed_at = time.monotonic()
        while not self._stop.wait(self.poll_s):
            current = self._snapshot()
            if current != seen:
                seen, changed_at = current, time.monotonic()
                continue
            if current == done or not current or time.monotonic() - changed_at < self.settle_s:
                continue
            if self._materialize():
                self.runs += 1
            done = current  # a failed snapshot is not retried: the next one is


def main(root: str) -> None:
    from infertrace.results.materialized import materialize
    from infertrace.store.store import Store

    os.nice(NICENESS)
    with Store.open(root) as store:
        materialize(store)


if __name__ == "__main__":
    main(sys.argv[1])
