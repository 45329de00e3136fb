"""Prefill/decode disaggregation, from the exported spans: the KV transfer's bytes and time, TTFT that
includes it, decode workers whose ITL no longer spikes on prefills, and a congested link."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from infertrace import semconv as sc
from infertrace.analyzers.disaggregation import batched_prefills, fifo_waits
from reference_engine.engine.models import model
from reference_engine.scenarios.bank import TRACES_FILE, run_scenario
from reference_engine.scenarios.families import make_scenario
from tests.fleet_traces import ParsedSpan, Traces, fleet_from_toml, simulate_fleet
from tests.otlp_proto import token_times

TENANT = """
[[tenant]]
name = "acme"
rate = 5.0
prompt_mean = 3000.0
prompt_sigma = 0.5
output_mean = 150.0
system_prompt_fraction = 0.0
"""

COLOCATED = """
[[router]]
id = "router-0"

[[model]]
name = "llama-3-8b"
replicas = 2
""" + TENANT

DISAGGREGATED = """
[[router]]
id = "router-0"

[[link]]
id = "dc1-dc2"
bandwidth_gb_s = 12.5
latency_ms = 2.0

[[model]]
name = "llama-3-8b"
region = "dc1"
[model.disaggregation]
prefill_replicas = 1
decode_replicas = 1
decode_hardware = "H200"
decode_region = "dc2"
link = "dc1-dc2"
""" + TENANT


def _itl_ms(steps: list[ParsedSpan]) -> np.ndarray:
    gaps = [np.diff(ts) for ts in token_times(steps).values() if len(ts) > 1]  # type: ignore[arg-type]
    return np.concatenate(gaps) / 1e6


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Traces]:
    out = {}
    for name, text in (("colocated", COLOCATED), ("disaggregated", DISAGGREGATED)):
        path = tmp_path_factory.mktemp(name) / "traces.jsonl"
        simulate_fleet(fleet_from_toml(text), path, duration_s=60, seed=4)
        out[name] = Traces.read(path)
    return out


def test_kv_transfer_moves_2_layers_kv_heads_head_dim_dtype_bytes_per_prompt_token_over_the_link(
        runs: dict[str, Traces]) -> None:
    traces = runs["disaggregated"]
    spec = model("llama-3-8b")
    per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * spec.dtype_bytes
    assert per_token == 131072
    prompts = {p.attrs[sc.REQUEST_ID]: p.attrs[sc.USAGE_INPUT_TOKENS] for p in traces.named(sc.SPAN_REQUEST)}
    transfers = traces.named(sc.SPAN_KV_TRANSFER)
    assert len(transfers) == len(traces.named(sc.SPAN_GATEWAY)) > 200
    for p in transfers:
        assert p.attrs[sc.KV_TRANSFER_BYTES] == per_token * prompts[p.attrs[sc.REQUEST_ID]]
        assert (p.attrs[sc.KV_TRANSFER_SOURCE], p.attrs[sc.KV_TRANSFER_DESTINATION], p.attrs[sc.KV_TRANSFER_LINK]) == (
            "llama-3-8b-prefill-0", "llama-3-8b-decode-0", "dc1-dc2")
        seconds = (p.span.end_time_unix_nano - p.span.start_time_unix_nano) / 1e9
        assert seconds >= 0.002 + p.attrs[sc.KV_TRANSFER_BYTES] / 12.5e9 - 1e-9  # latency + bytes / bandwidth
    alone = [p for p in transfers if p.span.end_time_unix_nano - p.span.start_time_unix_nano
             <= 0.002e9 + p.attrs[sc.KV_TRANSFER_BYTES] / 12.5 + 2]
    assert len(alone) > 0.5 * len(transfers)  # most transfers did not queue behind another


def test_ttft_includes_the_prefill_worker_the_transfer_and_the_decode_workers_first_step(
        runs: dict[str, Traces]) -> None:
    for spans in runs["disaggregated"].by_trace().values():
        by_kind = defaultdict(list)
        for p in spans:
            by_kind[(p.span.name, p.resource.get(sc.COMPONENT_KIND))].append(p)
        gateway = by_kind[(sc.SPAN_GATEWAY, "gateway")][0]
        [prefill] = by_kind[(sc.SPAN_REQUEST, "prefill_worker")]
        [transfer] = by_kind[(sc.SPAN_KV_TRANSFER, "decode_worker")]
        [decode] = by_kind[(sc.SPAN_REQUEST, "decode_worker")]
        assert prefill.attrs[sc.USAGE_OUTPUT_TOKENS] == 1
        assert prefill.span.end_time_unix_nano == transfer.span.start_time_unix_nano
        assert transfer.span.end_time_unix_nano == decode.span.start_time_unix_nano
        first_token = next(e for e in decode.span.events if e["name"] == sc.EVENT_FIRST_TOKEN)
        ttft = int(first_token["timeUnixNano"]) - gateway.span.start_time_unix_nano
        transfer_ns = transfer.span.end_time_unix_nano - transfer.span.start_time_unix_nano
        prefill_ns = prefill.span.end_time_unix_nano - prefill.span.start_time_unix_nano
        assert ttft > transfer_ns + prefill_ns
        # the decode worker computed only the last prompt token: its KV for the rest came over the link
        assert decode.attrs[sc.PREFILL_CHUNKS] == 1
        assert decode.attrs[sc.USAGE_OUTPUT_TOKENS] == gateway.attrs[sc.USAGE_OUTPUT_TOKENS]


def test_decode_workers_itl_no_longer_spikes_on_prefills(runs: dict[str, Traces]) -> None:
    colocated = _itl_ms(runs["colocated"].named(sc.SPAN_STEP))
    decode_steps = [p for p in runs["disaggregated"].named(sc.SPAN_STEP)
                    if p.resource[sc.COMPONENT_KIND] == "decode_worker"]
    disaggregated = _itl_ms(decode_steps)
    # colocated, prefill-first: a 3k-token prompt's step stalls every decode for tens of ms
    assert np.percentile(colocated, 99) > 3 * np.median(colocated)
    assert np.percentile(disaggregated, 99.9) < 1.3 * np.median(disaggregated)
    assert max(p.attrs[sc.STEP_PREFILL_TOKENS] for p in decode_steps) <= 8  # one token per arriving request


def test_a_congested_link_slows_the_transfers_that_start_while_it_lasts(tmp_path: Path) -> None:
    text = DISAGGREGATED.replace("rate = 5.0", "rate = 2.0")
    scenario = make_scenario("kv_transfer_congestion", 3, duration_s=120, fleet=fleet_from_toml(text))
    truth = run_scenario(scenario, tmp_path)
    link = truth["root_cause"]["instances"][0]
    fraction = truth["fault"]["params"]["bandwidth_fraction"]
    start, end = truth["window"]["start_ns"], truth["window"]["end_ns"]
    [spec_link] = scenario.fleet.links
    traces = Traces.read(tmp_path / TRACES_FILE)
    rates: dict[bool, list[float]] = defaultdict(list)
    for p in traces.named(sc.SPAN_KV_TRANSFER):
        assert p.attrs[sc.KV_TRANSFER_LINK] == link
        seconds = (p.span.end_time_unix_nano - p.span.start_time_unix_nano) / 1e9 - spec_link.latency_ms / 1e3
        rates[start <= p.span.start_time_unix_nano < end].append(p.attrs[sc.KV_TRANSFER_BYTES] / seconds)
    normal = statistics.median(rates[False])
    assert normal == pytest.approx(spec_link.bandwidth_gb_s * 1e9, rel=0.05)
    assert statistics.median(rates[True]) < 2 * fraction * normal  # queueing only lowers it further


def test_a_gpu_prefill_host_takes_waiting_prompts_together_while_they_fit_its_step_budget() -> None:
    arrival, tokens = np.array([0, 1, 2, 10]), np.array([8000, 6000, 4000, 100])
    service = np.array([5.0, 4.0, 3.0, 1.0])
    # the second and third arrive during the first's step and go together (10,000 tokens fit 16,384), paying the
    # step overhead once; the fourth waits for their step
    waits, ends = batched_prefills(arrival, tokens, service, 16384, step_overhead_ns=0.5)
    assert ends.tolist() == [5.0, 11.5, 11.5, 12.5] and waits.tolist() == [0.0, 4.0, 3.0, 1.5]
    # with 9,000 tokens a step they go one after the other, in arrival order
    waits, ends = batched_prefills(arrival, tokens, service, 9000, step_overhead_ns=0.5)
    assert ends.tolist() == [5.0, 9.0, 12.0, 13.0] and waits.tolist() == [0.0, 4.0, 7.0, 2.0]
    # with no room for two, it is the FIFO queue of Lindley's recursion
    waits, ends = batched_prefills(arrival, tokens, service, 0, step_overhead_ns=0.5)
    assert waits.tolist() == fifo_waits(arrival, service).tolist()


def test_an_instance_slowdown_on_the_prefill_worker_slows_that_pool_alone(tmp_path: Path) -> None:
    fault = '\n[[fault]]\nkind = "instance_slowdown"\ntarget = "llama-3-8b-prefill-0"\nstart_s = 20.0\n' \
            'duration_s = 20.0\nfactor = 3.0\n'
    spec = fleet_from_toml(DISAGGREGATED.replace("rate = 5.0", "rate = 2.0") + fault)
    path = tmp_path / "traces.jsonl"
    simulate_fleet(spec, path, duration_s=60, seed=4)
    traces = Traces.read(path)
    start = min(p.span.start_time_unix_nano for p in traces.named(sc.SPAN_GATEWAY))
    ns_per_token: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for p in traces.named(sc.SPAN_STEP):
        tokens = p.attrs.get(sc.STEP_PREFILL_TOKENS, 0) + p.attrs.get(sc.STEP_DECODE_TOKENS, 0)
        t = (p.span.start_time_unix_nano - start) / 1e9
        if tokens and not 19 < t < 21 and not 39 < t < 41:  # steps across an edge are partly slowed
            ns_per_token[(p.resource[sc.COMPONENT_KIND], 20 <= t < 40)].append(
                (p.span.end_time_unix_nano - p.span.start_time_unix_nano) / tokens)
    prefill = statistics.median(ns_per_token[("prefill_worker", True)]) / \
        statistics.median(ns_per_token[("prefill_worker", False)])
    decode = statistics.median(ns_per_token[("decode_worker", True)]) / \
        statistics.median(ns_per_token[("decode_worker", False)])
    assert 2.5 < prefill < 3.5
    assert 0.7 < decode < 1.3
