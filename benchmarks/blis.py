"""Runs BLIS (github.com/inference-sim/inference-sim, Go, roofline) on the same requests as a benchmark, for the
side-by-side figures of bench_engine.py and bench_fleet.py. BLIS is not part of this project: build it yourself
(see ../shared/peers/README.md) and pass its binary with `--blis PATH`; it is run from its own directory, where it
reads its defaults.yaml, in its fast mode (`--cache-signal-delay 0`), with the roofline latency model for
Llama-3.1-8B on one H100."""

from __future__ import annotations

import csv
import json
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

from reference_engine.engine.sequence import Request

# BLIS's trace format (TraceV2): a header YAML and a CSV with these columns.
_COLUMNS = ["request_id", "client_id", "tenant_id", "slo_class", "session_id", "round_index", "prefix_group",
            "prefix_length", "streaming", "input_tokens", "output_tokens", "text_tokens", "image_tokens",
            "audio_tokens", "video_tokens", "reason_ratio", "model", "deadline_us", "server_input_tokens",
            "arrival_time_us", "send_time_us", "first_chunk_time_us", "last_chunk_time_us", "num_chunks", "status",
            "error_message", "finish_reason"]


def write_trace(requests: list[Request], prefix: Path) -> tuple[Path, Path]:
    """The requests (arrival, prompt and output lengths; no shared prefixes) as a BLIS trace: PREFIX.yaml/.csv."""
    start = min(r.arrival_ns for r in requests)
    rows = sorted(((r.arrival_ns - start) // 1000, r.prompt.num_tokens, r.output_tokens) for r in requests)
    header, data = prefix.with_suffix(".yaml"), prefix.with_suffix(".csv")
    header.write_text("trace_version: 2\ntime_unit: us\nmode: generated\nwarm_up_requests: 0\n")
    with open(data, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(_COLUMNS)
        for n, (arrival_us, prompt, output) in enumerate(rows):
            writer.writerow([n, "azure", "azure", "", "", "0", "", "0", "true", prompt, output, prompt, 0, 0, 0, 0, "",
                             0, 0, arrival_us, arrival_us, 0, 0, 0, "ok", "", ""])
    return header, data


def run(blis: Path, header: Path, data: Path, instances: int = 1) -> dict[str, Any]:
    """One BLIS run in a fresh process: wall and CPU seconds (all its threads), and the simulated seconds it
    reports."""
    args = [str(blis.resolve()), "replay", "--trace-header", str(header.resolve()), "--trace-data",
            str(data.resolve()), "--model", "meta-llama/llama-3.1-8b-instruct", "--hardware", "H100", "--tp", "1",
            "--latency-model", "roofline", "--cache-signal-delay", "0"]
    if instances > 1:
        args += ["--num-instances", str(instances), "--routing-policy", "round-robin"]
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, cwd=blis.resolve().parent, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"BLIS failed ({done.returncode}): {done.stderr[-2000:]}")
    metrics = _cluster_metrics(done.stdout)
    return {"wall_s": wall, "cpu_s": after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime,
            "simulated_s": float(metrics["vllm_estimated_duration_s"]),
            "requests": int(metrics["completed_requests"])}


def _cluster_metrics(text: str) -> dict[str, Any]:
    """The metrics object of the whole cluster (BLIS prints one per instance, then the cluster's)."""
    decoder = json.JSONDecoder()
    marker = "=== Simulation Metrics ==="
    at = text.find(marker)
    while at >= 0:
        metrics, _ = decoder.raw_decode(text, text.index("{", at))
        if metrics.get("instance_id") == "cluster":
            return metrics
        at = text.find(marker, at + len(marker))
    raise ValueError("BLIS printed no metrics for the cluster")
