"""The ClickHouse forms of the relations the pushed-down aggregations read (store/clickhouse/relations/) carry a
branch for every source the DuckDB relations read: vLLM V1 and V0, SGLang, TGI, and a LiteLLM gateway, not only
this project's engine. The samples hold only this engine's spans, so these tests hold the other branches: what each
source's code exports (tests/fixtures/sources/) and a fleet incident simulated with each engine's telemetry
profile, each in a local store and in chdb, give the same relation rows, the same pushed-down aggregations and the
same report on both backends.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from infertrace.analyzers import itl
from infertrace.report import ReportOptions, build_report
from infertrace.store.clickhouse.pushdown import CLICKHOUSE_RELATIONS, TWINS
from infertrace.store.clickhouse.store import ClickHouseStore
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import RELATIONS, Store, open_store
from infertrace.store.values import CONVERTED
from reference_engine.telemetry.profiles import TelemetrySpec
from tests.clickhouse_stores import DUCKDB_FORM, clickhouse_relation_rows, exported
from tests.fleet_traces import fleet_from_toml, simulate_fleet
from tests.test_sources_e2e import DURATION_S, ENGINE_FAULTS, FLEET, SEED

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sources"
FIXTURE_SOURCES = sorted(p.stem for p in FIXTURES.glob("*.jsonl"))

# The fleet of the end-to-end tests of each source (a shared router in front of two of three models, two
# slowed), run with (engine telemetry, gateway telemetry): every engine profile, and both foreign gateway
# shapes (LiteLLM's spans, and none at all); TGI both alone and behind LiteLLM, whose proxy span carries the prompt's
# tokens that TGI's own spans lack.
PROFILES = [("vllm-v1", "litellm"), ("vllm-v0", "none"), ("sglang", "litellm"), ("tgi", "none"), ("tgi", "litellm")]
DEFAULT_PROFILES = {("vllm-v1", "litellm")}

_ROOT = tempfile.TemporaryDirectory(prefix="infertrace-test-sources-")

SOURCES = [pytest.param(f"fixture:{name}", marks=pytest.mark.slow) for name in FIXTURE_SOURCES] + [
    pytest.param(f"{engine}+{gateway}", marks=() if (engine, gateway) in DEFAULT_PROFILES else pytest.mark.slow)
    for engine, gateway in PROFILES]


@functools.cache
def _source(source: str) -> tuple[str, str]:
    """(local store directory, chdb URL) of a source: a fixture file, or the fleet simulated with a profile."""
    root = Path(_ROOT.name) / source.replace(":", "_").replace("+", "_")
    if source.startswith("fixture:"):
        path = FIXTURES / f"{source.removeprefix('fixture:')}.jsonl"
    else:
        engine, gateway = source.split("+")
        path = root / "spans.jsonl"
        path.parent.mkdir(parents=True)
        simulate_fleet(fleet_from_toml(FLEET + ENGINE_FAULTS), path, DURATION_S, SEED, TelemetrySpec(engine, gateway))
    summary = ingest_paths(root / "store", [path])
    assert summary.skipped == 0, summary.paragraph()
    local = str(root / "store")
    return local, exported(local, f"source_{root.name}")


@pytest.mark.parametrize("source", SOURCES)
def test_each_sources_requests_are_found_on_both_backends(source: str) -> None:
    """The comparisons below are not over empty relations: every source gives requests, and the simulated fleets
    give component calls through the gateway."""
    local_dir, url = _source(source)
    with Store.open(local_dir) as local, open_store(url) as clickhouse:
        counts = {name: local.sql(f"SELECT count(*) FROM {name}").fetchall()[0][0] for name in ("requests", "spans")}
        assert counts["requests"] > 0
        assert clickhouse.sql("SELECT count(*) FROM spans").fetchall()[0][0] == counts["spans"]
        if not source.startswith("fixture:") and source.endswith("+litellm"):
            assert local.sql("SELECT count(*) FROM component_calls").fetchall()[0][0] > 0


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("relation", sorted(CLICKHOUSE_RELATIONS))
def test_the_clickhouse_form_of_a_relation_gives_the_duckdb_rows_for_every_source(source: str, relation: str) -> None:
    local_dir, url = _source(source)
    with Store.open(local_dir) as local, ClickHouseStore.open(url) as clickhouse:
        itl._register(local)  # itl_token_gaps, the ITL analyzer's own table
        expected = local.sql(f"SELECT * FROM {relation} ORDER BY ALL").to_arrow_table()
        got = clickhouse_relation_rows(clickhouse, relation, expected)
        assert not clickhouse.spans_read
    assert got.num_rows == expected.num_rows
    assert got.equals(expected), relation


# In the default run, the report's sections on each default source run the aggregations that source's spans call
# for on ClickHouse (test_every_relation_and_report_section_is_the_same_on_clickhouse_for_every_source); row by row,
# the default run compares two that read requests (what every engine profile has), CI's slow run each.
TWIN_PARAMS = [pytest.param(n, marks=() if n in ("itl_request_prompts", "request_outcomes") else pytest.mark.slow)
               for n in sorted(TWINS)]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", TWIN_PARAMS)
def test_an_aggregation_pushed_into_clickhouse_gives_the_duckdb_rows_for_every_source(source: str, name: str) -> None:
    local_dir, url = _source(source)
    query, params_of = DUCKDB_FORM[name]
    with Store.open(local_dir) as local, ClickHouseStore.open(url) as clickhouse:
        itl._register(local)
        if name == "itl_stall_candidates" and not local.sql("SELECT 1 FROM steps LIMIT 1").fetchall():
            pytest.skip(f"{source} exports no engine steps: there is no range of stall candidates to ask for")
        params = params_of(local)
        expected = local.aggregate(name, query, params).to_arrow_table()
        got = clickhouse.aggregate(name, query, params).to_arrow_table()
        assert not clickhouse.spans_read
    assert got.schema == expected.schema
    assert got.num_rows == expected.num_rows
    assert got.equals(expected)


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    del doc["store"]["segments"]  # how many files held the spans: differs by construction
    return doc


@pytest.mark.parametrize("source", SOURCES)
def test_every_relation_and_report_section_is_the_same_on_clickhouse_for_every_source(source: str) -> None:
    local_dir, url = _source(source)
    with Store.open(local_dir) as local, open_store(url) as clickhouse:
        # The exporter writes every value as text: what the source sent in another type than the declared one
        # (vLLM's JSON-encoded finish reasons), which a local ingest notes as converted, ClickHouse cannot tell.
        assert set(local.notes) <= {CONVERTED} and not clickhouse.notes
        local.notes = {}
        for relation in RELATIONS:
            query = f"SELECT * FROM {relation} ORDER BY ALL"
            assert clickhouse.sql(query).to_arrow_table().equals(local.sql(query).to_arrow_table()), relation
        expected = _comparable(build_report(local, ReportOptions()))
        got = _comparable(build_report(clickhouse, ReportOptions()))
    assert expected["sections"]
    for section in expected["sections"]:
        assert got["sections"][section] == expected["sections"][section], section
    assert got == expected
