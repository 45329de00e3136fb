"""Materialisation while a collector writes: a thread that notices new segments and, once no new one has
arrived for a few seconds (a burst of exports is over) or the oldest change not yet materialised has waited
`max_wait_s` (engines under steady load export every few seconds, so their stream never settles), materialises
the new snapshot's results.

The analyses run in a child process at a lower CPU priority (`nice` 10), not in the collector: a long
materialisation must never take the interpreter or the CPU from the write path, whose answers exporters are
waiting for. `python -m infertrace.results.background DIR [WINDOW_S]` is that child: it materialises DIR's
snapshot once (with WINDOW_S, the snapshot of that analysis window: `store.window_segments`).
One materialisation runs per store at a time (a lock file under `derived/`): a child that finds another at work
(the collector's, or the dashboard's for the snapshot it is behind on) exits with `BUSY` and is tried again later.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

NICENESS = 10
LOCK = Path("derived") / ".materialize.lock"
LOG = Path("derived") / "materialize.log"  # what background materialisations a reader started wrote to stderr
BUSY = 75  # the child's exit status when another materialisation of the store holds the lock (EX_TEMPFAIL)


def spawn(root: Path, log_file: Path | None = None, window_s: float | None = None) -> subprocess.Popen[bytes]:
    """Starts a child process that materialises the store's current snapshot (of the analysis window, with
    `window_s`; see `main`). Its standard error goes to a pipe for the caller to read (`communicate`), or, for a
    caller that does not wait for it, appended to `log_file` (a pipe nobody reads would stop the child once
    full)."""
    command = [sys.executable, "-m", "infertrace.results.background", str(root)]
    if window_s is not None:
        command.append(repr(float(window_s)))
    if log_file is None:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as stderr:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)


@contextmanager
def materialising(root: Path, wait: bool) -> Iterator[bool]:
    """Holds the store's materialisation lock for the block (True), or yields False at once when another
    process holds it and `wait` is False."""
    lock = Path(root) / LOCK
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "ab") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def busy(root: Path) -> bool:
    """Whether a materialisation of the store is under way (in any process)."""
    try:
        with open(Path(root) / LOCK, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            return False
    except FileNotFoundError:
        return False


class Materializer:
    """Watches a store directory and materialises its snapshot (of the analysis window, with `window_s`)
    `settle_s` after the last change of its segment list, or `max_wait_s` after the first change not yet
    materialised, whichever comes first."""

    def __init__(self, root: Path, settle_s: float = 5.0, poll_s: float = 1.0, max_wait_s: float = 60.0,
                 window_s: float | None = None) -> None:
        self.root = Path(root)
        self.window_s = window_s
        self.settle_s = settle_s
        self.poll_s = poll_s
        self.max_wait_s = max_wait_s
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
        from infertrace.results.live import current_segments

        return current_segments(self.root, self.window_s) if self.root.is_dir() else ()

    def _materialize(self) -> int:
        """One child process over the current snapshot; its exit status (0: done, `BUSY`: another was at it)."""
        self._child = spawn(self.root, window_s=self.window_s)
        _, stderr = self._child.communicate()
        code, self._child = self._child.returncode, None
        if code not in (0, BUSY) and not self._stop.is_set():
            log.error("materialising %s failed (exit %s): %s", self.root, code,
                      stderr.decode(errors="replace").strip()[-2000:])
        return code

    def _run(self) -> None:
        done = seen = self._snapshot()
        changed_at = time.monotonic()
        pending_since: float | None = None  # when a snapshot other than the materialised one was first seen
        retry_at = 0.0
        while not self._stop.wait(self.poll_s):
            current, now = self._snapshot(), time.monotonic()
            if current != seen:
                seen, changed_at = current, now
            if current == done or not current:
                pending_since = None
                continue
            if pending_since is None:
                pending_since = now
            if now < retry_at or (now - changed_at < self.settle_s and now - pending_since < self.max_wait_s):
                continue
            started = time.monotonic()
            code = self._materialize()
            if code == 0:
                log.info("materialised a snapshot of %d segments in %.1f s", len(current), time.monotonic() - started)
            if code == BUSY:  # another process is materialising: try again once it may be done
                retry_at = time.monotonic() + self.settle_s
                continue
            if code == 0:
                self.runs += 1
            done, pending_since = current, None  # a failed snapshot is not retried: the next one is


def main(root: str, window_s: float | None = None) -> None:
    from infertrace.results.materialized import materialize
    from infertrace.store.store import Store

    os.nice(NICENESS)
    with materialising(Path(root), wait=False) as held:
        if not held:
            sys.exit(BUSY)
        with Store.open(root, window_s=window_s) as store:
            materialize(store)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else None)
