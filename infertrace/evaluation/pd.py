"""Prefill/decode disaggregation recommendations against ground truth: for each scenario of the bank whose tasks
include `pd` (family `cpu_decode_host`: a CPU-only host serving a model), the report built from the store must
recommend a GPU prefill host in front of the engine and quote a TTFT p50 within 15% of what the scenario's twin
(the same traffic on that disaggregated deployment, simulated beside it) measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infertrace.evaluation import load_truth, open_scenario_store, scenario_dirs

TOLERANCE = 0.15


def _scenario(scenario: Path, truth: dict[str, Any]) -> dict[str, Any]:
    from infertrace.report.model import ReportOptions, build_report

    measured = truth["details"].get("twin", {}).get("ttft_p50_ms")
    instances = set(truth["root_cause"].get("instances", ()))
    row: dict[str, Any] = {"scenario": truth["scenario"], "family": truth["family"], "measured_ttft_p50_ms": measured,
                           "quoted_ttft_p50_ms": None, "relative_error": None, "recommended": False, "ok": False,
                           "why": None}
    with open_scenario_store(scenario) as store:
        doc = build_report(store, ReportOptions(sections=("ttft",)))
    found = [r for r in doc["recommendations"]
             if r["id"].startswith("gpu_prefill_host:") and r["id"].split(":", 1)[1] in instances]
    if measured is None:
        row["why"] = "the ground truth has no twin measurement"
    elif not found:
        estimates = doc["sections"]["ttft"].get("gpu_prefill_host", [])
        why = doc["sections"]["ttft"].get("not_estimated") or []
        row["why"] = "no GPU prefill host recommendation" + (f" ({'; '.join(why)})" if why else "") + \
            ("" if estimates else "; no CPU-only engine found")
    else:
        quoted = found[0]["evidence"]["predicted_ttft_p50_ms"]
        error = (quoted - measured) / measured
        row.update(quoted_ttft_p50_ms=quoted, relative_error=round(error, 4), recommended=True,
                   ok=abs(error) <= TOLERANCE)
    return row


def evaluate_pd(bank: str | Path) -> dict[str, Any]:
    rows = []
    for scenario in scenario_dirs(bank):
        truth = load_truth(scenario)
        if "pd" in truth.get("tasks", ()):
            rows.append(_scenario(scenario, truth))
    ok = sum(r["ok"] for r in rows)
    return {"cases": len(rows), "within_tolerance": ok, "tolerance": TOLERANCE,
            "share_within_tolerance": round(ok / len(rows), 4) if rows else None,
            "not_analysed": [f"{r['scenario']}: {r['why']}" for r in rows if r["why"]],
            "scenarios": rows}


def render_pd(section: dict[str, Any]) -> str:
    lines = [f"P/D recommendations: {section['within_tolerance']} of {section['cases']} scenarios quote the GPU "
             f"prefill host's TTFT p50 within {section['tolerance']:.0%} of the disaggregated simulation"]
    for r in section["scenarios"]:
        lines.append(f"  {r['scenario']}: measured {r['measured_ttft_p50_ms']} ms, quoted {r['quoted_ttft_p50_ms']} ms"
                     f", error {r['relative_error']}" + (f" ({r['why']})" if r["why"] else ""))
    if not section["cases"]:
        lines.append("  (no scenario of the bank has the pd task: nothing scored)")
    return "\n".join(lines)
