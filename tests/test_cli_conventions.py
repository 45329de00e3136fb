"""The conventions every `infertrace` command follows, checked as a user meets them: real subprocesses, a real
collector on 127.0.0.1, the click command tree the entry point builds."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import typer.main

from infertrace.cli import app
from infertrace.cli.conventions import STORE_ENV, otlp_endpoint_from_env, parse_duration_ns, parse_when
from infertrace.runbook import run_query
from infertrace.store.collector import Collector
from infertrace.store.store import Store
from tests.incident_stores import sample_store

ROOT = Path(__file__).resolve().parents[1]
NOW = 1_800_000_000 * 10**9


def infertrace(*args: str, env: dict[str, str] | None = None, module: str = "infertrace") \
        -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "INFERTRACE_"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300,
                          env={**full_env, "COLUMNS": "200"}, cwd=ROOT)


def commands(command=None, path=()) -> Iterator[tuple[tuple[str, ...], object]]:  # type: ignore[no-untyped-def]
    command = command or typer.main.get_command(app)
    subs = getattr(command, "commands", {})
    if not subs:
        yield path, command
    for name, sub in subs.items():
        yield from commands(sub, (*path, name))


@pytest.fixture(scope="module")
def store() -> Path:
    return sample_store("prefill_storm").store


@pytest.mark.slow
def test_version_prints_the_installed_version_and_python_dash_m_infertrace_runs_the_cli() -> None:
    result = infertrace("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"infertrace {metadata.version('infertrace')}"
    assert infertrace("--help").returncode == 0
    assert infertrace("--version", module="infertrace.cli").stdout == result.stdout


def test_every_command_has_an_example_whose_options_exist_and_parse(monkeypatch: pytest.MonkeyPatch,
                                                                      store: Path) -> None:
    monkeypatch.setenv(STORE_ENV, str(store))
    found = 0
    for path, command in commands():
        text = command.help or ""  # type: ignore[attr-defined]
        assert "Example:" in text, f"`infertrace {' '.join(path)} --help` has no Example block"
        lines = [line.strip() for line in text.split("Example:", 1)[1].splitlines() if line.strip()]
        assert lines, path
        for line in lines:
            words = shlex.split(line)
            while words and "=" in words[0]:  # VAR=value before the command
                words.pop(0)
            assert words[:1 + len(path)] == ["infertrace", *path], line
            # click parses and type-checks the example (unknown options, missing required ones, bad numbers)
            command.make_context(" ".join(path), words[1 + len(path):])  # type: ignore[attr-defined]
            found += 1
    assert found >= 15


@pytest.mark.slow  # one of the longest in the default run; CI runs it with the slow set
def test_help_shows_defaults_and_env_vars_without_type_noise_or_eaten_brackets() -> None:
    for path, _ in commands():
        result = infertrace(*path, "--help")
        assert result.returncode == 0, (path, result.stderr)
        for noise in ("<bool>", "<list[", "{STR"):
            assert noise not in result.stdout, (path, noise)
    simulate = infertrace("simulate", "--help").stdout
    assert "[default: llama-3-8b; tiny with --executor real]" in " ".join(simulate.split())
    assert "[default: 16384]" in simulate
    assert f"[env var: {STORE_ENV}]" in infertrace("report", "--help").stdout


def test_every_command_with_a_store_option_reads_infertrace_store() -> None:
    with_store = [(path, p) for path, c in commands() for p in c.params if p.name == "store"]  # type: ignore
    assert len(with_store) >= 6
    for path, param in with_store:
        assert param.envvar == STORE_ENV, path


@pytest.mark.slow
def test_query_and_report_run_on_the_store_named_by_infertrace_store(store: Path) -> None:
    env = {STORE_ENV: str(store)}
    result = infertrace("query", "worst_itl_gaps", "--param", "top=3", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    with Store.open(store) as opened:
        expected = run_query(opened, "worst_itl_gaps", {"top": "3"})
    assert result.stdout.count('"request_id"') == len(expected) == 3
    report = infertrace("report", "--section", "slo", "--fail-on", "never", env=env)
    assert report.returncode == 0, report.stderr
    assert "Fleet SLO summary" in report.stdout


@pytest.mark.slow
def test_a_mistyped_query_name_or_parameter_gets_did_you_mean_and_exit_2(store: Path) -> None:
    result = infertrace("query", "--store", str(store), "worst_itl_gap")
    assert result.returncode == 2
    assert "did you mean worst_itl_gaps?" in result.stderr
    result = infertrace("query", "--store", str(store), "worst_itl_gaps", "--param", "tpo=3")
    assert result.returncode == 2
    assert "did you mean top?" in result.stderr
    result = infertrace("report", "--store", str(store), "--format", "jsno")
    assert result.returncode == 2 and "did you mean json?" in result.stderr


def test_relative_times_count_back_from_now() -> None:
    assert parse_duration_ns("15m") == 15 * 60 * 10**9
    assert parse_duration_ns("1h30m") == 90 * 60 * 10**9
    assert parse_duration_ns("15") is None and parse_duration_ns("m") is None and parse_duration_ns("2x") is None
    assert parse_when("-15m", NOW) == NOW - 15 * 60 * 10**9
    assert parse_when("2h", NOW) == NOW - 2 * 3600 * 10**9
    assert parse_when("now", NOW) == NOW
    assert parse_when("2026-01-01T00:00:30Z", NOW) == 1_767_225_630 * 10**9
    assert parse_when("1767225630", NOW) == 1_767_225_630 * 10**9
    with pytest.raises(ValueError, match="yesterday"):
        parse_when("yesterday", NOW)


@pytest.mark.slow
def test_report_and_query_take_relative_times_and_say_when_the_window_misses_the_store(store: Path) -> None:
    result = infertrace("report", "--store", str(store), "--since", "-15m", "--section", "slo")
    assert result.returncode == 0, result.stderr
    assert "holds none of the store's spans" in " ".join(result.stderr.split())
    result = infertrace("query", "--store", str(store), "slowest_requests", "--param", "since=-1h", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"  # the sample's spans are from 2026-01-01, not the last hour
    result = infertrace("report", "--store", str(store), "--since", "yesterday")
    assert result.returncode == 2 and "'yesterday' is not a time" in result.stderr


@pytest.mark.slow
def test_terminal_tables_are_rich_tables_with_numbers_right_aligned(store: Path) -> None:
    result = infertrace("query", "--store", str(store), "worst_itl_gaps", "--param", "top=3")
    assert result.returncode == 0, result.stderr
    header, rule, *rows = result.stdout.rstrip("\n").splitlines()
    assert set(rule) == {"─"} and len(rows) == 3
    right_edge = header.index("itl_ms") + len("itl_ms")
    assert all(row[right_edge - 1] != " " and row[right_edge] == " " for row in rows)  # right-aligned numbers


def test_completion_offers_commands_and_runbook_query_names() -> None:
    script = Path(sys.executable).parent / "infertrace"  # the installed entry point that completion runs

    def complete(words: str, index: int) -> list[str]:
        env = {**os.environ, "_INFERTRACE_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(index)}
        return subprocess.run([str(script)], capture_output=True, text=True, env=env, timeout=60).stdout.split()

    assert complete("infertrace repo", 1) == ["report"]
    assert sorted(complete("infertrace rep", 1)) == ["replay", "report"]
    assert complete("infertrace query worst", 2) == ["worst_itl_gaps"]


@pytest.mark.slow
def test_log_level_sends_log_records_to_stderr_and_a_bad_level_is_a_usage_error(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.pftrace"
    quiet = infertrace("export", "--store", str(store), "--format", "perfetto", "--out", str(out), "--no-progress")
    assert quiet.returncode == 0, quiet.stderr
    assert "perfetto export:" not in quiet.stderr
    loud = infertrace("--log-level", "info", "export", "--store", str(store), "--format", "perfetto", "--out",
                      str(out), "--no-progress")
    assert loud.returncode == 0, loud.stderr
    assert re.search(r"perfetto export: \d+ steps", loud.stderr)
    bad = infertrace("--log-level", "verbose", "query", "--list")
    assert bad.returncode == 2 and "--log-level" in bad.stderr


def test_simulate_without_a_destination_is_a_usage_error(tmp_path: Path) -> None:
    result = infertrace("simulate", "--duration", "5", "--no-progress")
    assert result.returncode == 2
    assert "--out" in result.stderr and "OTEL_EXPORTER_OTLP_ENDPOINT" in result.stderr
    grpc = infertrace("simulate", "--duration", "5", "--no-progress",
                      env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
                           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert grpc.returncode == 2 and "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in grpc.stderr


def test_otlp_endpoint_resolves_as_the_sdk_does() -> None:
    assert otlp_endpoint_from_env({}) is None
    assert otlp_endpoint_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318/"}) == "http://h:4318/v1/traces"
    assert otlp_endpoint_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318",
                                   "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"}) == "http://t:1/x"


def test_simulate_sends_to_the_collector_the_otel_environment_names_with_its_headers(tmp_path: Path) -> None:
    collector = Collector(tmp_path / "store", "127.0.0.1", 0, token="s3cret")
    collector.start()
    address = collector.address
    try:
        result = infertrace("simulate", "--duration", "10", "--rate", "2", "--seed", "3", "--no-progress", env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{address}",
            "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20s3cret"})
    finally:
        collector.shutdown()
    assert result.returncode == 0, result.stderr
    assert f"http://{address}/v1/traces" in result.stderr
    requests = int(re.search(r"(\d+) requests", " ".join(result.stderr.split())).group(1))
    with Store.open(tmp_path / "store") as opened:
        assert opened.sql("SELECT count(*) FROM requests").fetchall()[0][0] == requests > 0


@pytest.mark.parametrize("command", [("report",), ("store", "check"), ("store", "compact"), ("dashboard",),
                                     ("export", "--format", "otlp", "--out", "-")])
def test_a_trace_file_given_as_the_store_is_named_a_file_with_the_command_that_ingests_it(command: tuple[str, ...]) \
        -> None:
    traces = ROOT / "sample_traces" / "host_pauses" / "traces.jsonl.gz"
    done = infertrace(*command, "--store", str(traces))
    assert done.returncode == 2, done.stderr
    assert f"a file, not a store directory (`infertrace ingest --store DIR {traces}` reads it into one)" in done.stderr
