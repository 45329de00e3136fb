"""The collector and compaction as subprocesses: killed with SIGKILL while a client sends (and while the
collector compacts in the background), or in the middle of `infertrace store compact`, they lose no
acknowledged span and show none twice; readers keep querying while they write."""

from __future__ import annotations

import json
import math
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import requests

from infertrace.store.receiver import Receiver
from infertrace.store.segments import list_segments
from infertrace.store.store import Store

T0 = 1_767_225_600_000_000_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(store: Path, port: int, *options: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "infertrace.cli", "collect", "--store", str(store),
                             "--listen", f"127.0.0.1:{port}", "--log-level", "warning", *options],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    return proc


def _body(batch: int, spans: int) -> bytes:
    """An export of `spans` llm_request spans with ids unique to `batch`."""
    out = []
    for i in range(spans):
        start = T0 + (batch * spans + i) * 1_000_000
        out.append({"traceId": f"{batch + 1:016x}{i + 1:016x}", "spanId": f"{batch + 1:08x}{i + 1:08x}",
                    "name": "llm_request", "kind": 2, "startTimeUnixNano": str(start),
                    "endTimeUnixNano": str(start + 5_000_000),
                    "attributes": [{"key": "gen_ai.request.id", "value": {"stringValue": f"b{batch}-{i}"}},
                                   {"key": "gen_ai.usage.input_tokens", "value": {"intValue": str(100 + i)}}]})
    return json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "llm-engine"}}]}, "scopeSpans": [{"spans": out}]}]}).encode()


@pytest.mark.slow
def test_sigkill_at_random_points_loses_no_acknowledged_span_and_stores_none_twice(tmp_path: Path) -> None:
    store, port = tmp_path / "store", _free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    compacting = ("--compact-interval", "0.2", "--compact-min-age", "0", "--grace", "0")  # kills land in merges
    proc = _start(store, port, *compacting)
    acknowledged: set[str] = set()
    batches, spans_per_batch = 40, 200
    done = threading.Event()

    def client() -> None:
        for b in range(batches):
            body = _body(b, spans_per_batch)
            while True:  # as an exporter does: retry the same body until it is acknowledged
                try:
                    r = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=10)
                    if r.status_code == 200:
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.02)
            acknowledged.update(f"{b + 1:08x}{i + 1:08x}" for i in range(spans_per_batch))
        done.set()

    sender = threading.Thread(target=client, daemon=True)
    sender.start()
    rng = random.Random(7)
    kills = 0
    try:
        while not done.is_set() and kills < 4:
            time.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
            proc = _start(store, port, *compacting)
        sender.join(120)
        assert done.is_set(), "the client never got every batch acknowledged"
    finally:
        proc.kill()
        proc.wait(10)
    assert kills >= 2
    for segment in list_segments(store):
        pq.read_table(segment)  # no corrupt segment
    with Store.open(store) as s:
        counts = dict(s.sql("SELECT span_id, count(*) FROM spans_raw GROUP BY span_id").fetchall())
    assert acknowledged <= set(counts)
    assert len(acknowledged) == batches * spans_per_batch
    assert max(counts.values()) == 1
    assert len(list_segments(store)) < batches  # compaction ran between the kills


@pytest.mark.slow  # one of the longest in the default run; CI runs it with the slow set
def test_sigkill_during_store_compact_never_loses_or_repeats_a_span(tmp_path: Path) -> None:
    store = tmp_path / "store"
    receiver = Receiver(store)
    rng = random.Random(3)
    kills = 0
    expected = 0
    for round_ in range(8):
        for b in range(40):  # every run finds small segments to merge
            receiver.store_json(_body(round_ * 40 + b, 20), "test")
        expected += 40 * 20
        sidecars = set(store.rglob("*.replaces"))
        proc = subprocess.Popen([sys.executable, "-m", "infertrace.cli", "store", "compact", "--store", str(store),
                                 "--grace", "0", "--target-mib", "1"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        # killed mid-merge, not after a fixed sleep (a quiet machine finished before one): once the run has written
        # a merge's sidecar (its first step), within a few milliseconds of it
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and set(store.rglob("*.replaces")) <= sidecars:
            time.sleep(0.001)
        time.sleep(rng.uniform(0.0, 0.01))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(30)
        with Store.open(store) as s:  # after every kill: every span exactly once, in whatever state it left
            assert s.sql("SELECT count(*), count(DISTINCT span_id) FROM spans_raw").fetchall() == [
                (expected, expected)]
            assert not s.skipped
    stored = sum(p.stat().st_size for p in list_segments(store))
    done = subprocess.run([sys.executable, "-m", "infertrace.cli", "store", "compact", "--store", str(store),
                           "--grace", "0", "--target-mib", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert kills >= 1
    # Merged into about one segment per MiB of input (a segment's size grows with the declared attributes, one
    # typed column each, so the bound is in bytes, not a fixed count).
    assert len(list_segments(store)) <= math.ceil(stored / 2**20) + 1 < 320 // 10
    assert not list(store.rglob("*.tmp")) and not list(store.rglob("*.replaces"))
    with Store.open(store) as s:
        assert s.sql("SELECT count(*), count(DISTINCT span_id) FROM spans_raw").fetchall() == [(expected, expected)]


@pytest.mark.slow
def test_a_reader_keeps_querying_while_the_collector_writes(tmp_path: Path) -> None:
    store, port = tmp_path / "store", _free_port()
    url = f"http://127.0.0.1:{port}/v1/traces"
    proc = _start(store, port)
    batches, spans_per_batch = 30, 50
    writing = threading.Event()
    finished = threading.Event()
    looked = threading.Event()  # the reader finished one more snapshot
    observed: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            with Store.open(store) as s:  # one long-lived connection, like a dashboard's
                writing.wait(10)
                while not finished.is_set():
                    s.refresh()
                    spans = s.sql("SELECT count(*) FROM spans").fetchall()[0][0]
                    rows = s.sql("SELECT count(*) FROM requests").fetchall()[0][0]
                    assert spans == rows
                    observed.append(spans)
                    looked.set()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        writing.set()
        for b in range(batches):
            r = requests.post(url, data=_body(b, spans_per_batch), headers={"Content-Type": "application/json"},
                              timeout=10)
            assert r.status_code == 200
            time.sleep(0.01)
            if b % 5 == 4:  # let the reader take a snapshot mid-write however slow its queries are on this machine
                looked.clear()
                looked.wait(30)
    finally:
        finished.set()
        thread.join(30)
        proc.kill()
        proc.wait(10)
    assert not errors, errors
    assert len(observed) >= 5
    assert observed == sorted(observed)  # never goes back
    assert all(n % spans_per_batch == 0 for n in observed)  # never a half-written segment
    assert len(set(observed)) > 0
    with Store.open(store) as s:
        assert s.sql("SELECT count(*) FROM requests").fetchall() == [(batches * spans_per_batch,)]


@pytest.mark.slow
def test_infertrace_simulate_exports_over_otlp_http_to_infertrace_collect(tmp_path: Path) -> None:
    store, port = tmp_path / "store", _free_port()
    proc = _start(store, port)
    try:
        done = subprocess.run([sys.executable, "-m", "infertrace.cli", "simulate", "--duration", "10", "--seed", "4",
                               "--no-progress", "--otlp-endpoint", f"http://127.0.0.1:{port}/v1/traces"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        subprocess.run([sys.executable, "-m", "infertrace.cli", "simulate", "--duration", "10", "--seed", "4",
                        "--no-progress", "--out", str(tmp_path / "same.jsonl")], check=True, capture_output=True,
                       timeout=120)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    ingested = tmp_path / "from_file"
    subprocess.run([sys.executable, "-m", "infertrace.cli", "ingest", "--store", str(ingested), "--no-progress",
                    str(tmp_path / "same.jsonl")], check=True, capture_output=True, timeout=120)
    query = "SELECT * EXCLUDE (scope_version) FROM spans ORDER BY trace_id, span_id"
    with Store.open(store) as received, Store.open(ingested) as from_file:
        got, want = received.sql(query).fetchall(), from_file.sql(query).fetchall()
        requests_ = received.sql("SELECT count(*) FROM requests").fetchall()[0][0]
    assert got == want and len(got) > 100 and requests_ > 10
