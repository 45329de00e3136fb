"""The collector under load while readers loop: 20 OTLP/HTTP exporters send for 2 minutes into
`infertrace collect` (a subprocess, compacting in the background) while this process opens the store and
builds the report, and runs a runbook query, over and over.

    .venv/bin/python benchmarks/bench_collector_load.py                 # the full run: 20 exporters, 120 s
    .venv/bin/python benchmarks/bench_collector_load.py --duration 20   # a quick look

Each exporter is the SDK's `OTLPSpanExporter` (retrying 503 after Retry-After) sending batches of
`--batch` vLLM-shaped `llm_request` spans with unique ids, from a client subprocess. Printed: acknowledged
spans per second; live segments before and after the final compaction; report latency (first, last, p50,
p99); query latency; peak RSS of the collector and of the reader; and the checks the issue asks for: every
acknowledged span stored exactly once, no reader error, the last report at most 2x the first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CLIENTS = r"""
import json, sys, threading, time
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

url, clients, batch, deadline = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
T0 = 1_767_225_600_000_000_000
flags = TraceFlags(TraceFlags.SAMPLED)
acknowledged, failed = [], []

def client(k):
    exporter = OTLPSpanExporter(endpoint=url, timeout=30)
    resource = Resource({"service.name": "vllm", "service.instance.id": f"engine-{k % 4}"})
    seq = 0
    while time.time() < deadline:
        spans = []
        for _ in range(batch):
            seq += 1
            sid = (k + 1) << 40 | seq
            start = T0 + seq * 50_000_000 + k * 1_000_000
            spans.append(ReadableSpan(
                name="llm_request", context=SpanContext(sid, sid, False, flags), resource=resource,
                kind=SpanKind.SERVER, start_time=start, end_time=start + 900_000_000,
                attributes={"gen_ai.request.id": f"c{k}-{seq}", "gen_ai.request.model": f"model-{k % 3}",
                            "gen_ai.usage.prompt_tokens": 500 + seq % 700, "gen_ai.usage.completion_tokens": 64,
                            "gen_ai.latency.time_in_queue": 0.01, "gen_ai.latency.time_to_first_token": 0.08,
                            "gen_ai.latency.e2e": 0.9, "gen_ai.response.finish_reasons": '["stop"]'}))
        ids = [format(s.context.span_id, "016x") for s in spans]
        (acknowledged if exporter.export(spans) == SpanExportResult.SUCCESS else failed).extend(ids)

threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"acknowledged": acknowledged, "failed": len(failed)}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds the exporters send")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--batch", type=int, default=100, help="spans per export")
    parser.add_argument("--compact-interval", type=float, default=30.0, help="the collector's option")
    parser.add_argument("--compact-min-age", type=float, default=10.0, help="the collector's option")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    from infertrace.report import ReportOptions, build_report
    from infertrace.report.model import SECTIONS
    from infertrace.runbook import run_query
    from infertrace.store.compaction import compact
    from infertrace.store.segments import list_segments
    from infertrace.store.store import Store

    workdir = Path(tempfile.mkdtemp(prefix="infertrace-load-"))
    store = workdir / "store"
    port = _free_port()
    collector = subprocess.Popen(
        [sys.executable, "-m", "infertrace.cli", "collect", "--store", str(store), "--listen", f"127.0.0.1:{port}",
         "--compact-interval", str(args.compact_interval), "--compact-min-age", str(args.compact_min_age),
         "--grace", "30", "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT)
    assert collector.stdout is not None
    assert "listening on" in collector.stdout.readline()
    deadline = time.time() + args.duration
    clients = subprocess.Popen([sys.executable, "-c", CLIENTS, f"http://127.0.0.1:{port}/v1/traces",
                                str(args.clients), str(args.batch), str(deadline)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    reports: list[tuple[float, float]] = []  # (time since start, seconds)
    queries: list[float] = []
    errors: list[str] = []
    segments_seen: list[int] = []
    start = time.time()

    def read_loop() -> None:
        while time.time() < deadline:
            try:
                t = time.perf_counter()
                with Store.open(store) as s:
                    segments_seen.append(len(s.segments))
                    build_report(s, ReportOptions(sections=SECTIONS))
                reports.append((time.time() - start, time.perf_counter() - t))
                t = time.perf_counter()
                with Store.open(store) as s:
                    run_query(s, "slowest_requests")
                queries.append(time.perf_counter() - t)
            except Exception as e:  # any reader error is a finding of this benchmark
                errors.append(repr(e))
            time.sleep(0.5)

    reader = threading.Thread(target=read_loop)
    time.sleep(3)  # let the first spans arrive
    reader.start()
    out, _ = clients.communicate()
    reader.join()
    client_result = json.loads(out.strip().splitlines()[-1])
    acknowledged = client_result["acknowledged"]
    sent_seconds = args.duration
    collector_peak = _vm_hwm_mb(collector.pid)
    collector.send_signal(signal.SIGTERM)
    _, collector_log = collector.communicate(timeout=120)
    live_before = len(list_segments(store))
    files_before = len(list(store.rglob("seg-*.parquet")))
    t = time.perf_counter()
    summary = compact(store, grace_s=0)
    compact_seconds = time.perf_counter() - t
    live_after = len(list_segments(store))
    t = time.perf_counter()
    with Store.open(store) as s:
        build_report(s, ReportOptions(sections=SECTIONS))
        counts = dict(s.sql("SELECT span_id, count(*) FROM spans_raw GROUP BY span_id").fetchall())
    final_report = time.perf_counter() - t
    missing = [i for i in acknowledged if i not in counts]
    repeated = [i for i in acknowledged if counts.get(i, 0) > 1]
    first, last = reports[0][1], reports[-1][1]
    results = {
        "clients": args.clients, "batch": args.batch, "duration_s": sent_seconds,
        "acknowledged_spans": len(acknowledged), "failed_spans": client_result["failed"],
        "spans_per_s": len(acknowledged) / sent_seconds,
        "max_live_segments_seen_by_readers": max(segments_seen) if segments_seen else 0,
        "segments_before_final_compaction": live_before, "segment_files_before_final_compaction": files_before,
        "segments_after_final_compaction": live_after, "final_compaction_s": compact_seconds,
        "final_compaction_merged": summary.inputs,
        "reports": len(reports), "report_first_s": first, "report_last_s": last,
        "report_p50_s": _percentile([r for _, r in reports], 0.5), "report_p99_s": _percentile([r for _, r in reports],
                                                                                              0.99),
        "query_p99_s": _percentile(queries, 0.99), "report_after_final_compaction_s": final_report,
        "collector_peak_rss_mb": collector_peak,
        "reader_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "reader_errors": errors[:5], "missing_acknowledged": len(missing), "stored_twice": len(repeated),
        "collector_errors_logged": collector_log.count(" ERROR "),
        "load_average": os.getloadavg(), "cores": os.cpu_count(),
    }
    print(json.dumps(results, indent=1))
    print(f"\n{len(acknowledged):,} spans acknowledged in {sent_seconds:.0f} s: {results['spans_per_s']:,.0f} spans/s; "
          f"{live_before} live segments before the final compaction ({files_before} files), {live_after} after; "
          f"report first {first:.2f} s, last {last:.2f} s, p99 {results['report_p99_s']:.2f} s over "
          f"{len(reports)} runs; collector peak RSS {collector_peak:.0f} MB; load average "
          f"{results['load_average'][0]:.1f} on {os.cpu_count()} cores")
    checks = {"every acknowledged span stored": not missing, "none stored twice": not repeated,
              "no reader error": not errors, "last report <= 2x the first": last <= 2 * first}
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if not all(checks.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
