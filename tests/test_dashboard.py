"""The Streamlit dashboard under AppTest, on a real store (the demo incident, simulated and ingested): every
page renders without exception and shows the analyzers' numbers for that store; drill-down, deep links,
the runbook page and refresh after new segments arrive."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from infertrace.analyzers.itl import analyze_itl
from infertrace.analyzers.prefix_cache import analyze_prefix_cache
from infertrace.analyzers.rca import analyze_incidents
from infertrace.analyzers.slo import slo_summary
from infertrace.runbook import run_query
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from tests.incident_stores import demo_store, incident_store, sample_store

APP = str(Path(__file__).resolve().parents[1] / "dashboards" / "app.py")


@pytest.fixture(scope="module")
def store_dir() -> Path:
    return demo_store().store


@pytest.fixture(scope="module")
def analyses(store_dir: Path) -> dict:
    with Store.open(store_dir) as store:
        return {"slo": slo_summary(store), "itl": analyze_itl(store), "rca": analyze_incidents(store)}


def app(store: Path, monkeypatch: pytest.MonkeyPatch, page: str | None = None) -> AppTest:
    monkeypatch.setenv("INFERTRACE_STORE", str(store))
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    if page is not None:
        at.switch_page(page)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def frame(at: AppTest, column: str) -> pd.DataFrame:
    """The first table on the page with this column (AppTest does not expose a dataframe's key)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def charts(at: AppTest) -> list[tuple[dict, list[pd.DataFrame]]]:
    """Each chart's Vega-Lite spec and its datasets (sent apart from the spec, as Arrow)."""
    return [(json.loads(el.proto.spec), [pa.ipc.open_stream(d.data.data).read_pandas() for d in el.proto.datasets])
            for el in at.get("vega_lite_chart")]


def chart_data(at: AppTest, column: str) -> tuple[dict, pd.DataFrame]:
    """The first chart with a dataset that has this column: its spec and that dataset."""
    return next((spec, d) for spec, datasets in charts(at) for d in datasets if column in d.columns)


def time_scales(spec: dict) -> list[str]:
    """The scale types of every temporal x encoding in a (layered, faceted) Vega-Lite spec."""
    found = []
    for layer in [spec, *spec.get("layer", []), spec.get("spec", {})]:
        x = layer.get("encoding", {}).get("x", {})
        if x.get("type") == "temporal":
            found.append(x.get("scale", {}).get("type"))
    return found


def test_fleet_overview_shows_the_slo_analyzers_percentiles_and_severities(
        store_dir: Path, analyses: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(store_dir, monkeypatch)
    table = frame(at, "ttft p99 ms")
    summary = analyses["slo"]
    assert list(table["model"]) == [m.model for m in summary.models]
    for row, m in zip(table.to_dict("records"), summary.models, strict=True):
        assert row["slo"] == m.severity
        assert row["ttft p99 ms"] == pytest.approx(m.ttft.p99_ms)
        assert row["itl p50 ms"] == pytest.approx(m.itl.p50_ms)
        assert row["e2e p95 ms"] == pytest.approx(m.e2e.p95_ms)
    assert {"critical"} <= set(table["slo"])  # the demo's router incident breaches TTFT p99
    (spec, datasets), = charts(at)
    assert time_scales(spec) == ["utc", "utc"]
    series = next(d for d in datasets if "over SLO" in d.columns)
    buckets = list(summary.buckets)
    assert list(series["ms"]) == pytest.approx([b.percentiles_ms["ttft_p99_ms"] for b in buckets], nan_ok=True)
    assert list(series["over SLO"]) == ["ttft_p99_ms" in b.breached for b in buckets]
    assert series["over SLO"].any() and not series["over SLO"].all()
    target = next(t.threshold for t in summary.targets if t.key == "ttft_p99_ms")
    assert any(list(d.columns) == ["target"] and d["target"].iloc[0] == target for d in datasets)


def test_fleet_overview_shows_what_the_spans_get_wrong_and_where_ttft_runs_from(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose gateway passes no trace context to the engines: the problem is shown as a warning, not folded
    into a closed expander, and the caption says TTFT runs from the engines' spans (the gateway's are apart)."""
    from infertrace.sources.capabilities import store_coverage
    from tests.test_propagation import _store

    with Store.open(_store("unpropagated")) as store:
        problems = store_coverage(store).problems()
    assert len(problems) == 2 and all(p.startswith("Trace context: ") for p in problems)
    at = app(_store("unpropagated"), monkeypatch)
    assert [w.value for w in at.warning if w.value.startswith("Trace context: ")] == problems
    assert any("TTFT and E2E from the engine's request span to the first/last token" in c.value for c in at.caption)


def test_drill_down_from_a_model_opens_its_itl_spikes(store_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                     analyses: dict) -> None:
    at = app(store_dir, monkeypatch)
    at.selectbox(key="drill_model").select("mixtral-8x7b").run()
    at.button(key="drill_itl").click().run()
    assert not at.exception
    assert at.selectbox(key="itl_model_box").value == "mixtral-8x7b"
    worst = max((s for s in analyses["itl"].stalls if s.model == "mixtral-8x7b"), key=lambda s: s.added_ns)
    assert worst.culprits[0].request_id in " ".join(m.value for m in at.markdown)


def test_itl_page_names_the_analyzers_culprit_of_the_worst_stall_and_draws_its_timelines(
        store_dir: Path, analyses: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(store_dir, monkeypatch, "views/itl_spikes.py")
    itl = analyses["itl"]
    worst = sorted(itl.stalls, key=lambda s: (-s.added_ns, s.end_ns, s.instance))[0]
    stalls = frame(at, "added ms")
    assert (stalls.iloc[0]["engine"], stalls.iloc[0]["step"]) == (worst.instance, worst.step_index)
    assert stalls.iloc[0]["added ms"] == pytest.approx(worst.added_ns / 1e6)
    text = " ".join(m.value for m in at.markdown)
    for c in worst.culprits:
        assert f"Culprit prefill: `{c.request_id}`" in text
    engines = frame(at, "prefill stalls")
    assert list(engines["engine"]) == [e.instance for e in itl.engines]
    assert list(engines["prefill stalls"]) == [e.stalls["prefill"] for e in itl.engines]
    victim = at.selectbox(key="itl_victim").value
    assert victim in worst.victims
    with Store.open(store_dir) as store:
        tokens = run_query(store, "request_tokens", {"request_id": victim})
    spec, shown = chart_data(at, "itl_ms")
    assert list(shown["itl_ms"])[1:] == pytest.approx(list(tokens["itl_ms"])[1:])
    token_layer = spec["layer"][0]
    assert token_layer["mark"]["interpolate"] == "step-before"  # a stall is a held gap, not a diagonal ramp
    assert time_scales(spec) == ["utc", "utc"]
    marker = next(d for _, ds in charts(at) for d in ds if list(d.columns) == ["time"])
    assert marker["time"].iloc[0].value == worst.end_ns
    spec, steps = chart_data(at, "stall")
    assert list(steps.loc[steps["stall"], "step_index"]) == [worst.step_index]
    assert spec["encoding"]["x"]["field"] == "step_start" and spec["encoding"]["x2"]["field"] == "step_end"
    assert time_scales(spec) == ["utc"]


def test_itl_heatmap_shows_the_engines_tokens_by_time_and_band_with_its_stalls_marked(
        store_dir: Path, analyses: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(store_dir, monkeypatch, "views/itl_spikes.py")
    engine = at.selectbox(key="itl_engine").value
    worst = sorted(analyses["itl"].stalls, key=lambda s: (-s.added_ns, s.end_ns, s.instance))[0]
    assert engine == worst.instance
    spec, cells = chart_data(at, "band_low_ms")
    assert time_scales(spec)[0] == "utc" and spec["layer"][0]["encoding"]["x2"]["field"] == "bucket_end"
    with Store.open(store_dir) as store:
        itl_tokens = store.sql("SELECT count(*) FROM tokens WHERE instance = $i AND itl_ns IS NOT NULL",
                               params={"i": engine}).fetchall()[0][0]
    assert cells["tokens"].sum() == itl_tokens
    assert cells["tokens"].nunique() > 3 and cells["band_low_ms"].nunique() > 2  # cells differ
    marks = next(d for _, ds in charts(at) for d in ds if "worst victim itl ms" in d.columns)
    engine_stalls = {s.step_index for s in analyses["itl"].stalls if s.instance == engine}
    assert set(marks["step"]) == engine_stalls
    assert spec["params"][0]["name"] == "stall_pick"  # a click on a mark selects the stall
    bucket_s = next(re.search(r"per (\d+) s and ITL band", c.value).group(1) for c in at.caption
                    if "ITL band" in c.value)
    with Store.open(store_dir) as store:
        load = run_query(store, "engine_load_over_time", {"instance": engine, "bucket_s": bucket_s})
    _, queue = chart_data(at, "series")
    assert set(queue["series"]) == {"running (mean)", "waiting (peak)"}
    _, kv = chart_data(at, "kv_use_max")
    assert len(kv) == len(load) and list(kv["preemptions"]) == list(load["preemptions"])


def test_the_stalls_table_and_culprit_link_to_the_request_waterfall(
        store_dir: Path, analyses: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(store_dir, monkeypatch, "views/itl_spikes.py")
    worst = sorted(analyses["itl"].stalls, key=lambda s: (-s.added_ns, s.end_ns, s.instance))[0]
    table = frame(at, "added ms")
    assert table.iloc[0]["culprit"] == f"request?request_id={worst.culprits[0].request_id}"
    text = " ".join(m.value for m in at.markdown)
    assert f"[waterfall](request?request_id={worst.culprits[0].request_id})" in text
    at = app(store_dir, monkeypatch, "views/request.py")
    at.text_input(key="waterfall_request").input(worst.culprits[0].request_id).run()
    assert not at.exception
    spec, stages = chart_data(at, "stage")
    with Store.open(store_dir) as store:
        expected = run_query(store, "request_waterfall", {"request_id": worst.culprits[0].request_id})
    assert list(stages["stage"]) == list(expected["stage"])
    assert {"gateway", "auth", "route", "engine request", "queue", "prefill chunk", "decode"} <= set(stages["stage"])
    assert spec["encoding"]["x2"]["field"] == "end" and time_scales(spec) == ["utc"]


def test_a_deep_link_to_a_ground_truth_stall_shows_the_ground_truth_culprit(
        store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    truth = demo_store().truth["itl"]["stalled_steps"]
    # the stall the ground truth says hurt most, on an engine whose decodes it stalled
    step = max((s for s in truth if "prefill" in s["causes"]),
               key=lambda s: (s["duration_ns"] - s["decode_only_ns"]) * len(s["victims"]))
    monkeypatch.setenv("INFERTRACE_STORE", str(store_dir))
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("views/itl_spikes.py")
    at.query_params["engine"] = step["engine"]
    at.query_params["step"] = str(step["step_index"])
    at.run()
    assert not at.exception
    text = " ".join(m.value for m in at.markdown)
    assert any(f"Culprit prefill: `{c['request']}`" in text for c in step["culprits"])


def test_incidents_page_shows_the_rca_ranking_and_its_top_cause_is_the_injected_router(
        store_dir: Path, analyses: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(store_dir, monkeypatch, "views/incidents.py")
    rca = analyses["rca"]
    causes = frame(at, "candidate")
    first = rca.diagnoses[0]
    assert list(causes["candidate"]) == [c.candidate.id for c in first.causes]
    assert list(causes["score"]) == pytest.approx([c.score for c in first.causes])
    assert causes.iloc[0]["candidate"] == demo_store().truth["root_cause"]["instances"][0]
    spec, cells = chart_data(at, "score")
    expected = [b for b in rca.anomalies.heatmap if b.scope == "model"]
    assert len(cells) == len(expected)
    assert sorted(cells["score"]) == pytest.approx(sorted(b.score for b in expected))
    # real cells: each bucket spans start to end on a UTC time axis, and their scores differ
    assert spec["encoding"]["x2"]["field"] == "end" and time_scales(spec) == ["utc"]
    widths = (cells["end"] - cells["time"]).dt.total_seconds()
    assert set(widths) == {rca.anomalies.config.bucket_s}
    assert cells["score"].nunique() > 10
    assert len(at.get("graphviz_chart")) == 1


def test_incidents_page_on_a_store_too_short_to_score_warns_instead_of_saying_no_incident(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's request spans alone, two requests: detection scored nothing, so the page must not say "No incident"
    as a success; it says so and why, per metric, as the report does."""
    ingest_paths(tmp_path / "store", [Path(__file__).parent / "fixtures" / "sources" / "vllm_v1.jsonl"])
    at = app(tmp_path / "store", monkeypatch, "views/incidents.py")
    assert not [s.value for s in at.success]
    warnings = [w.value for w in at.warning]
    assert "No incident found, but no metric could be scored: nothing here says the fleet was healthy." in warnings
    assert any(w.startswith("Not checked: time to first token") and "429 rate (every model): 429s are a gateway's "
               "answers" in w for w in warnings), warnings


def test_fleet_overview_of_a_store_whose_requests_name_no_model_says_so_not_that_it_has_no_requests(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    span = {"traceId": "1" * 32, "spanId": "2" * 16, "name": "GET /api/items", "kind": 2,
            "startTimeUnixNano": "1767225600000000000", "endTimeUnixNano": "1767225600050000000"}
    (tmp_path / "web.jsonl").write_text(json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "shop-api"}}]}, "scopeSpans": [{"spans": [span]}]}]}) + "\n")
    ingest_paths(tmp_path / "store", [tmp_path / "web.jsonl"])
    at = app(tmp_path / "store", monkeypatch, "views/fleet.py")
    shown = [i.value for i in at.info]
    assert shown and shown[0].startswith("No request names a model") and "No requests in the store yet." not in shown


def test_prefix_cache_page_shows_the_analyzers_hit_rates_and_billing(store_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(store_dir, monkeypatch, "views/prefix_cache.py")
    with Store.open(store_dir) as store:
        cache = analyze_prefix_cache(store)
    shown = frame(at, "tenant")
    assert list(shown["tenant"]) == [g.key for g in cache.by_tenant]
    assert list(shown["hit rate"]) == pytest.approx([g.hit_rate for g in cache.by_tenant])
    assert frame(at, "system prompt")["cached tokens"].sum() == sum(g.cached_tokens for g in cache.by_system_prompt)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Cost with cache discounts"] == f"${cache.billing.cost:,.2f}"
    assert metrics["Cost without the cache"] == f"${cache.billing.cost_without_cache:,.2f}"


def test_prefix_cache_page_names_the_busting_tenant_of_the_cache_busting_sample(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sample = sample_store("cache_busting")
    at = app(sample.store, monkeypatch, "views/prefix_cache.py")
    busting = frame(at, "lost cached tokens")
    assert set(busting["tenant"]) == {sample.truth["root_cause"]["tenant"]}


def test_runbook_page_runs_a_query_with_bound_parameters_and_reports_bad_values(
        store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(store_dir, monkeypatch, "views/runbook.py")
    at.selectbox(key="query").select("ttft_breakdown").run()
    at.text_input(key="param-ttft_breakdown-model").input("llama-3-8b")
    at.button[0].click().run()
    assert not at.exception
    with Store.open(store_dir) as store:
        expected = run_query(store, "ttft_breakdown", {"model": "llama-3-8b"})
    shown = frame(at, "phase")
    assert list(shown["phase"]) == list(expected["phase"])
    assert list(shown["p99_ms"]) == pytest.approx(list(expected["p99_ms"]))
    at.text_input(key="param-ttft_breakdown-since").input("yesterday")
    at.button[0].click().run()
    assert any("parameter since" in e.value for e in at.error)
    # an empty answer says why: here, a model the store does not hold
    at.text_input(key="param-ttft_breakdown-since").input("")
    at.text_input(key="param-ttft_breakdown-model").input("llama-3-8")
    at.button[0].click().run()
    assert [w.value for w in at.warning] == ["model 'llama-3-8': no model of that name in this store; did you mean "
                                             "llama-3-8b?"]


@pytest.mark.slow
def test_pages_refresh_when_new_segments_arrive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    shutil.copytree(demo_store().store / "spans", store / "spans")
    at = app(store, monkeypatch)
    before = frame(at, "ttft p99 ms")
    ingest_paths(store, [incident_store("rate_limiter_flapping").traces])  # a collector would write the same
    at.run()
    assert not at.exception
    after = frame(at, "ttft p99 ms")
    with Store.open(store) as opened:
        summary = slo_summary(opened)
    assert list(after["requests"]) == [m.gateway_requests for m in summary.models]
    assert after["requests"].sum() > before["requests"].sum()


@pytest.mark.slow
def test_while_new_segments_are_analysed_the_pages_show_the_last_analysis_at_once_and_say_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A collector under steady load adds segments faster than the whole store is analysed: the pages show the
    newest materialised snapshot (not the analyses computed again on every new segment), the sidebar says how far
    behind it is, and a background process materialises the current one, which the next run shows."""
    from infertrace.results import materialize
    from infertrace.results.background import materialising
    from infertrace.results.materialized import is_materialised
    from infertrace.store.segments import list_segments

    store = tmp_path / "store"
    shutil.copytree(demo_store().store / "spans", store / "spans")
    with Store.open(store) as opened:
        materialize(opened)
        earlier = slo_summary(opened)
    ingest_paths(store, [incident_store("rate_limiter_flapping").traces])  # newer segments, not materialised
    with materialising(store, wait=True):  # another process (the collector's materialiser) at work meanwhile
        at = app(store, monkeypatch)
        assert list(frame(at, "ttft p99 ms")["requests"]) == [m.gateway_requests for m in earlier.models]
        lag = [i.value for i in at.sidebar.info]
        assert len(lag) == 1 and lag[0].startswith("Showing the analysis of the spans stored until ")
        assert "newer segment(s) are being analysed" in lag[0]
        # a request of the newer segments is not in the shown snapshot yet, and its waterfall says why
        with Store.open(store, segments=at.session_state["snapshot"]) as shown:
            shown_ids = {r for (r,) in shown.sql("SELECT request_id FROM requests").fetchall()}
        with Store.open(store) as opened:
            newer = sorted({r for (r,) in opened.sql("SELECT request_id FROM requests").fetchall()} - shown_ids)
        waterfall = app(store, monkeypatch, "views/request.py")
        waterfall.text_input(key="waterfall_request").input(newer[0]).run()
        assert next(w.value for w in waterfall.warning).endswith("a request that arrived since appears once they are.")
    at.run()  # no other materialisation now: the dashboard starts its own of the current snapshot
    deadline = time.monotonic() + 300  # the dashboard's background materialisation of the current snapshot
    while not is_materialised(store, (p.name for p in list_segments(store))) and time.monotonic() < deadline:
        time.sleep(0.5)
    at.run()
    assert not at.exception
    with Store.open(store) as opened:
        now = slo_summary(opened)
    assert list(frame(at, "ttft p99 ms")["requests"]) == [m.gateway_requests for m in now.models]
    assert sum(m.gateway_requests for m in now.models) > sum(m.gateway_requests for m in earlier.models)
    assert not at.sidebar.info


def test_disaggregation_page_counts_each_request_once_with_its_transfer_and_pools(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sample = sample_store("kv_transfer_congestion")
    at = app(sample.store, monkeypatch, "views/disaggregation.py")
    models = frame(at, "kv share of ttft")
    with Store.open(sample.store) as store:
        counts = dict(store.sql("SELECT model, count(*) FROM requests WHERE serving = 'disaggregated' "
                                "GROUP BY model").fetchall())
        transferred = store.sql("SELECT count(*) FROM requests WHERE kv_transfer_ns IS NOT NULL").fetchall()[0][0]
        gateway = dict(store.sql("SELECT model, count(*) FROM component_calls WHERE component = 'gateway' "
                                 "GROUP BY model").fetchall())
    assert dict(zip(models["model"], models["requests"], strict=True)) == counts
    assert all(counts[m] == gateway[m] for m in counts)
    pools = frame(at, "pool")
    assert {"prefill", "decode"} <= set(pools["pool"])
    assert frame(at, "size_from_mb")["transfers"].sum() == transferred > 0.9 * sum(counts.values())
