"""`infertrace store check` and `repair`: what is wrong with a store directory, and setting it right.

`check` reads every segment (its footer, or with `full` every page), and reports unreadable segments, files
left by writers or compactions that died, the quarantine (how many rejections, the commonest reasons), the
notes (values converted, kept as text, truncated or dropped) and spans stored more than once or with
conflicting content. `repair` moves unreadable segments to `corrupt/` (after salvaging the row groups that
still read into a new segment), removes dead writers' temporaries and orphan compaction sidecars, and
finishes interrupted compactions. Neither ever deletes a readable span.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from infertrace.store import not_a_store
from infertrace.store.compaction import compaction_lock, finish
from infertrace.store.schema import SCHEMA
from infertrace.store.segments import (
    CORRUPT_DIR,
    QUARANTINE_DIR,
    SEGMENT_PREFIX,
    SEGMENT_SUFFIX,
    fsync_dir,
    list_partition,
    partition_dirs,
    remove_stale_temporaries,
    temporaries,
    write_atomically,
    write_parquet,
)
from infertrace.store.store import Store, read_footer, utc_text
from infertrace.store.values import describe


@dataclass
class Health:
    segments: int = 0
    rows: int = 0
    bytes: int = 0
    corrupt: list[tuple[Path, str]] = field(default_factory=list)
    temporaries: list[Path] = field(default_factory=list)
    orphan_sidecars: list[Path] = field(default_factory=list)
    superseded: int = 0  # inputs of finished compactions waiting for their grace period
    quarantined: int = 0  # rejected lines and spans
    reasons: dict[str, int] = field(default_factory=dict)
    notes: dict[str, dict[str, int]] = field(default_factory=dict)
    duplicate_rows: int = 0
    conflicting_spans: int = 0
    first_ns: int | None = None  # the earliest span start and the latest span end (from the footers)
    last_ns: int | None = None

    @property
    def healthy(self) -> bool:
        return not self.corrupt

    def lines(self) -> list[str]:
        times = (f", spans from {utc_text(self.first_ns)} to {utc_text(self.last_ns)}"
                 if self.first_ns is not None and self.last_ns is not None else "")
        out = [f"{self.segments} segments, {self.rows} span rows, {self.bytes / 1e6:.1f} MB{times}."]
        for path, reason in self.corrupt:
            out.append(f"UNREADABLE {path}: {reason} (readers skip it; `infertrace store repair` sets it aside)")
        if self.temporaries:
            out.append(f"{len(self.temporaries)} temporary files of writers that died (repair removes them).")
        if self.orphan_sidecars:
            out.append(f"{len(self.orphan_sidecars)} sidecars of compactions that died before their output "
                       f"(repair removes them).")
        if self.superseded:
            out.append(f"{self.superseded} segments merged by compaction, kept for readers' snapshots until "
                       f"their grace period ends.")
        if self.quarantined:
            top = sorted(self.reasons.items(), key=lambda kv: -kv[1])[:5]
            out.append(f"{self.quarantined} rejected lines or spans in {QUARANTINE_DIR}/; most common: "
                       + "; ".join(f"{r} ({n})" for r, n in top))
        if self.notes:
            out.append("Stored, but " + describe(self.notes) + ".")
        if self.duplicate_rows:
            out.append(f"{self.duplicate_rows} rows repeat a span already stored (read once); "
                       f"{self.conflicting_spans} span ids carry different content (all copies kept in spans_raw).")
        out.append("OK" if self.healthy else "PROBLEMS FOUND")
        return out


def _read_whole(path: Path) -> str | None:
    try:
        pq.read_table(path)
    except (OSError, pa.ArrowException, ValueError) as e:
        return f"cannot read its pages: {e}"
    return None


def check(root: str | Path, full: bool = True) -> Health:
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: {not_a_store(root)}")
    health = Health()
    for folder in partition_dirs(root):
        listing = list_partition(folder)
        health.orphan_sidecars += listing.orphans
        health.superseded += len(listing.superseded)
        for path in listing.segments:
            info = read_footer(path)
            problem = info if isinstance(info, str) else (_read_whole(path) if full else None)
            if problem is not None:
                health.corrupt.append((path, problem))
                continue
            assert not isinstance(info, str)
            health.segments += 1
            health.rows += info.rows
            health.bytes += path.stat().st_size
            firsts = [t for t in (health.first_ns, info.first_start_ns) if t is not None]
            lasts = [t for t in (health.last_ns, info.last_end_ns) if t is not None]
            health.first_ns, health.last_ns = min(firsts, default=None), max(lasts, default=None)
    health.temporaries = list(temporaries(root))
    reasons: Counter[str] = Counter()
    for q in sorted((root / QUARANTINE_DIR).glob("q-*.jsonl")):
        for line in q.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                reasons[str(json.loads(line).get("reason", "?")).split(":")[0]] += 1
            except ValueError:
                reasons["unreadable quarantine line"] += 1
    health.quarantined = sum(reasons.values())
    health.reasons = dict(reasons)
    with Store.open(root) as store:
        health.notes = store.notes
        health.duplicate_rows = store.duplicate_rows
        health.conflicting_spans = store.conflicting_spans
    return health


@dataclass
class RepairSummary:
    set_aside: list[Path] = field(default_factory=list)  # where each unreadable segment went
    salvaged_rows: int = 0
    temporaries: int = 0
    sidecars: int = 0
    removed_superseded: int = 0
    busy: bool = False

    def paragraph(self) -> str:
        if self.busy:
            return "A compaction is running on this store; run repair again when it is done."
        return (f"Set aside {len(self.set_aside)} unreadable segments in {CORRUPT_DIR}/ (salvaged "
                f"{self.salvaged_rows} rows from them); removed {self.temporaries} temporaries of dead writers, "
                f"{self.sidecars} orphan compaction sidecars and {self.removed_superseded} segments "
                f"already merged by compaction.")


def _salvage(path: Path) -> pa.Table | None:
    """The row groups of a segment that still read, or None."""
    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException, ValueError):
        return None
    good = []
    for i in range(parquet.num_row_groups):
        try:
            good.append(parquet.read_row_group(i))
        except (OSError, pa.ArrowException, ValueError):
            continue
    if not good:
        return None
    try:
        return pa.concat_tables([t.select(SCHEMA.names).cast(SCHEMA) for t in good])
    except (pa.ArrowException, KeyError, ValueError):
        return None


def repair(root: str | Path) -> RepairSummary:
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: {not_a_store(root)}")
    summary = RepairSummary()
    with compaction_lock(root) as held:
        if not held:
            summary.busy = True
            return summary
        summary.temporaries = remove_stale_temporaries(root)
        for folder in partition_dirs(root):
            summary.sidecars += len(list_partition(folder).orphans)
            summary.removed_superseded += finish(folder, 0.0)
            for path in list_partition(folder).segments:
                info = read_footer(path)
                problem = info if isinstance(info, str) else _read_whole(path)
                if problem is None:
                    continue
                salvaged = _salvage(path)
                if salvaged is not None and salvaged.num_rows:
                    out = folder / f"{SEGMENT_PREFIX}salvaged-{path.stem.removeprefix(SEGMENT_PREFIX)}{SEGMENT_SUFFIX}"
                    write_atomically(out, lambda f, t=salvaged: write_parquet(t, f))
                    summary.salvaged_rows += salvaged.num_rows
                target = root / CORRUPT_DIR / path.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
                fsync_dir(folder)
                summary.set_aside.append(target)
    return summary
