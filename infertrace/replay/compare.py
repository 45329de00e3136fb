"""The what-if result: the capture, the baseline replay checked against it, and each variant beside the baseline;
rendered as a table and as a JSON document."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from infertrace.replay.capture import QUANTILES, Capture, Distribution
from infertrace.replay.deployment import Deployment

# The baseline replay is trustworthy when each of these is within TRUST_TOLERANCE of the capture (relative), or
# within TRUST_FLOOR_MS of it (sub-millisecond differences of sub-millisecond latencies mean nothing).
TRUSTED_METRICS = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
TRUST_TOLERANCE = 0.05
TRUST_FLOOR_MS = 0.2
SCHEMA = "infertrace.whatif/1"


@dataclass(frozen=True)
class Variant:
    name: str  # the --set settings, "baseline" for the captured config
    deployment: dict[str, Any]
    label: str
    predicted: Distribution
    wall_s: float  # time the replay took
    # why this variant's figures are not a prediction to act on (what the capture cannot tell), None: no reason known
    untrustworthy: str | None = None


@dataclass(frozen=True)
class Trust:
    trustworthy: bool | None  # None: nothing to compare (e.g. no step spans and no timings)
    errors: dict[str, float]  # metric -> relative error of the baseline against the capture
    worst_metric: str | None
    worst_error: float | None
    unchecked: tuple[str, ...]  # metrics the capture does not have

    def sentence(self, calibrated: bool = False) -> str:
        """What the baseline's match says; `calibrated`: the cost model was fitted to these engines already."""
        if self.trustworthy is None:
            return "The baseline replay could not be compared with the capture: " + ", ".join(self.unchecked) + \
                " missing."
        checked = ", ".join(f"{m.removesuffix('_ms').replace('_', ' ')} {e:+.1%}" for m, e in self.errors.items())
        if self.unchecked:
            checked += "; not checked, the capture lacks them: " + ", ".join(
                m.removesuffix("_ms").replace("_", " ") for m in self.unchecked)
        if self.trustworthy:
            return (f"The baseline replay reproduces the capture within {TRUST_TOLERANCE:.0%} ({checked}): "
                    "variants are predictions of this model.")
        assert self.worst_metric is not None and self.worst_error is not None
        return (f"The replay is not trustworthy: its baseline misses the capture by {self.worst_error:+.1%} on "
                f"{self.worst_metric.removesuffix('_ms').replace('_', ' ')} (tolerance {TRUST_TOLERANCE:.0%}; "
                f"{checked}). "
                + ("The cost model is calibrated to these engines already: check the captured config (--captured) "
                   "before acting on the variants." if calibrated else
                   "Calibrate the cost model to these engines (`infertrace replay --calibrate`: to their step spans, "
                   "or without them to each request's measured times, prefix-cache hits included) or check the "
                   "captured config before acting on the variants."))


def variant_caveat(capture: Capture, variant: Deployment, calibrated: bool) -> str | None:
    """Why a variant cannot be predicted from this capture, whatever the baseline's match, or None.

    A capture with request timings only (no step spans, e.g. vLLM's `llm_request` spans) and a calibration to them:
    every measured time is a sum over many steps, in which the step's fixed part (scheduling and launch overhead,
    and at small batches the weight reads) shows only as a total. Another tensor-parallel degree divides the weight
    reads but not the overhead, and adds all-reduces whose cost one degree cannot show (the interconnect's model
    stands in); other hardware changes every efficiency. The split the fit chose is one of many that match the
    capture equally well, so such a variant's numbers are an extrapolation. Likewise a capture none of whose passes
    was compute-bound (short chunks of a mixture of experts, whose weight reads pace hundreds of tokens) says
    nothing of the compute efficiency beyond a lower bound: a variant with longer passes is an extrapolation too."""
    base = capture.deployment
    if capture.has_step_spans or not calibrated:
        return None
    if variant.tensor_parallel != base.tensor_parallel:
        return (f"not trustworthy: TP {base.tensor_parallel} → {variant.tensor_parallel} from request timings "
                f"alone: a capture of one degree shows each step's fixed time (overhead plus weight reads, the "
                f"latter divided by the degree) only as a sum, and no all-reduce at TP {variant.tensor_parallel} "
                f"(the interconnect's model stands in); engine step spans or a calibration table with both degrees "
                f"(infertrace calibrate --table) would measure them")
    if variant.hardware != base.hardware or (variant.decode_hardware or variant.hardware) != (
            base.decode_hardware or base.hardware):
        return (f"not trustworthy: other hardware from request timings of {base.hardware}: the fitted efficiencies "
                "are this hardware's; calibrate on the other (infertrace calibrate --table)")
    if (floor := compute_floor_variant(capture, variant)) is not None:
        assert capture.linear_passes is not None
        return (f"not trustworthy: no step of the capture ran its linear layers compute-bound (at most "
                f"{capture.linear_passes[1]} tokens a pass, each paced by its weight reads), so the measured times "
                f"bound the compute efficiency from below only (≥ {floor.cost['compute_efficiency']:.2f}) and the fit "
                f"took the datasheet's ({variant.cost.get('compute_efficiency', 0.0):.2f}); passes of up to "
                f"{_pass_limit(variant)} tokens may be compute-bound. Step spans, or a capture with longer passes (a "
                f"larger chunk budget), would measure it")
    return None


def _pass_limit(variant: Deployment) -> int:
    return min(variant.max_num_batched_tokens, variant.prefill_microbatch or variant.max_num_batched_tokens)


def compute_floor_variant(capture: Capture, variant: Deployment) -> Deployment | None:
    """The variant at the lowest compute efficiency the capture allows, where the variant runs longer linear-layer
    passes than any of a capture none of whose passes was compute-bound (so its numbers rest on a compute efficiency
    the capture bounds from below only): replayed beside the fitted one, the two bracket what the capture can say of
    it (the floor is the slowest it allows). None where the capture constrains what the variant runs."""
    if capture.has_step_spans or capture.linear_passes is None or capture.linear_passes[0] > 0:
        return None
    if _pass_limit(variant) <= capture.linear_passes[1] or capture.linear_passes[2] <= 0:
        return None
    return replace(variant, cost={**variant.cost, "compute_efficiency": capture.linear_passes[2]})


def relative_error(predicted: float | None, observed: float | None) -> float | None:
    if predicted is None or observed is None or observed == 0:
        return None
    return (predicted - observed) / observed


def trust(observed: Distribution, baseline: Distribution) -> Trust:
    errors: dict[str, float] = {}
    unchecked = []
    failed: list[tuple[float, str]] = []
    for m in TRUSTED_METRICS:
        o, p = getattr(observed, m), getattr(baseline, m)
        e = relative_error(p, o)
        if e is None:
            unchecked.append(m)
            continue
        errors[m] = e
        if abs(e) > TRUST_TOLERANCE and abs(p - o) > TRUST_FLOOR_MS:
            failed.append((abs(e), m))
    if not errors:
        return Trust(None, {}, None, None, tuple(unchecked))
    worst = max(failed) if failed else max((abs(e), m) for m, e in errors.items())
    return Trust(not failed, errors, worst[1], errors[worst[1]], tuple(unchecked))


@dataclass(frozen=True)
class WhatIf:
    model: str
    window: dict[str, int | None]
    requests: int
    unserved: dict[int, int]
    captured_config: dict[str, Any]
    config_source: str
    calibrated: bool
    observed: Distribution
    baseline: Variant
    trust: Trust
    variants: tuple[Variant, ...]
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["schema"] = SCHEMA
        doc["trust"]["sentence"] = self.trust.sentence(self.calibrated)
        doc["unserved"] = {str(k): v for k, v in self.unserved.items()}
        doc["quantiles"] = list(QUANTILES)
        return doc


def build(capture: Capture, baseline: Variant, variants: list[Variant], calibrated: bool) -> WhatIf:
    return WhatIf(capture.model, {"since_ns": capture.since_ns, "until_ns": capture.until_ns},
                  len(capture.requests), dict(capture.unserved), capture.deployment.as_dict(),
                  capture.config_source, calibrated, capture.observed, baseline,
                  trust(capture.observed, baseline.predicted), tuple(variants), capture.notes)


COLUMNS = (("TTFT p50", "ttft_p50_ms"), ("TTFT p99", "ttft_p99_ms"), ("ITL p50", "itl_p50_ms"),
           ("ITL p99", "itl_p99_ms"), ("E2E p50", "e2e_p50_ms"), ("E2E p99", "e2e_p99_ms"))


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def rows(result: WhatIf) -> list[list[str]]:
    """The table's rows: capture, baseline, each variant (latencies in ms)."""
    def row(name: str, d: Distribution) -> list[str]:
        kv = "—" if d.kv_peak is None else f"{d.kv_mean:.0%} / {d.kv_peak:.0%}"
        tput = "—" if d.output_tokens_per_s is None else f"{d.output_tokens_per_s:.0f}"
        pre = "—" if d.preemptions is None else str(d.preemptions)
        return [name, *(_ms(getattr(d, key)) for _, key in COLUMNS), tput, kv, pre]

    out = [row("captured", result.observed), row("baseline replay", result.baseline.predicted)]
    out += [row(v.name, v.predicted) for v in result.variants]
    return out


HEADER = ["", *(c for c, _ in COLUMNS), "tok/s", "KV mean/peak", "preempt"]


def render_text(result: WhatIf) -> str:
    table = [HEADER, *rows(result)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    lines = [f"What if: {result.model}, {result.requests} requests replayed "
             f"({'calibrated cost model' if result.calibrated else 'uncalibrated roofline cost model'}); "
             f"captured config from the {result.config_source}: {result.baseline.label}", ""]
    for r in table:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths,
                                                                                                   strict=True))))
    lines += ["", "Latencies in ms (p50/p99 over requests for TTFT and E2E, over tokens for ITL).",
              result.trust.sentence(result.calibrated)]
    for v in result.variants:
        lines.append(f"  {v.name}: {v.label}" + (f" — {v.untrustworthy}" if v.untrustworthy else ""))
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines) + "\n"
