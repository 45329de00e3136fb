"""The store and the collector under hostile input, load and faults: one test per case of the table in
docs/store.md ("What is guaranteed"), each with real clients (the OpenTelemetry OTLP exporters, raw sockets,
`infertrace` as a subprocess, a real tmpfs for a full disk) and fuzzers that generate lone surrogates, huge
values and thousands of keys. Slow: CI runs them with `-m slow`."""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import requests
import zstandard
from google.rpc.status_pb2 import Status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from infertrace.report import ReportOptions, build_report
from infertrace.report.model import SECTIONS
from infertrace.store.collector import Collector
from infertrace.store.compaction import DEFAULT_TARGET_BYTES, compact
from infertrace.store.ingest import ingest_paths
from infertrace.store.schema import SCHEMA
from infertrace.store.segments import list_segments, partition_dirs
from infertrace.store.store import Store

pytestmark = pytest.mark.slow
T0 = 1_767_225_600_000_000_000
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _span(trace_id: int, span_id: int, name: str = "auth", attributes: dict[str, Any] | None = None,
          start: int = T0, end: int | None = None, service: str = "gateway") -> ReadableSpan:
    return ReadableSpan(name=name, context=SpanContext(trace_id, span_id, False, _SAMPLED),
                        resource=Resource({"service.name": service}), kind=SpanKind.INTERNAL,
                        attributes=attributes if attributes is not None else {"gen_ai.request.id": f"r{span_id}"},
                        start_time=start, end_time=start + 1000 if end is None else end)


def _url(c: Collector) -> str:
    return f"http://{c.address}/v1/traces"


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infertrace.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collect(store: Path, *options: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """`infertrace collect` as a subprocess; returns it and its first stdout line (the address)."""
    proc = subprocess.Popen([sys.executable, "-m", "infertrace.cli", "collect", "--store", str(store), *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(line + (proc.stderr.read() if proc.stderr else ""))
    return proc, line


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        _, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate()
    return stderr


# ------------------------------------------------------------------------------------------- load
def test_twenty_clients_sending_two_hundred_small_requests_each_compact_into_few_segments_a_report_reads(
        collector: Collector) -> None:
    acknowledged = []

    def client(k: int) -> None:
        exporter = OTLPSpanExporter(endpoint=_url(collector))
        for i in range(200):
            if exporter.export([_span(k * 1000 + i + 1, k * 1000 + i + 1)]) == SpanExportResult.SUCCESS:
                acknowledged.append(k * 1000 + i + 1)

    clients = [threading.Thread(target=client, args=(k,)) for k in range(20)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(600)
    assert len(acknowledged) == 4000
    segments = list_segments(collector.root)
    assert len(segments) == 4000  # one segment per request
    input_bytes = sum(p.stat().st_size for p in segments)
    compact(collector.root, grace_s=0)
    # Merged into groups of up to DEFAULT_TARGET_BYTES of input per partition (a small segment's size grows with
    # the declared attributes, one typed column each: the bound is in bytes, not a fixed count).
    assert len(list_segments(collector.root)) <= (math.ceil(input_bytes / DEFAULT_TARGET_BYTES)
                                                  * len(partition_dirs(collector.root)))
    with Store.open(collector.root) as store:
        assert store.sql("SELECT count(*), count(DISTINCT span_id) FROM spans_raw").fetchall() == [(4000, 4000)]
        assert build_report(store, ReportOptions(sections=SECTIONS))["sections"]


def test_two_thousand_new_keys_per_request_add_no_column(collector: Collector) -> None:
    exporter = OTLPSpanExporter(endpoint=_url(collector))
    for r in range(20):
        attributes = {f"k{r}.{i}": i for i in range(2000)}
        assert exporter.export([_span(r + 1, r + 1, attributes=attributes)]) == SpanExportResult.SUCCESS
    for segment in list_segments(collector.root):
        assert pq.read_schema(segment).names == SCHEMA.names
    with Store.open(collector.root) as store:
        kept = store.sql("SELECT sum(cardinality(span_attributes)) FROM spans").fetchall()[0][0]
        assert kept == 20 * 1024  # the attribute limit per span; the rest dropped and counted
        assert store.notes["dropped"] == {"<attributes past 1024>": 20 * 976}
        assert store.sql("SELECT span_attributes['k3.7'] FROM spans WHERE span_id = $s",
                         {"s": f"{4:016x}"}).fetchall() == [("7",)]


# ---------------------------------------------------------------------------------------- sockets
def test_sixteen_slowloris_sockets_do_not_delay_a_real_exporter_and_are_cut_off(tmp_path: Path) -> None:
    c = Collector(tmp_path / "store", "127.0.0.1", 0, header_timeout=2.0, compact_interval_s=None)
    c.start()
    host, port = c.address.split(":")
    request = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 99\r\n"
    slow = [socket.create_connection((host, int(port))) for _ in range(16)]
    stop = threading.Event()
    cut_off: list[float] = []
    started = time.monotonic()

    def dribble(s: socket.socket) -> None:
        for i in range(len(request)):
            if stop.is_set():
                return
            try:
                s.sendall(request[i:i + 1])
            except OSError:
                cut_off.append(time.monotonic() - started)
                return
            time.sleep(0.2)
        cut_off.append(float("inf"))  # sent everything: never cut off

    threads = [threading.Thread(target=dribble, args=(s,)) for s in slow]
    try:
        for t in threads:
            t.start()
        exporter = OTLPSpanExporter(endpoint=_url(c), timeout=5)
        for i in range(10):
            sent = time.monotonic()
            assert exporter.export([_span(i + 1, i + 1)]) == SpanExportResult.SUCCESS
            assert time.monotonic() - sent < 2.0
            time.sleep(0.3)
        for t in threads:
            t.join(30)
    finally:
        stop.set()
        c.shutdown()
        for s in slow:
            s.close()
    assert len(cut_off) == 16 and max(cut_off) < 10, cut_off


# ---------------------------------------------------------------------------------------- content
def test_every_member_of_a_two_member_gzip_body_is_stored(collector: Collector) -> None:
    first = encode_spans([_span(1, 1), _span(2, 2)]).SerializeToString()
    body = gzip.compress(first[:30]) + gzip.compress(first[30:])
    r = requests.post(_url(collector), data=body, headers={"Content-Type": "application/x-protobuf",
                                                           "Content-Encoding": "gzip"})
    assert r.status_code == 200
    with Store.open(collector.root) as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall() == [(2,)]


def test_the_same_ids_with_different_content_are_kept_and_counted_never_dropped(collector: Collector) -> None:
    exporter = OTLPSpanExporter(endpoint=_url(collector))
    assert exporter.export([_span(7, 7, attributes={"gen_ai.request.id": "first"})]) == SpanExportResult.SUCCESS
    assert exporter.export([_span(7, 7, attributes={"gen_ai.request.id": "second"})]) == SpanExportResult.SUCCESS
    assert exporter.export([_span(7, 7, attributes={"gen_ai.request.id": "second"})]) == SpanExportResult.SUCCESS
    with Store.open(collector.root) as store:
        versions = store.sql('SELECT DISTINCT "attr.gen_ai.request.id" FROM spans_raw').fetchall()
        assert sorted(versions) == [("first",), ("second",)]
        assert store.conflicting_spans == 1
    health = _cli("store", "check", "--store", str(collector.root))
    assert "1 span ids carry different content" in health.stdout


def test_a_lone_surrogate_quarantines_one_span_in_the_collector_and_in_ingest(collector: Collector,
                                                                              tmp_path: Path) -> None:
    spans = [{"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": "auth",
              "startTimeUnixNano": str(T0 + i), "endTimeUnixNano": str(T0 + i + 5)} for i in range(20)]
    spans[4]["name"] = "x\ud800y"
    body = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    r = requests.post(_url(collector), data=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == "1"
    with Store.open(collector.root) as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall() == [(19,)]
    path = tmp_path / "surrogate.jsonl"
    path.write_text(json.dumps(body) + "\n", encoding="ascii")
    for strict, code in ((False, 0), (True, 1)):
        done = _cli("ingest", "--store", str(tmp_path / "ingested"), "--no-progress",
                    *(["--strict"] if strict else []), str(path))
        assert done.returncode == code and "Traceback" not in done.stderr, done.stderr
        assert "Skipped 0 lines and 1 spans" in " ".join(done.stderr.split())
    with Store.open(tmp_path / "ingested") as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall() == [(19,)]


# ------------------------------------------------------------------------------------------ faults
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_answers_503_with_retry_after_leaves_no_temporary_and_resumes_when_space_returns(
        small_disk: Path) -> None:
    store = small_disk / "store"
    port = _free_port()
    proc, _ = _collect(store, "--listen", f"127.0.0.1:{port}", "--compact-interval", "0")
    url = f"http://127.0.0.1:{port}/v1/traces"
    try:
        exporter = OTLPSpanExporter(endpoint=url)
        assert exporter.export([_span(1, 1)]) == SpanExportResult.SUCCESS
        filler = small_disk / "filler"
        with open(filler, "wb") as f:  # fill the disk
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        big = {f"k{i}": "v" * 2000 for i in range(400)}
        body = encode_spans([_span(2, 2, attributes=big)]).SerializeToString()
        r = requests.post(url, data=body, headers={"Content-Type": "application/x-protobuf"})
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert "cannot write to the store" in Status.FromString(r.content).message
        assert not list(store.rglob("*.tmp"))
        threading.Timer(2.0, filler.unlink).start()  # space returns while the exporter retries
        assert OTLPSpanExporter(endpoint=url, timeout=20).export([_span(2, 2, attributes=big)]) == (
            SpanExportResult.SUCCESS)
    finally:
        stderr = _stop(proc)
    assert "ERROR" in stderr and " 503 " in stderr
    with Store.open(store) as s:
        assert s.sql("SELECT count(*) FROM spans").fetchall() == [(2,)]


def _vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_three_29_mib_bodies_at_once_stay_under_the_memory_limit(tmp_path: Path) -> None:
    spans = [_span(i + 1, i + 1, attributes={f"gen_ai.key{k}": "x" * 20 for k in range(12)})
             for i in range(59_000)]
    body = encode_spans(spans).SerializeToString()
    del spans
    assert 28 << 20 < len(body) < 32 << 20
    port = _free_port()
    proc, _ = _collect(tmp_path / "store", "--listen", f"127.0.0.1:{port}", "--memory-limit-mib", "512",
                       "--compact-interval", "0")
    url = f"http://127.0.0.1:{port}/v1/traces"
    codes: list[int] = []

    def send() -> None:
        while True:
            r = requests.post(url, data=body, headers={"Content-Type": "application/x-protobuf"}, timeout=600)
            codes.append(r.status_code)
            if r.status_code != 503:
                return
            time.sleep(float(r.headers["Retry-After"]))

    try:
        senders = [threading.Thread(target=send) for _ in range(3)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(900)
        peak = _vm_hwm_mb(proc.pid)
    finally:
        _stop(proc)
    assert codes.count(200) == 3 and 503 in codes
    assert peak < 1200, f"peak RSS {peak:.0f} MB"  # 3.1 GB when all three were decoded at once


def _packed(kind: str, first: str, second: str) -> tuple[bytes, int]:
    """`first` then `second` compressed as `kind` (gz, zst), flushed between them so that `first` decodes on its
    own; and where `first`'s bytes end."""
    buffer = io.BytesIO()
    if kind == "gz":
        with gzip.GzipFile(fileobj=buffer, mode="wb") as gz:
            gz.write(first.encode())
            gz.flush()
            complete = buffer.tell()
            gz.write(second.encode())
    else:
        zst = zstandard.ZstdCompressor(write_checksum=True).stream_writer(buffer, closefd=False)
        zst.write(first.encode())
        zst.flush()
        complete = buffer.tell()
        zst.write(second.encode())
        zst.flush(zstandard.FLUSH_FRAME)
    return buffer.getvalue(), complete


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_a_truncated_compressed_file_keeps_its_complete_lines_a_corrupt_one_its_sound_ones_strict_exits_1(
        tmp_path: Path, kind: str) -> None:
    lines = [json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": "auth", "startTimeUnixNano": str(T0),
        "endTimeUnixNano": str(T0 + 1)}]}]}]}) for i in range(6)]
    packed, complete = _packed(kind, "\n".join(lines[:5]) + "\n", lines[5] + "\n")
    cut = tmp_path / f"cut.jsonl.{kind}"  # the sixth line is cut, and the stream ends mid-way
    cut.write_bytes(packed[:(complete + len(packed)) // 2])
    flipped = bytearray(packed)
    flipped[(complete + len(packed)) // 2] ^= 0xFF  # the sixth line's bytes damaged (the checksum says so)
    corrupt = tmp_path / f"corrupt.jsonl.{kind}"
    corrupt.write_bytes(bytes(flipped))
    for path in (cut, corrupt):
        store = tmp_path / f"store-{path.name}"
        lenient = _cli("ingest", "--store", str(store), "--no-progress", str(path))
        with Store.open(store) as opened:
            ids = {int(x, 16) for (x,) in opened.sql("SELECT span_id FROM spans").fetchall()}
        assert lenient.returncode == (0 if ids else 1), lenient.stderr  # 1 only when nothing could be stored
        strict = _cli("ingest", "--store", str(store), "--no-progress", "--strict", str(path))
        assert strict.returncode == 1, strict.stderr
        kept = [json.loads(x) for q in (store / "quarantine").iterdir() for x in q.read_text().splitlines()]
        assert any("unreadable" in k["reason"] for k in kept), path.name
        if path is cut:
            assert ids == {1, 2, 3, 4, 5}  # every line before the cut
        else:  # what the decoder read with the damage may be lost with it, but nothing damaged is stored
            assert ids <= {1, 2, 3, 4, 5}


def test_a_huge_single_line_file_is_quarantined_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "')
        chunk = b"x" * (1 << 20)
        for _ in range(300):  # a 300 MB line
            f.write(chunk)
        f.write(b'"}]}]}]}\n')
        f.write(lines_after := json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
            "traceId": f"{1:032x}", "spanId": f"{1:016x}", "name": "auth", "startTimeUnixNano": str(T0),
            "endTimeUnixNano": str(T0 + 1)}]}]}]}).encode() + b"\n")
    assert lines_after
    probe = ("import resource, subprocess, sys; "
             "done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024); "
             "print(done.stderr, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "infertrace.cli", "ingest", "--store",
                           str(tmp_path / "store"), "--no-progress", str(path)], capture_output=True, text=True,
                          timeout=600)
    code, peak_mb = map(int, done.stdout.split())
    assert code == 0, done.stderr
    assert peak_mb < 600, f"peak RSS {peak_mb} MB for a 300 MB line"
    kept = [json.loads(x) for q in (tmp_path / "store" / "quarantine").iterdir() for x in q.read_text().splitlines()]
    assert len(kept) == 1 and "over the limit" in kept[0]["reason"] and len(kept[0]["record"]) < 1000
    with Store.open(tmp_path / "store") as store:
        assert store.sql("SELECT count(*) FROM spans").fetchall() == [(1,)]


def test_a_truncated_and_an_empty_segment_leave_the_store_readable_until_repaired(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = _cli("simulate", "--duration", "5", "--seed", "1", "--no-progress", "--out", str(tmp_path / "s.jsonl"))
    assert done.returncode == 0, done.stderr
    split = tmp_path / "split.jsonl"  # the same spans, 40 to a line, so that ingest writes many segments
    with open(tmp_path / "s.jsonl") as src, open(split, "w") as dst:
        for line in src:
            data = json.loads(line)
            for rs in data["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for i in range(0, len(ss["spans"]), 40):
                        part = {**rs, "scopeSpans": [{**ss, "spans": ss["spans"][i:i + 40]}]}
                        dst.write(json.dumps({"resourceSpans": [part]}) + "\n")
    ingest_paths(store, [split], block_bytes=20_000)
    segments = list_segments(store)
    assert len(segments) > 2
    data = segments[0].read_bytes()
    segments[0].write_bytes(data[: len(data) // 3])
    segments[1].write_bytes(b"")
    report = _cli("report", "--store", str(store), "--format", "json", "--fail-on", "never")
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stderr
    assert _cli("store", "check", "--store", str(store)).returncode == 1
    assert _cli("store", "repair", "--store", str(store)).returncode == 0
    assert _cli("store", "check", "--store", str(store)).returncode == 0


def test_since_inf_exits_2_with_a_message_in_query_and_report(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    for args in (["query", "--store", str(tmp_path / "store"), "rate_limited_by_tenant", "--param", "since=inf"],
                 ["report", "--store", str(tmp_path / "store"), "--since", "inf"]):
        done = _cli(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr and "inf" in done.stderr


def test_empty_exports_other_methods_and_paths(collector: Collector) -> None:
    assert requests.post(_url(collector), data=b"", headers={"Content-Type": "application/x-protobuf"}
                         ).status_code == 200
    r = requests.get(_url(collector), headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 405 and Status.FromString(r.content).code == 12
    r = requests.post(f"http://{collector.address}/v1/logs", data=b"", headers={"Content-Type": "application/json"})
    assert r.status_code == 404 and r.json()["code"] == 5


def test_impossible_times_huge_strings_and_ten_thousand_attributes_are_limited_and_counted(
        collector: Collector) -> None:
    exporter = OTLPSpanExporter(endpoint=_url(collector))
    spans = [
        _span(1, 1, start=T0 + 10_000, end=T0),  # ends before it starts
        _span(2, 2, start=1_000, end=2_000),  # 1970
        _span(3, 3, attributes={"gen_ai.request.id": "r3", "note": "y" * (1 << 20)}),  # a 1 MB string
        _span(4, 4, attributes={f"k{i}": i for i in range(10_000)}),  # 10k attributes
        _span(5, 5),
    ]
    body = encode_spans(spans).SerializeToString()
    r = requests.post(_url(collector), data=body, headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 200
    assert exporter.export(spans) == SpanExportResult.SUCCESS  # a partial success is a success
    with Store.open(collector.root) as store:
        assert sorted(x for (x,) in store.sql("SELECT span_id FROM spans").fetchall()) == [
            f"{i:016x}" for i in (3, 4, 5)]
        assert store.sql("SELECT length(span_attributes['note']) FROM spans WHERE span_id = $s",
                         {"s": f"{3:016x}"}).fetchall() == [(16 * 1024,)]
        assert store.notes["truncated"] == {"note": 1}
        assert store.notes["dropped"] == {"<attributes past 1024>": 10_000 - 1024}
    reasons = [json.loads(x)["reason"] for q in (collector.root / "quarantine").iterdir()
               for x in q.read_text().splitlines()]
    assert any("before startTimeUnixNano" in r for r in reasons) and any("before 2000" in r for r in reasons)


# ---------------------------------------------------------------------------------------- network
def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_an_exposed_collector_warns_without_a_token_and_takes_it_from_a_file_or_the_environment_over_tls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # requests lets these override the exporter's CA file
        monkeypatch.delenv(name, raising=False)
    proc, _ = _collect(tmp_path / "open", "--listen", "0.0.0.0:0", "--compact-interval", "0")
    stderr = " ".join(_stop(proc).split())
    assert "WARNING: listening on 0.0.0.0 without a token" in stderr
    cert, key = _self_signed(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text("t0ps3cret\n")
    port, grpc_port = _free_port(), _free_port()
    for how in ("file", "env"):
        env = {**os.environ, "INFERTRACE_COLLECT_TOKEN": "t0ps3cret"} if how == "env" else None
        options = ["--token-file", str(token_file)] if how == "file" else []
        proc, line = _collect(tmp_path / how, "--listen", f"127.0.0.1:{port}", "--grpc", f"127.0.0.1:{grpc_port}",
                              "--tls-cert", str(cert), "--tls-key", str(key), "--compact-interval", "0", *options,
                              env=env)
        try:
            assert f"https://127.0.0.1:{port}/v1/traces" in line
            assert "t0ps3cret" not in Path(f"/proc/{proc.pid}/cmdline").read_text()
            url = f"https://127.0.0.1:{port}/v1/traces"
            denied = OTLPSpanExporter(endpoint=url, certificate_file=str(cert))
            assert denied.export([_span(1, 1)]) == SpanExportResult.FAILURE
            allowed = OTLPSpanExporter(endpoint=url, certificate_file=str(cert),
                                       headers={"Authorization": "Bearer t0ps3cret"})
            assert allowed.export([_span(2, 2)]) == SpanExportResult.SUCCESS
            import grpc

            grpc_exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", headers={
                "authorization": "Bearer t0ps3cret"}, credentials=grpc.ssl_channel_credentials(cert.read_bytes()))
            assert grpc_exporter.export([_span(3, 3)]) == SpanExportResult.SUCCESS
        finally:
            _stop(proc)
        with Store.open(tmp_path / how) as store:
            assert store.sql("SELECT count(*) FROM spans").fetchall() == [(2,)]


# ----------------------------------------------------------------------------------------- fuzzers
_text = st.one_of(st.text(max_size=12), st.sampled_from(["\ud800", "a\udfffb", "\x00", "é" * 3]),
                  st.integers(0, 200_000).map(lambda n: "z" * n))
_value = st.one_of(_text.map(lambda s: {"stringValue": s}), st.integers(-(2**70), 2**70).map(
    lambda i: {"intValue": str(i)}), st.floats().map(lambda f: {"doubleValue": f if f == f else "NaN"}),
    st.lists(_text, max_size=3).map(lambda xs: {"arrayValue": {"values": [{"stringValue": x} for x in xs]}}),
    st.just({"kvlistValue": {"values": []}}), st.just({}))
_attributes = st.one_of(
    st.lists(st.fixed_dictionaries({"key": _text, "value": _value}), max_size=6),
    st.integers(1000, 3000).map(lambda n: [{"key": f"many.{i}", "value": {"intValue": str(i)}} for i in range(n)]),
    st.fixed_dictionaries({"key": st.sampled_from(["gen_ai.response.finish_reasons", "gen_ai.usage.input_tokens",
                                                   "infertrace.step.durations_ns", "gen_ai.request.id"]),
                           "value": _value}).map(lambda kv: [kv]))
_fuzz_span = st.fixed_dictionaries({
    "traceId": st.integers(1, 2**128 - 1).map(lambda i: f"{i:032x}"),
    "spanId": st.integers(1, 2**64 - 1).map(lambda i: f"{i:016x}"),
    "name": _text, "startTimeUnixNano": st.integers(0, 2**63 - 1).map(str),
    "endTimeUnixNano": st.integers(0, 2**63 - 1).map(str), "attributes": _attributes})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spans=st.lists(_fuzz_span, min_size=1, max_size=4))
def test_fuzzed_surrogates_huge_values_and_thousands_of_keys_are_stored_or_quarantined_never_a_500(
        collector: Collector, spans: list[dict[str, Any]]) -> None:
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]})
    r = requests.post(_url(collector), data=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    rejected = int(r.json().get("partialSuccess", {}).get("rejectedSpans", 0))
    with Store.open(collector.root) as store:
        ids = {s["spanId"] for s in spans}
        stored = store.sql("SELECT count(DISTINCT span_id) FROM spans WHERE list_contains($ids, span_id)",
                           {"ids": sorted(ids)}).fetchall()[0][0]
    assert stored + rejected >= len(ids)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spans=st.lists(_fuzz_span, min_size=1, max_size=4))
def test_fuzzed_lines_never_crash_ingest(tmp_path_factory: pytest.TempPathFactory,
                                         spans: list[dict[str, Any]]) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    path = root / "in.jsonl"
    path.write_text("".join(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) + "\n" for s in spans))
    summary = ingest_paths(root / "store", [path])
    assert summary.spans_read + summary.rejected_spans == len(spans)
    with Store.open(root / "store") as store:
        assert store.sql("SELECT count(*) FROM spans_raw").fetchall() == [(summary.spans_new,)]

