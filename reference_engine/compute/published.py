"""Calibrate the cost model on a published measurement table (vendored with its citation, `tables/`), and score it
on the half of the table it was not fitted to.

A table (schema `infertrace.published_table/1`) holds, per model, the published rows of a static inference
benchmark (batch × prompt length × output length at a tensor-parallel degree), the Hugging Face config of the
model (`configs/`), the hardware, and where the numbers come from. Measured steps are read from a row as:

- prefill: a batch-1 row's first-token latency is one prefill step of `prompt_tokens` tokens;
- decode: a row's per-token latency is a decode step of `batch` sequences at the mean context of the
  generation, `prompt_tokens + output_tokens / 2`.

Which columns hold them is the table's to say (`prefill_column`, `decode_column`, in `seconds_per_unit`; by default
LMDeploy's `ftl_ave_s` and `token_latency_p50_s`). Rows repeating a measurement (the same model, degree and shape)
are one step: their median. A prefill's shape is (batch, prompt): rows differing only in output length measure the
same prefill.

The fit is one set of `CostParams` for the table's hardware and engine over every model and TP degree. Held-out
error: the distinct step shapes (model, phase, TP degree, shape) are sorted and alternately assigned to the
fitting half and the held-out half; the fit sees only the first, the error is reported on the second, per phase
and per TP degree, beside the uncalibrated roofline's error (the default `CostParams`) on the same rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reference_engine.compute.calibration import predict_seconds
from reference_engine.compute.real_executor import MeasuredStep
from reference_engine.compute.step_fit import fit_rows
from reference_engine.engine.cost_model import CostParams, StepCostModel
from reference_engine.engine.hardware import hardware as hardware_spec
from reference_engine.engine.model_config import spec_from_hf_config
from reference_engine.engine.models import ModelSpec

TABLES = Path(__file__).resolve().parent / "tables"
TABLE_SCHEMA = "infertrace.published_table/1"


@dataclass(frozen=True)
class TableStep:
    model: str
    tensor_parallel: int
    phase: str
    shape: tuple[int, int, int]  # batch, prompt tokens, output tokens (0 for a prefill)
    step: MeasuredStep


def load_table(path: str | Path) -> tuple[dict[str, Any], dict[str, ModelSpec], list[TableStep]]:
    """(the table's header, each model's architecture, the measured steps); errors name the file and the row."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None
    if doc.get("schema") != TABLE_SCHEMA:
        raise ValueError(f"{path}: not a published measurement table (schema {TABLE_SCHEMA})")
    columns = doc["columns"]
    prefill_col, decode_col = doc.get("prefill_column", "ftl_ave_s"), doc.get("decode_column", "token_latency_p50_s")
    unit = float(doc.get("seconds_per_unit", 1.0))
    need = {"batch", "tp", "prompt_tokens", "output_tokens", prefill_col, decode_col}
    if not need <= set(columns):
        raise ValueError(f"{path}: columns {sorted(need - set(columns))} missing")
    specs: dict[str, ModelSpec] = {}
    measured: dict[tuple[str, int, str, tuple[int, int, int]], list[float]] = {}
    for name, entry in doc["models"].items():
        specs[name] = spec_from_hf_config(path.parent / entry["config"], name=name)
        for i, values in enumerate(entry["rows"]):
            row = dict(zip(columns, values, strict=True))
            batch, tp, prompt, output = (int(row[k]) for k in ("batch", "tp", "prompt_tokens", "output_tokens"))
            if min(batch, tp, prompt, output) < 1:
                raise ValueError(f"{path}: {name} row {i}: batch, tp and token counts must be ≥ 1, got {values}")
            if batch == 1:
                measured.setdefault((name, tp, "prefill", (1, prompt, 0)), []).append(float(row[prefill_col]))
            measured.setdefault((name, tp, "decode", (batch, prompt, output)), []).append(float(row[decode_col]))
    steps = []
    for (name, tp, phase, shape), seconds in sorted(measured.items()):
        ns = round(float(np.median(seconds)) * unit * 1e9)
        batch, prompt, output = shape
        step = (MeasuredStep(((prompt, 0),), 0, 0, 1, ns) if phase == "prefill"
                else MeasuredStep((), batch, batch * (prompt + output // 2), batch, ns))
        steps.append(TableStep(name, tp, phase, shape, step))
    return doc, specs, steps


def split_halves(steps: list[TableStep]) -> tuple[list[TableStep], list[TableStep]]:
    """Distinct shapes sorted, alternately to the fitting half and the held-out half."""
    ordered = sorted(steps, key=lambda s: (s.model, s.phase, s.tensor_parallel, s.shape))
    return ordered[0::2], ordered[1::2]


def fit_table(steps: list[TableStep], specs: dict[str, ModelSpec], hardware: str) -> CostParams:
    """One set of CostParams for the table: the all-reduce latencies fitted where it has two or more TP degrees, and
    the launch cost of a step with a prefill (an engine replaying CUDA graphs for decode-only steps, as vLLM does;
    it fits to about 0 where prefills cost no more than that)."""
    rows = [(s.step, specs[s.model], s.tensor_parallel) for s in steps]
    return fit_rows(rows, hardware_spec(hardware), eager_prefill=True)[0]


def errors(steps: list[TableStep], specs: dict[str, ModelSpec], hardware: str, params: CostParams,
           eager_prefill: bool = True) -> np.ndarray:
    """|predicted − measured| / measured per step, through the simulator's own StepCostModel."""
    hw = hardware_spec(hardware)
    out = []
    for s in steps:
        cost = StepCostModel(specs[s.model], hw, tensor_parallel=s.tensor_parallel, params=params,
                             eager_prefill=eager_prefill)
        measured = s.step.duration_ns / 1e9
        out.append(abs(predict_seconds(cost, s.step) - measured) / measured)
    return np.asarray(out)


def table_report(path: str | Path) -> tuple[dict[str, Any], str]:
    """Fit on half of the table, score on the other half, per phase and TP degree; the roofline's error beside."""
    doc, specs, steps = load_table(path)
    hardware = doc["hardware"]
    fit_half, held = split_halves(steps)
    params = fit_table(fit_half, specs, hardware)
    calibrated = errors(held, specs, hardware, params)
    roofline = errors(held, specs, hardware, CostParams(), eager_prefill=False)
    groups: list[dict[str, Any]] = []
    keys = sorted({(s.tensor_parallel, s.phase) for s in held})
    for tp, phase in [*keys, *((None, p) for p in ("prefill", "decode"))]:
        mask = np.array([(tp is None or s.tensor_parallel == tp) and s.phase == phase for s in held])
        if not mask.any():
            continue
        groups.append({"tensor_parallel": tp, "phase": phase, "held_out_steps": int(mask.sum()),
                       "models": sorted({s.model for s, m in zip(held, mask, strict=True) if m}),
                       "calibrated_median_error": float(np.median(calibrated[mask])),
                       "calibrated_p90_error": float(np.percentile(calibrated[mask], 90)),
                       "roofline_median_error": float(np.median(roofline[mask]))})
    source = doc["source"]
    report = {"table": str(path), "title": doc["title"], "source": source, "hardware": hardware,
              "fitted_steps": len(fit_half), "held_out_steps": len(held),
              "params": {k: getattr(params, k) for k in CostParams.__dataclass_fields__}, "held_out": groups}
    lines = [f"{doc['title']} ({source['url']})",
             f"fitted on {len(fit_half)} of {len(steps)} measured steps, scored on the other {len(held)}:",
             f"  {'TP':>4} {'phase':<8} {'steps':>5} {'calibrated median':>18} {'p90':>7} {'roofline median':>16}"]
    for g in groups:
        tp = "all" if g["tensor_parallel"] is None else str(g["tensor_parallel"])
        lines.append(f"  {tp:>4} {g['phase']:<8} {g['held_out_steps']:>5} {g['calibrated_median_error']:>18.1%} "
                     f"{g['calibrated_p90_error']:>7.1%} {g['roofline_median_error']:>16.1%}")
    p = params
    lines.append(f"  fitted: η_c {p.compute_efficiency:.3g}, η_m {p.memory_efficiency:.3g}, "
                 f"η_a {p.attention_efficiency:.3g}, η_kv {p.kv_memory_efficiency or p.memory_efficiency:.3g}, "
                 f"overhead {p.step_overhead_s * 1e3:.2f} ms + {p.per_sequence_overhead_s * 1e6:.1f} µs/sequence, "
                 f"prefill launches {p.layer_launch_s * 1e6:.1f} µs/layer"
                 + (f", all-reduce α {p.allreduce_latency_s * 1e6:.1f} µs + α_hop "
                    f"{(p.allreduce_hop_latency_s or 0) * 1e6:.2f} µs per ring step, "
                    f"interconnect η {p.interconnect_efficiency:.3g}"
                    if p.allreduce_latency_s is not None else ""))
    return report, "\n".join(lines)
