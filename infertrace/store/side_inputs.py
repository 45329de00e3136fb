"""Inputs that are not spans, each into a relation of its own: a streaming client's token times and vLLM's
iteration log (docs/sources.md). They never enter the span segments (no input may add span columns).

Layout, beside `spans/`:

    client_tokens/part-<key>.parquet    one row per token: request_id, model, sent_ns, token_index, time_ns, source
    iteration_log/part-<key>.parquet    one row per vLLM iteration line (`ITERATION_COLUMNS`)

Each file is written atomically (temporary + rename) under a key that hashes its rows, so ingesting the same
file again adds nothing. A line that cannot be read is quarantined with its file, line and reason, as a bad span
line is; every good line is kept.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from infertrace.otlp_files import text_in
from infertrace.store.batch import Rejection
from infertrace.store.segments import ensure_dir, write_atomically, write_parquet, write_quarantine

CLIENT_TOKENS_DIR = "client_tokens"
ITERATION_LOG_DIR = "iteration_log"

CLIENT_TOKENS_SCHEMA = pa.schema([
    ("request_id", pa.string()), ("model", pa.string()), ("sent_ns", pa.int64()), ("token_index", pa.int32()),
    ("time_ns", pa.int64()), ("source", pa.string())])

# vLLM's --enable-logging-iteration-details line (vllm/v1/engine/core.py, `log_iteration_details`), with the
# logger's prefix: `(EngineCore_DP0 pid=2378) INFO 01-15 10:23:45 [core.py:397] Iteration(17): …`.
ITERATION_LINE = re.compile(
    r"(?:\((?P<core>[A-Za-z]+_DP(?P<rank>\d+))\s+pid=(?P<pid>\d+)\)\s+)?"
    r"(?:(?P<level>[A-Z]+)\s+(?P<date>\d{2}-\d{2})\s+(?P<time>\d{2}:\d{2}:\d{2})(?:\.\d+)?\s.*?)?"
    r"Iteration\((?P<iteration>\d+)\):\s+"
    r"(?P<ctx_req>\d+)\s+context requests,\s+(?P<ctx_tok>\d+)\s+context tokens,\s+"
    r"(?P<gen_req>\d+)\s+generation requests,\s+(?P<gen_tok>\d+)\s+generation tokens,\s+"
    r"iteration elapsed time:\s+(?P<elapsed>[0-9.]+)\s*ms(?P<dummy>\s*\(dummy\))?")

ITERATION_SCHEMA = pa.schema([
    ("log", pa.string()), ("line", pa.int64()), ("dp_rank", pa.int32()), ("pid", pa.int64()),
    ("iteration", pa.int64()), ("stamp", pa.string()), ("context_requests", pa.int32()),
    ("context_tokens", pa.int64()), ("generation_requests", pa.int32()), ("generation_tokens", pa.int64()),
    ("elapsed_ns", pa.int64()), ("dummy", pa.bool_())])


@dataclass
class SideSummary:
    files: int = 0
    rows: int = 0
    new_rows: int = 0
    rejected: int = 0
    quarantine: list[Path] = field(default_factory=list)

    def paragraph(self, what: str, unit: str) -> str:
        text = (f"Ingested {self.rows} {unit} of {what} from {self.files} files: {self.new_rows} new, "
                f"{self.rows - self.new_rows} already stored.")
        if self.rejected:
            text += f" Skipped {self.rejected} lines, kept in {', '.join(map(str, self.quarantine))}."
        return text


SNIFF_BYTES = 1 << 20  # of a line looked at to tell what the file is


def sniff(path: Path) -> str | None:
    """'client-tokens', 'vllm-iteration-log' or None (OTLP or unknown), from the first lines of a file."""
    try:
        with text_in(path) as f:
            for _ in range(50):
                line = f.readline(SNIFF_BYTES)  # never a whole huge line: ingest quarantines those unread
                if not line:
                    break
                text = line.strip()
                if not text:
                    continue
                if ITERATION_LINE.search(text):
                    return "vllm-iteration-log"
                if text.startswith("{") and '"token_ns"' in text and '"resourceSpans"' not in text:
                    return "client-tokens"
                if text.startswith("{"):
                    return None
    except (OSError, EOFError):
        return None
    return None


def _write(root: Path, directory: str, table: pa.Table) -> int:
    """Writes the rows under a key of their content; returns how many were new."""
    if not table.num_rows:
        return 0
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    key = hashlib.sha256(sink.getvalue()).hexdigest()[:40]
    folder = root / directory
    ensure_dir(folder)
    path = folder / f"part-{key}.parquet"
    if path.exists():
        return 0
    write_atomically(path, lambda f: write_parquet(table, f))
    return table.num_rows


def parse_client_tokens(lines: IO[str], source: str) -> tuple[pa.Table, list[Rejection]]:
    """The documented JSON lines (request_id, optional model and sent_ns, token_ns: integer ns, never
    decreasing). A line that breaks the format is rejected with the reason."""
    cols: dict[str, list[object]] = {name: [] for name in CLIENT_TOKENS_SCHEMA.names}
    rejected = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        reason = None
        try:
            record = json.loads(text)
        except ValueError as e:
            record, reason = None, f"not JSON: {e}"
        if reason is None:
            reason = _client_line_problem(record)
        if reason is not None:
            rejected.append(Rejection(source, number, reason, text[:4096]))
            continue
        times = record["token_ns"]
        cols["request_id"] += [str(record["request_id"])] * len(times)
        cols["model"] += [record.get("model")] * len(times)
        cols["sent_ns"] += [record.get("sent_ns")] * len(times)
        cols["token_index"] += list(range(len(times)))
        cols["time_ns"] += times
        cols["source"] += [source] * len(times)
    return pa.table(cols, schema=CLIENT_TOKENS_SCHEMA), rejected


def _client_line_problem(record: object) -> str | None:
    if not isinstance(record, dict):
        return "not a JSON object"
    rid = record.get("request_id")
    if not isinstance(rid, str) or not rid:
        return "no request_id (a non-empty string)"
    times = record.get("token_ns")
    if not isinstance(times, list) or not times:
        return "no token_ns (a non-empty list of integer nanoseconds)"
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 63 for t in times):
        return "token_ns holds something other than integer nanoseconds"
    if any(b < a for a, b in itertools.pairwise(times)):
        return "token_ns decreases (a stream delivers tokens in order)"
    sent = record.get("sent_ns")
    if sent is not None and (not isinstance(sent, int) or isinstance(sent, bool)):
        return "sent_ns is not integer nanoseconds"
    model = record.get("model")
    if model is not None and not isinstance(model, str):
        return "model is not a string"
    return None


def parse_iteration_log(lines: IO[str], log: str) -> pa.Table:
    """Every iteration line of a vLLM log (other lines are the engine's own and skipped)."""
    cols: dict[str, list[object]] = {name: [] for name in ITERATION_SCHEMA.names}
    for number, line in enumerate(lines, 1):
        m = ITERATION_LINE.search(line)
        if m is None:
            continue
        cols["log"].append(log)
        cols["line"].append(number)
        cols["dp_rank"].append(int(m["rank"]) if m["rank"] else None)
        cols["pid"].append(int(m["pid"]) if m["pid"] else None)
        cols["iteration"].append(int(m["iteration"]))
        cols["stamp"].append(f"{m['date']} {m['time']}" if m["date"] else None)
        cols["context_requests"].append(int(m["ctx_req"]))
        cols["context_tokens"].append(int(m["ctx_tok"]))
        cols["generation_requests"].append(int(m["gen_req"]))
        cols["generation_tokens"].append(int(m["gen_tok"]))
        cols["elapsed_ns"].append(round(float(m["elapsed"]) * 1e6))
        cols["dummy"].append(bool(m["dummy"]))
    return pa.table(cols, schema=ITERATION_SCHEMA)


def _log_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".zst", ".log", ".txt"):
        name = name.removesuffix(suffix)
    return name


def ingest_side_inputs(root: Path, paths: list[Path], kind: str, labels: dict[str, str] | None = None
                       ) -> SideSummary:
    """Client token files (`kind` 'client-tokens') or vLLM iteration logs ('vllm-iteration-log') into the store.
    An iteration log's name (without .log/.gz/.zst) is its engine instance, as the engine's spans name it.
    `labels`: what to call a file in rejections instead of its path (`<stdin>` for a copy of standard input)."""
    summary = SideSummary()
    rejected: list[Rejection] = []
    for path in paths:
        summary.files += 1
        with text_in(path) as f:
            if kind == "client-tokens":
                table, bad = parse_client_tokens(f, (labels or {}).get(str(path), str(path)))
                rejected += bad
                requests = len(set(table.column("request_id").to_pylist()))
                summary.rows += requests
                summary.new_rows += requests if _write(root, CLIENT_TOKENS_DIR, table) else 0
            elif kind == "vllm-iteration-log":
                table = parse_iteration_log(f, _log_name(path))
                if not table.num_rows:
                    rejected.append(Rejection(str(path), 0, "no vLLM iteration line (was the engine started "
                                              "with --enable-logging-iteration-details?)", ""))
                summary.rows += table.num_rows
                summary.new_rows += _write(root, ITERATION_LOG_DIR, table)
            else:
                raise ValueError(f"unknown input kind {kind!r}")
    summary.rejected = len(rejected)
    quarantined = write_quarantine(root, rejected)
    if quarantined is not None:
        summary.quarantine.append(quarantined)
    return summary


def side_files(root: Path, directory: str) -> list[Path]:
    folder = root / directory
    return sorted(folder.glob("part-*.parquet")) if folder.is_dir() else []


def readable_files(paths: list[Path]) -> list[Path]:
    """The files whose footer reads (a damaged one is left out, as a damaged span segment is)."""
    out = []
    for p in paths:
        try:
            pq.read_metadata(p)
        except (OSError, pa.ArrowException, ValueError):
            continue
        out.append(p)
    return out
