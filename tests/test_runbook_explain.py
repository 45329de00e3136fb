"""A runbook answer says what it could not draw on: on a store of SGLang's spans (no engine step spans) an empty
answer names the empty relations and the source, a mistyped request or instance gets the store's own names, a
window off the data gets the store's time range, and a partial answer (the worst gaps without culprits) says which
relations gave it nothing. The CLI prints the notes on stderr and leaves stdout's rows as they were."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infertrace.runbook import answer_notes, load_queries, run_query
from infertrace.runbook.catalog import parse_query
from infertrace.runbook.explain import FILLED_BY, relations_read
from infertrace.store.ingest import ingest_paths
from infertrace.store.store import Store
from tests.incident_stores import demo_store

ROOT = Path(__file__).resolve().parents[1]
SGLANG = ROOT / "tests" / "fixtures" / "sources" / "sglang.jsonl"


@pytest.fixture(scope="module")
def sglang_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sglang") / "store"
    assert ingest_paths(root, [SGLANG]).skipped == 0
    return root


@pytest.fixture()
def sglang(sglang_dir: Path) -> Iterator[Store]:
    with Store.open(sglang_dir) as store:
        yield store


@pytest.fixture(scope="module")
def demo() -> Iterator[Store]:
    with Store.open(demo_store().store) as store:
        store.materialize()
        yield store


def _answer(store: Store, name: str, values: dict[str, str]) -> tuple[int, list[str]]:
    frame = run_query(store, name, values)
    return len(frame), answer_notes(store, name, values, len(frame))


def test_the_relations_a_query_reads_are_found_by_duckdbs_parser_without_its_ctes() -> None:
    assert relations_read(load_queries()["worst_itl_gaps"].sql) == ("request_legs", "step_membership", "steps",
                                                                     "tokens")
    sql = "WITH steps AS (SELECT * FROM requests WHERE model = $m) SELECT * FROM steps JOIN tokens USING (x)"
    assert relations_read(sql) == ("requests", "tokens")


def test_every_relation_a_query_reads_says_what_fills_it_and_every_need_is_valid_sql(demo: Store) -> None:
    for q in load_queries().values():
        assert set(relations_read(q.sql)) <= set(FILLED_BY), q.name
        for need in q.needs:
            assert need.relation in relations_read(q.sql), q.name
            demo.sql(f"SELECT count(*) FROM {need.relation} WHERE {need.condition}").fetchall()


def test_a_needs_line_is_parsed_and_a_malformed_one_is_refused() -> None:
    head = "-- title: t\n-- question: q\n-- when: w\n"
    q = parse_query("ok", head + "-- needs requests WHERE tenant IS NOT NULL: requests with a\n--   tenant\n"
                                 "SELECT 1 FROM requests\n")
    (need,) = q.needs
    assert (need.relation, need.condition, need.description) == ("requests", "tenant IS NOT NULL",
                                                                 "requests with a tenant")
    with pytest.raises(ValueError, match="needs line"):
        parse_query("bad", head + "-- needs requests with a tenant\nSELECT 1\n")


def test_a_step_query_on_sglangs_spans_says_no_engine_step_span_fills_it(sglang: Store) -> None:
    rows, said = _answer(sglang, "engine_load", {})
    assert rows == 0
    (note,) = said
    assert note.startswith("`steps` is empty in this store: it is filled by engine_step spans")
    assert "SGLang and TGI export none" in note
    assert note.endswith("This store's engine spans are from SGLang (1 request span).")


def test_the_worst_gaps_come_from_sglangs_token_spans_and_say_their_culprit_columns_had_no_steps(
        sglang: Store) -> None:
    frame = run_query(sglang, "worst_itl_gaps", {"top": "5"})
    tokens = sglang.sql("SELECT count(*) FROM tokens WHERE itl_ns IS NOT NULL").fetchall()[0][0]
    assert len(frame) == tokens > 0
    assert set(frame["model"]) == {"meta-llama/Llama-3.1-8B-Instruct"}
    assert (frame["prefills_between"] == 0).all()
    (note,) = answer_notes(sglang, "worst_itl_gaps", {"top": "5"}, len(frame))
    assert note.startswith("`step_membership` and `steps` are empty in this store, so the answer draws nothing "
                           "from them")


def test_a_mistyped_instance_or_request_is_answered_with_the_stores_own_names(sglang: Store) -> None:
    instance, request = sglang.sql("SELECT instance, request_id FROM requests").fetchall()[0]
    rows, said = _answer(sglang, "itl_heatmap", {"instance": "llama-3-8b-0"})
    assert rows == 0
    assert said[0] == f"instance 'llama-3-8b-0': no engine instance of that name in this store; it holds 1: {instance}"
    rows, said = _answer(sglang, "request_tokens", {"request_id": request[:-1] + "9"})
    assert rows == 0
    assert said == [f"request_id '{request[:-1]}9': no request of that name in this store; did you mean {request}?"]
    assert _answer(sglang, "request_tokens", {"request_id": request}) == (3, [])


def test_a_window_off_the_data_is_said_with_the_stores_time_range(sglang: Store) -> None:
    rows, said = _answer(sglang, "slowest_requests", {"since": "2020-01-01T00:00:00Z", "until": "2020-01-02"})
    assert rows == 0
    (note,) = said
    assert note.startswith("the window 2020-01-01T00:00:00.000000000Z to 2020-01-02T00:00:00.000000000Z holds none "
                           "of the store's spans, which run from 2026-")


def test_a_summary_of_rows_the_source_never_sets_names_what_it_needs(sglang: Store) -> None:
    rows, said = _answer(sglang, "prefix_cache_by_system_prompt", {})
    assert rows == 0
    assert said == ["this store holds none of what the query summarises, requests that name their shared system "
                    "prompt (infertrace.request.system_prompt.id: this project's engine sets it; vLLM, SGLang and "
                    "TGI do not): no row of `requests` has system_prompt_id IS NOT NULL"]


def test_on_a_store_with_every_input_an_answer_has_no_note_and_an_empty_one_says_nothing_matched(
        demo: Store) -> None:
    assert _answer(demo, "worst_itl_gaps", {"top": "3"})[1] == []
    # the demo fleet is not disaggregated and never preempts: the empty answers say what they summarise
    for name, needed in (("kv_transfer_by_link", "component = 'kv_transfer'"),
                         ("pd_ttft_transfer_share", "serving = 'disaggregated'"),
                         ("preemptions", "role = 'preempted'")):
        rows, said = _answer(demo, name, {})
        assert rows == 0 and len(said) == 1 and said[0].endswith(f" has {needed}"), (name, said)
    model = demo.sql("SELECT model FROM requests LIMIT 1").fetchall()[0][0]
    rows, said = _answer(demo, "slowest_requests", {"model": model, "order_by": "ttft", "top": "0"})
    assert rows == 0
    assert said == ["`component_calls` and `requests` hold rows in this store and the parameters name what they "
                    "hold, but nothing matched the query's conditions"]


def test_the_cli_prints_the_notes_on_stderr_and_leaves_the_rows_on_stdout_as_they_were(sglang_dir: Path) -> None:
    env = {**os.environ, "INFERTRACE_STORE": str(sglang_dir)}
    run = subprocess.run([sys.executable, "-m", "infertrace", "query", "engine_load", "--format", "json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == []
    lines = run.stderr.splitlines()
    assert lines[0] == "engine_load: no rows"
    assert lines[1].startswith("note: `steps` is empty in this store")
