"""`infertrace simulate` as a user runs it: a real subprocess writing a real trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infertrace import semconv as sc
from tests.otlp_proto import spans

WORKLOADS = Path(__file__).resolve().parents[2] / "shared" / "workloads"


def infertrace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "infertrace.cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_simulate_writes_a_trace_and_summarises_it_in_one_paragraph(tmp_path: Path) -> None:
    out = tmp_path / "trace.jsonl.gz"
    result = infertrace("simulate", "--duration", "20", "--rate", "3", "--seed", "5", "--policy", "decode_first",
                        "--max-num-batched-tokens", "1024", "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = " ".join(result.stderr.split())
    requests = [p for p in spans(out) if p.span.name == sc.SPAN_REQUEST]
    assert f"{len(requests)} requests (0 rejected)" in summary
    for phrase in ("TTFT p50", "ITL p50", "prefix cache", "generated tokens"):
        assert phrase in summary
    assert {p.resource[sc.ENGINE_POLICY] for p in requests} == {"decode_first"}


@pytest.mark.skipif(not WORKLOADS.is_dir(), reason="../shared/workloads is not beside this clone")
def test_simulate_replays_the_azure_trace(tmp_path: Path) -> None:
    out = tmp_path / "azure.jsonl"
    result = infertrace("simulate", "--workload", "azure", "--workload-file", str(WORKLOADS / "azure_conv_2023.csv"),
                        "--duration", "30", "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr
    ids = {p.attrs[sc.REQUEST_ID] for p in spans(out) if p.span.name == sc.SPAN_REQUEST}
    assert ids and all(i.startswith("azure-") for i in ids)


@pytest.mark.slow
def test_bad_input_exits_2_naming_the_input_and_the_problem(tmp_path: Path) -> None:
    cases = [
        (("--policy", "fastest"), "policy"),
        (("--model", "gpt-7"), "gpt-7"),
        (("--hardware", "TPU"), "TPU"),
        (("--workload", "azure", "--workload-file", str(tmp_path / "missing.csv")), "missing.csv"),
        (("--rate", "-1"), "rate"),
    ]
    for args, named in cases:
        result = infertrace("simulate", "--duration", "5", "--out", str(tmp_path / "t.jsonl"), "--no-progress", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert named in result.stderr, (args, result.stderr)
