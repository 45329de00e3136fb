"""Exports as other tools read them: the Perfetto trace through Perfetto's own trace protos (and its trace
processor where a trace_processor_shell binary is present), the OTLP export through the official
opentelemetry-proto parser and back through ingest, the metrics endpoint scraped over HTTP and parsed with
prometheus-client's parser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent
from prometheus_client.parser import text_string_to_metric_families

from infertrace.analyzers.itl import analyze_itl
from infertrace.analyzers.itl_requests import attribute_store_requests
from infertrace.analyzers.prefix_cache import analyze_prefix_cache
from infertrace.export.otlp import write_otlp
from infertrace.export.perfetto import write_perfetto
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from reference_engine.engine.config import EngineConfig
from reference_engine.simulate import simulate
from reference_engine.telemetry.otlp import OtlpJsonLinesWriter
from reference_engine.telemetry.profiles import TelemetrySpec
from reference_engine.workload import SyntheticWorkload, synthetic_requests
from tests.incident_stores import SAMPLES, sample_store
from tests.otlp_proto import spans

ROOT = Path(__file__).resolve().parents[1]
TRACE_PROCESSOR_SHELL = os.environ.get("PERFETTO_TRACE_PROCESSOR_SHELL") or shutil.which("trace_processor_shell")


@pytest.fixture(scope="module")
def storm() -> Any:
    return sample_store("prefill_storm")


def _worst_truth_stall(truth: dict[str, Any]) -> dict[str, Any]:
    return max((s for s in truth["itl"]["stalled_steps"] if "prefill" in s["causes"]),
               key=lambda s: (s["duration_ns"] - s["decode_only_ns"]) * len(s["victims"]))


class _Slices:
    """Slices rebuilt from a Perfetto trace's TrackEvents: name, track, times, arguments, flows."""

    def __init__(self, trace: Trace) -> None:
        self.tracks: dict[int, Any] = {}
        self.slices: list[dict[str, Any]] = []
        open_: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for packet in trace.packet:
            if packet.HasField("track_descriptor"):
                self.tracks[packet.track_descriptor.uuid] = packet.track_descriptor
            if not packet.HasField("track_event"):
                continue
            event = packet.track_event
            if event.type in (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_INSTANT):
                parent = open_[event.track_uuid][-1] if open_[event.track_uuid] else None
                entry = {"name": event.name, "track": event.track_uuid, "start": packet.timestamp, "parent": parent,
                         "args": {a.name: a.string_value or a.int_value or a.double_value for a in
                                  event.debug_annotations},
                         "flows_out": list(event.flow_ids), "flows_in": list(event.terminating_flow_ids)}
                self.slices.append(entry)
                if event.type == TrackEvent.TYPE_INSTANT:
                    entry["end"] = packet.timestamp
                else:
                    open_[event.track_uuid].append(entry)
            elif event.type == TrackEvent.TYPE_SLICE_END:
                entry = open_[event.track_uuid].pop()
                entry["end"] = packet.timestamp
                assert entry["end"] >= entry["start"], entry
        assert not any(open_.values()), "every slice ends"

    def request_of(self, entry: dict[str, Any]) -> str:
        while entry["parent"] is not None:
            entry = entry["parent"]
        return entry["name"]


def test_perfetto_export_draws_each_stall_as_flows_from_the_ground_truth_culprit_to_its_victims(
        storm: Any, tmp_path: Path) -> None:
    out = tmp_path / "storm.pftrace"
    with Store.open(storm.store) as store:
        itl = analyze_itl(store)
        summary = write_perfetto(store, out, itl=itl)
        steps = store.sql("SELECT count(*) FROM steps").fetchall()[0][0]
    trace = Trace()
    trace.ParseFromString(out.read_bytes())  # Perfetto's own trace schema
    assert len(trace.packet) == summary.packets
    parsed = _Slices(trace)
    processes = {t.process.process_name for t in parsed.tracks.values() if t.HasField("process")}
    assert processes == {"llama-3-8b-0 (llama-3-8b)", "mixtral-8x7b-0 (mixtral-8x7b)",
                         "qwen-2.5-1.5b-0 (qwen-2.5-1.5b)"}
    step_slices = [s for s in parsed.slices if parsed.tracks[s["track"]].name == "steps"]
    assert len(step_slices) == steps == summary.steps

    truth = _worst_truth_stall(storm.truth)
    stalled_step = next(s for s in step_slices if s["name"].startswith("STALL") and s["args"]["step"]
                        == truth["step_index"] and parsed.tracks[parsed.tracks[s["track"]].parent_uuid]
                        .process.process_name.startswith(truth["engine"]))
    culprit_chunks = [s for s in parsed.slices if s["name"] == "culprit chunk" and s["end"] == stalled_step["end"]]
    culprits = {parsed.request_of(s) for s in culprit_chunks}
    assert culprits & {c["request"] for c in truth["culprits"]}, (culprits, truth["culprits"])
    flows = {f for s in culprit_chunks for f in s["flows_out"]}
    victims = {parsed.request_of(s) for s in parsed.slices if set(s["flows_in"]) & flows}
    assert victims == set(truth["victims"])
    assert all(s["name"] == "token" and s["parent"]["name"] == "stalled" and s["parent"]["parent"]["name"] == "decode"
               for s in parsed.slices if set(s["flows_in"]) & flows)
    # every flow ends after it starts: the trace processor (and the UI) drops one whose end event has its start's
    # timestamp and comes first in the trace, as a victim's stalled slice, which starts with the culprit's step, would
    starts = {f: s["start"] for s in parsed.slices for f in s["flows_out"]}
    assert all(s["start"] > starts[f] for s in parsed.slices for f in s["flows_in"])


def _profile_store(tmp_path: Path, telemetry: str | None) -> Path:
    """Twenty seconds of long prompts arriving among decoding requests on one prefill-first engine, its spans as
    `telemetry`'s (None: this project's), ingested."""
    requests = synthetic_requests(SyntheticWorkload(rate=3.0, prompt_mean=3000, output_mean=120, max_tokens=256),
                                  20.0, seed=11, model="llama-3-8b")
    spans_file = tmp_path / f"{telemetry or 'native'}.jsonl"
    simulate(EngineConfig(), requests, OtlpJsonLinesWriter(spans_file), seed=11,
             telemetry=TelemetrySpec(telemetry) if telemetry else None)
    ingest_paths(tmp_path / f"{telemetry or 'native'}-store", [spans_file])
    return tmp_path / f"{telemetry or 'native'}-store"


def test_perfetto_export_of_sglangs_spans_draws_the_request_only_stall_windows_and_their_true_culprits(
        tmp_path: Path) -> None:
    with Store.open(_profile_store(tmp_path, "sglang")) as store:
        summary = write_perfetto(store, tmp_path / "sglang.pftrace")
        attribution = attribute_store_requests(store)
    assert (summary.stall_method, summary.steps) == ("requests", 0)
    assert "stall windows from request spans and token times" in summary.sentence()
    trace = Trace()
    trace.ParseFromString((tmp_path / "sglang.pftrace").read_bytes())
    parsed = _Slices(trace)
    source = {f: parsed.request_of(s) for s in parsed.slices if s["name"] == "culprit prefill"
              for f in s["flows_out"]}
    assert all(parsed.request_of(s["parent"]) == parsed.request_of(s) and s["parent"]["name"] == "prefill"
               for s in parsed.slices if s["name"] == "culprit prefill")
    drawn = {(source[f], parsed.request_of(s)) for s in parsed.slices if s["name"] == "token"
             for f in s["flows_in"]}
    assert all(s["parent"]["name"] == "decode" for s in parsed.slices if s["name"] == "stalled")
    assert all(s["parent"]["name"] == "stalled" for s in parsed.slices if s["flows_in"])
    starts = {f: s["start"] for s in parsed.slices for f in s["flows_out"]}
    assert all(s["start"] > starts[f] for s in parsed.slices for f in s["flows_in"])
    expected = {(c.request_id, v) for s in attribution.stalls for c in s.culprits for v in s.victims}
    assert drawn == expected and len(drawn) == summary.flows > 0
    # the same simulation with this project's step spans: every culprit named with confidence is a prefill that
    # stalled decodes there
    with Store.open(_profile_store(tmp_path, None)) as native:
        truth = {c.request_id for s in analyze_itl(native).stalls for c in s.culprits}
    confident = {c.request_id for s in attribution.stalls for c in s.culprits if c.confidence >= 0.5}
    assert confident and confident <= truth


def test_perfetto_export_of_vllms_spans_says_it_had_nothing_to_find_stalls_in(tmp_path: Path) -> None:
    with Store.open(_profile_store(tmp_path, "vllm-v1")) as store:
        summary = write_perfetto(store, tmp_path / "vllm.pftrace")
    assert (summary.stall_method, summary.stalls, summary.flows) == ("", 0, 0)
    assert summary.requests > 0
    assert summary.sentence().endswith("no stall drawn: the store has neither engine_step spans nor per-token "
                                       "times to find stalls in (vLLM exports neither; `infertrace ingest "
                                       f"--client-tokens` adds a streaming client's); {summary.packets} packets")


needs_trace_processor = pytest.mark.skipif(
    TRACE_PROCESSOR_SHELL is None, reason="no trace_processor_shell here (the perfetto package downloads one on first "
                                          "use; set PERFETTO_TRACE_PROCESSOR_SHELL to a binary)")


def _flows(trace: Path, culprit_slice: str, where: str = "") -> list[tuple[str, str]]:
    """(culprit request, victim request) of every flow the Perfetto trace processor finds from a `culprit_slice`
    slice to a victim's `token`."""
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    tp = TraceProcessor(trace=str(trace), config=TraceProcessorConfig(bin_path=TRACE_PROCESSOR_SHELL))
    try:
        rows = tp.query(f"""
            SELECT culprit_request.name AS culprit, victim_request.name AS victim
            FROM flow
            JOIN slice AS culprit ON flow.slice_out = culprit.id
            JOIN slice AS token ON flow.slice_in = token.id
            JOIN ancestor_slice(culprit.id) AS culprit_request ON culprit_request.depth = 0
            JOIN ancestor_slice(token.id) AS victim_request ON victim_request.depth = 0
            WHERE culprit.name = '{culprit_slice}' AND token.name = 'token' {where}
        """).as_pandas_dataframe()
    finally:
        tp.close()
    return list(zip(rows["culprit"], rows["victim"], strict=True))


@needs_trace_processor
def test_the_trace_processor_finds_the_worst_stall_and_its_culprit(storm: Any, tmp_path: Path) -> None:
    out = tmp_path / "storm.pftrace"
    with Store.open(storm.store) as store:
        write_perfetto(store, out)
    truth = _worst_truth_stall(storm.truth)
    flows = _flows(out, "culprit chunk", f"AND culprit.ts + culprit.dur = {int(truth['end_ns'])}")
    assert {c for c, _ in flows} & {c["request"] for c in truth["culprits"]}
    assert {v for _, v in flows} == set(truth["victims"])


@needs_trace_processor
def test_the_trace_processor_links_each_request_only_stall_window_to_its_culprits(tmp_path: Path) -> None:
    with Store.open(_profile_store(tmp_path, "sglang")) as store:
        summary = write_perfetto(store, tmp_path / "sglang.pftrace")
        attribution = attribute_store_requests(store)
    flows = _flows(tmp_path / "sglang.pftrace", "culprit prefill")
    assert len(flows) == summary.flows > 0
    assert set(flows) == {(c.request_id, v) for s in attribution.stalls for c in s.culprits for v in s.victims}


@pytest.mark.parametrize("name", ["spans.jsonl.gz", "spans.jsonl.zst"])
def test_otlp_export_parses_with_opentelemetry_proto_and_round_trips_through_ingest(storm: Any, tmp_path: Path,
                                                                                    name: str) -> None:
    out = tmp_path / name
    with Store.open(storm.store) as store:
        written = write_otlp(store, out, spans_per_line=700)
        before = store.sql("SELECT * FROM spans ORDER BY trace_id, span_id").to_arrow_table()
    parsed = spans(out)  # the official parser, after hex ids are converted
    assert len(parsed) == written == before.num_rows
    assert {p.span.trace_id.hex() for p in parsed} == set(before["trace_id"].to_pylist())
    summary = ingest_paths(tmp_path / "again", [out])
    assert summary.skipped == 0
    with Store.open(tmp_path / "again") as again:
        after = again.sql("SELECT * FROM spans ORDER BY trace_id, span_id").to_arrow_table()
    assert set(after.column_names) == set(before.column_names)
    for column in before.column_names:
        assert after[column].equals(before[column]), column


def test_otlp_export_of_a_window_keeps_only_the_spans_overlapping_it(storm: Any, tmp_path: Path) -> None:
    with Store.open(storm.store) as store:
        start, end = store.sql("SELECT min(start_ns), max(end_ns) FROM spans").fetchall()[0]
        middle = (start + end) // 2
        inside = store.sql("SELECT count(*) FROM spans WHERE end_ns >= $m AND start_ns < $m + 10000000000",
                           params={"m": middle}).fetchall()[0][0]
        written = write_otlp(store, tmp_path / "w.jsonl", since_ns=middle, until_ns=middle + 10 * 10**9)
    assert written == inside and inside > 0


def _scrape(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=120) as response:
        text = response.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(family: Any, suffix: str = "", **labels: str) -> list[Any]:
    return [s for s in family.samples if s.name == family.name + suffix
            and all(s.labels.get(k) == v for k, v in labels.items())]


@pytest.mark.slow
def test_serve_metrics_exposes_vllm_named_histograms_and_stall_counts_that_prometheus_parses(
        storm: Any, tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    shutil.copytree(storm.store / "spans", store_dir / "spans")
    process = subprocess.Popen([sys.executable, "-m", "infertrace", "serve-metrics", "--store", str(store_dir),
                                "--listen", "127.0.0.1:0"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split()[2]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        families = _scrape(url)
        with Store.open(store_dir) as store:
            ttft = dict(store.sql("SELECT instance, count(*) FROM requests WHERE ttft_ns IS NOT NULL "
                                  "GROUP BY instance").fetchall())
            itl_tokens = dict(store.sql("SELECT instance, count(*) FROM tokens WHERE itl_ns IS NOT NULL "
                                        "GROUP BY instance").fetchall())
            itl_seconds = store.sql("SELECT instance, itl_ns / 1e9 AS s FROM tokens WHERE itl_ns IS NOT NULL").df()
            itl = analyze_itl(store)
            cache = analyze_prefix_cache(store)
        histogram = families["vllm:time_to_first_token_seconds"]
        assert histogram.type == "histogram"
        for engine, n in ttft.items():
            (count,) = _samples(histogram, "_count", engine=engine)
            assert count.value == n
            (inf,) = _samples(histogram, "_bucket", engine=engine, le="+Inf")
            assert inf.value == n
        tokens = families["vllm:inter_token_latency_seconds"]
        for engine, n in itl_tokens.items():  # every bucket as the engine's tokens, one row each, fill it
            assert _samples(tokens, "_count", engine=engine)[0].value == n
            seconds = itl_seconds[itl_seconds["instance"] == engine]["s"]
            assert _samples(tokens, "_sum", engine=engine)[0].value == pytest.approx(seconds.sum(), rel=1e-9)
            for bucket in _samples(tokens, "_bucket", engine=engine):
                bound = float(bucket.labels["le"])
                assert bucket.value == (seconds <= bound).sum(), (engine, bound)
        stalls = families["infertrace:itl_stalls"]
        assert stalls.type == "counter"
        by_tenant: dict[str, float] = defaultdict(float)
        for s in _samples(stalls, "_total", cause="prefill"):
            by_tenant[s.labels["culprit_tenant"]] += s.value
        expected: dict[str, int] = defaultdict(int)
        for stall in itl.stalls:
            if "prefill" in stall.causes:
                for tenant in {c.tenant or "" for c in stall.culprits}:
                    expected[tenant] += 1
        assert by_tenant == expected and by_tenant["tenant-b"] > 0
        rates = {s.labels["tenant"]: s.value for s in families["infertrace:prefix_cache_hit_rate"].samples}
        assert rates == pytest.approx({g.key: g.hit_rate for g in cache.by_tenant if g.hit_rate is not None})
        hits = sum(s.value for s in _samples(families["vllm:prefix_cache_hits"], "_total"))
        assert hits == sum(g.cached_tokens for g in cache.by_tenant)

        # a collector writes more spans: the next scrape counts them, and counters only grow
        before = sum(s.value for s in _samples(families["vllm:prompt_tokens"], "_total"))
        ingest_paths(store_dir, [SAMPLES / "engine_regression" / "traces.jsonl.gz"])
        after = sum(s.value for s in _samples(_scrape(url)["vllm:prompt_tokens"], "_total"))
        assert after > before
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow  # 7-9 s: the default run stays under 10 minutes; CI runs it
def test_metrics_of_engines_without_step_spans_leave_out_what_their_spans_lack_and_say_why(tmp_path: Path) -> None:
    served = {}
    for telemetry in ("vllm-v1", "sglang"):
        store_dir = _profile_store(tmp_path, telemetry)
        process = subprocess.Popen([sys.executable, "-m", "infertrace", "serve-metrics", "--store", str(store_dir),
                                    "--listen", "127.0.0.1:0"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None
            served[telemetry] = _scrape(process.stdout.readline().split()[2])
        finally:
            process.terminate()
            process.wait(timeout=30)
    vllm, sglang = served["vllm-v1"], served["sglang"]
    missing = {s.labels["metric"]: s.labels["reason"] for s in vllm["infertrace:metric_unavailable"].samples}
    # vLLM's spans carry no cached-token count and no preemption count: no zero is made up for them
    assert not vllm["vllm:prefix_cache_hits"].samples and not vllm["vllm:num_preemptions"].samples
    assert missing["vllm:prefix_cache_hits_total"] == "no request span of this store carries a cached-token count"
    assert missing["vllm:num_preemptions_total"] == "no request span of this store counts its preemptions"
    assert missing["infertrace:itl_stalls_total"].startswith("the store has neither engine_step spans nor per-token")
    assert missing["vllm:num_requests_running"] == "no engine_step spans: an engine's load is read from its steps"
    assert sum(s.value for s in _samples(vllm["vllm:prompt_tokens"], "_total")) > 0
    # SGLang times each token: its stall windows are counted, the per-step stall counters say where they went
    with Store.open(tmp_path / "sglang-store") as store:
        attribution = attribute_store_requests(store)
    windows = sum(s.value for s in _samples(sglang["infertrace:itl_stall_windows"], "_total"))
    assert windows == len(attribution.stalls) > 0
    missing = {s.labels["metric"]: s.labels["reason"] for s in sglang["infertrace:metric_unavailable"].samples}
    assert missing["infertrace:itl_stalls_total"].endswith("see infertrace:itl_stall_windows_total")
    assert "vllm:prefix_cache_hits_total" not in missing and sglang["vllm:prefix_cache_hits"].samples


@pytest.mark.slow
def test_a_scrape_while_newer_segments_are_analysed_answers_from_the_last_analysis_and_says_how_far_behind(
        tmp_path: Path) -> None:
    """A scrape must answer within Prometheus' timeout: it does not compute a new snapshot's analyses itself."""
    from infertrace.export.metrics import exposition
    from infertrace.results import materialize
    from infertrace.results.background import materialising
    from infertrace.results.live import current_segments
    from infertrace.results.materialized import is_materialised, latest

    def scrape() -> dict[str, Any]:
        return {f.name: f for f in text_string_to_metric_families(exposition(store_dir).decode())}

    def requests(families: dict[str, Any]) -> float:
        return sum(s.value for s in _samples(families["vllm:e2e_request_latency_seconds"], "_count"))

    store_dir = tmp_path / "store"
    ingest_paths(store_dir, [SAMPLES / "prefill_storm" / "traces.jsonl.gz"])
    with Store.open(store_dir) as store:
        materialize(store)
        (earlier,), = store.sql("SELECT count(*) FROM requests WHERE e2e_ns IS NOT NULL").fetchall()
    current = scrape()
    assert requests(current) == earlier and current["infertrace:segments_pending"].samples[0].value == 0
    ingest_paths(store_dir, [SAMPLES / "engine_regression" / "traces.jsonl.gz"])  # a collector writes more
    with materialising(store_dir, wait=True):  # while another process materialises the new snapshot
        behind = scrape()
    assert requests(behind) == earlier
    assert behind["infertrace:segments_pending"].samples[0].value > 0
    shown = latest(store_dir)
    assert shown is not None
    assert behind["infertrace:data_until_timestamp_seconds"].samples[0].value == shown.data_until
    scrape()  # no other materialisation now: this process starts one of the current snapshot
    deadline = time.monotonic() + 300
    while not is_materialised(store_dir, (Path(s).name for s in current_segments(store_dir))):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    after = scrape()
    with Store.open(store_dir) as store:
        (now,), = store.sql("SELECT count(*) FROM requests WHERE e2e_ns IS NOT NULL").fetchall()
    assert requests(after) == now > earlier and after["infertrace:segments_pending"].samples[0].value == 0


@pytest.mark.slow
def test_collect_with_metrics_serves_them_and_materialises_what_it_received(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    process = subprocess.Popen([sys.executable, "-m", "infertrace", "collect", "--store", str(store_dir),
                                "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0"], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        receiver = re.search(r"listening on (\S+/v1/traces)", process.stdout.readline()).group(1)
        metrics = re.search(r"metrics on (\S+/metrics)", process.stdout.readline()).group(1)
        sent = subprocess.run([sys.executable, "-m", "infertrace", "simulate", "--duration", "15", "--rate", "3",
                               "--seed", "2", "--no-progress", "--otlp-endpoint", receiver],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert sent.returncode == 0, sent.stderr
        families = _scrape(metrics)
        generated = sum(s.value for s in _samples(families["vllm:generation_tokens"], "_total"))
        assert generated > 0
        deadline = time.monotonic() + 300  # the materialiser waits for the segments to settle
        while not (store_dir / "derived" / "results" / "report").is_dir() and time.monotonic() < deadline:
            time.sleep(1)
        assert {p.name for p in (store_dir / "derived" / "results").iterdir()} >= {"slo", "itl", "rca", "report"}
    finally:
        process.terminate()
        process.wait(timeout=30)
