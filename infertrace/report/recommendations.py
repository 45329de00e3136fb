"""Recommendations, each tied to the analyzer numbers that justify it. A rule only compares numbers that the
analyzers produced (an observed p99 against the analyzer's own counterfactual, or against the SLO target);
it computes nothing new.

- chunked prefill: the ITL analyzer's counterfactual says a per-step prefill budget lowers an engine's ITL
  p99 (prefill collisions stalled its slowest tokens); where the store keeps a trustworthy replay of the model's
  traffic with that budget (`infertrace replay`), the predicted TTFT and ITL come from the replay, and say so;
- disaggregation: with that budget the engine's ITL p99 would still exceed the model's ITL target, while
  without prefill interference it would meet it: only separating prefill from decode removes the rest;
- GPU prefill host: the TTFT analyzer found an engine on a CPU-only host and predicts (roofline prefill on a GPU,
  KV transfer, M/D/1 wait, one decode step of the host) the TTFT with a GPU prefill host in front of it;
- incident: look first at the top-ranked cause of each incident, with its evidence;
- prefill micro-batch: the roofline analyzer found an engine's micro-batch memory-bound and names a larger
  one with its predicted throughput;
- cache busting: the prefix-cache analyzer found a tenant whose requests stopped hitting its system prompt's
  blocks, with the cached tokens and savings lost.
"""

from __future__ import annotations

from typing import Any


def _itl_target(doc: dict[str, Any]) -> tuple[str, float] | None:
    for t in doc["sections"].get("slo", {}).get("targets", []):
        if t["metric"] == "itl":
            return t["key"], t["threshold"]
    return None


def _replay_sentence(found: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    doc, v = found["doc"], found["variant"]
    base, pred = doc["baseline"]["predicted"], v["predicted"]
    worst = doc["trust"]["worst_error"]
    cost = "a calibrated cost model" if doc["calibrated"] else "the uncalibrated roofline cost model"
    text = (f" A replay of {doc['requests']} captured requests under {v['name']} ({cost}; its baseline within "
            f"{abs(worst):.1%} of the capture) predicts ITL p99 {base['itl_p99_ms']:.1f} → {pred['itl_p99_ms']:.1f} "
            f"ms and TTFT p99 {base['ttft_p99_ms']:.1f} → {pred['ttft_p99_ms']:.1f} ms.")
    evidence = {"replay": doc.get("path"), "variant": v["name"], "calibrated": doc["calibrated"],
                "baseline_itl_p99_ms": base["itl_p99_ms"], "replayed_itl_p99_ms": pred["itl_p99_ms"],
                "baseline_ttft_p99_ms": base["ttft_p99_ms"], "replayed_ttft_p99_ms": pred["ttft_p99_ms"]}
    return text, evidence


def unevaluated(doc: dict[str, Any]) -> list[str]:
    """The rules whose sections are in the document but could not feed them, and why: with none recommended,
    "None" must not read as "nothing to change" where a rule never had its evidence. (A section left out of the
    report on request is not listed.)"""
    sections = doc["sections"]

    def missing(name: str) -> str | None:
        section = sections.get(name)
        return None if section is None or section.get("status") == "ok" else section.get("reason", "no result")

    out = []
    itl = sections.get("itl")
    why = missing("itl")
    if why is None and itl is not None and "method" in itl:
        why = (f"the {itl['method']} method finds stall windows, not steps, and bounds no ITL p99 with a chunk "
               "budget (that needs engine_step spans)")
    if why is not None:
        out.append(f"chunked prefill and prefill/decode disaggregation: {why}")
    for name, rules in (("prefill_throughput", "prefill micro-batch"), ("prefix_cache", "cache busting"),
                        ("ttft", "GPU prefill host"), ("incidents", "incident causes")):
        why = missing(name)
        if why is None and name == "prefix_cache":
            why = sections.get(name, {}).get("busting_unchecked")
        if why is not None:
            out.append(f"{rules}: {why}")
    return out


def recommend(doc: dict[str, Any], whatifs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """`whatifs`: the store's kept what-if replays (infertrace.replay.saved), newest first."""
    from infertrace.replay.saved import replayed_chunk_budget

    out: list[dict[str, Any]] = []
    sections = doc["sections"]
    itl = sections.get("itl", {})
    target = _itl_target(doc)
    for e in itl.get("engines", []) if itl.get("status") == "ok" and "method" not in itl else []:
        observed, chunked, clean = e["itl_p99_ms"], e["itl_p99_with_chunk_budget_ms"], e["itl_p99_without_prefill_ms"]
        if not e["stalls"].get("prefill") or observed is None or chunked is None or chunked >= observed:
            continue
        budget = e["chunk_budget_tokens"]
        evidence = {"instance": e["instance"], "itl_p99_ms": observed, "itl_p99_with_chunk_budget_ms": chunked,
                    "itl_p99_without_prefill_ms": clean, "prefill_share_of_p99": e["prefill_share_of_p99"],
                    "prefill_stalls": e["stalls"]["prefill"], "chunk_budget_tokens": budget}
        replayed = replayed_chunk_budget(whatifs or [], e["model"], budget)
        extra = {} if replayed is None else {"prediction": "replay", **_replay_sentence(replayed)[1]}
        out.append({
            "id": f"chunked_prefill:{e['instance']}", "section": "itl",
            "action": f"Enable chunked prefill on {e['instance']} ({e['model']}) with a per-step budget of {budget} "
                      f"tokens (max_num_batched_tokens={budget}, decode-first scheduling).",
            "because": f"{e['stalls']['prefill']} steps stalled "
                       f"its decodes behind prefills, and {e['prefill_share_of_p99']:.0%} of its tokens at or "
                       f"above ITL p99 were such stalls; the ITL analyzer bounds p99 from {observed} ms to "
                       f"{chunked} ms with that budget ({clean} ms without any prefill interference)."
                       + ("" if replayed is None else _replay_sentence(replayed)[0]),
            "evidence": {**evidence, **extra},
        })
        if target is not None and clean is not None and chunked > target[1] >= clean:
            out.append({
                "id": f"disaggregate:{e['instance']}", "section": "itl",
                "action": f"Consider disaggregating prefill and decode for {e['model']} (separate prefill workers).",
                "because": f"Even with a {budget}-token budget, ITL p99 on {e['instance']} would be {chunked} ms, "
                           f"above the {target[0]} target of {target[1]} ms; without prefill interference it is "
                           f"{clean} ms.",
                "evidence": {**evidence, "target": target[0], "threshold": target[1]},
            })
    for g in sections.get("ttft", {}).get("gpu_prefill_host", []):
        if g["predicted_ttft_p50_ms"] is None or g["predicted_ttft_p50_ms"] >= g["ttft_p50_ms"]:
            continue
        hosts = g["instances"]
        where = hosts[0] if len(hosts) == 1 else f"the {len(hosts)} engines of {g['model']}"
        out.append({
            "id": f"gpu_prefill_host:{g['model']}", "section": "ttft",
            "action": f"Put a GPU prefill host ({g['gpu_hardware']}) in front of {where} ({g['model']}, "
                      f"{g['hardware']}): prefill there, send the KV cache over a {g['link_gb_s']} GB/s link, keep "
                      f"decoding on {'this host' if len(hosts) == 1 else 'these hosts'} (prefill/decode "
                      f"disaggregation).",
            "because": f"Prompts wait and prefill {g['prefill_p50_ms']} ms at the median on the CPU-only "
                       f"host{'' if len(hosts) == 1 else 's'} (TTFT p50 {g['ttft_p50_ms']} ms). The roofline "
                       f"prefills them in {g['predicted_prefill_p50_ms']} ms on the {g['gpu_hardware']}; taking "
                       f"the {g['prompts']} prompts at their arrivals, batched up to {g['step_budget_tokens']} "
                       f"tokens a step, it would be {g['gpu_utilization']:.0%} busy and a prompt would wait "
                       f"{g['predicted_wait_ms']} ms at the median; with the KV transfer ({g['kv_transfer_p50_ms']} "
                       f"ms) and one decode step of the CPU host ({g['decode_step_ms']} ms) the predicted TTFT p50 "
                       f"is {g['predicted_ttft_p50_ms']} ms, saving {g['prefill_saved_p50_ms']} ms of prefill per "
                       f"median request.",
            "evidence": {k: g[k] for k in ("ttft_p50_ms", "prefill_p50_ms", "predicted_ttft_p50_ms",
                                           "predicted_prefill_p50_ms", "predicted_wait_ms", "gpu_utilization",
                                           "kv_transfer_p50_ms", "decode_step_ms", "prefill_saved_p50_ms",
                                           "gpu_hardware", "link_gb_s", "instances", "step_budget_tokens")},
        })
    for inc in sections.get("incidents", {}).get("incidents", []):
        if not inc["explained"]:
            out.append({
                "id": f"incident:{inc['id']}:unexplained", "section": "incidents",
                "action": f"Look outside the traces for incident {inc['id']} ({', '.join(inc['models'])}): no "
                          f"traced component, engine or tenant's load accounts for its troubled requests.",
                "because": "Every candidate's blame is zero: none changed in a way that explains them. Check what "
                           "the spans do not show: untraced dependencies, the network, the clients, the hosts.",
                "evidence": {"candidates": len(inc["causes"]), "anomalous_requests": inc["anomalous_requests"]},
            })
            continue
        top = inc["causes"][0]
        out.append({
            "id": f"incident:{inc['id']}:{top['id']}", "section": "incidents",
            "action": f"Investigate {top['id']} ({top['kind']}) first for incident {inc['id']} "
                      f"({', '.join(inc['models'])}).",
            "because": " ".join(top["evidence"]),
            "evidence": {"score": top["score"], "ochiai": top["ochiai"], "own_anomaly": top["own_anomaly"]["score"],
                         "e_f": top["e_f"], "n_f": top["n_f"], "e_p": top["e_p"]},
        })
    for e in sections.get("prefill_throughput", {}).get("engines", []):
        if e.get("recommended_microbatch_tokens") is None:
            continue
        out.append({
            "id": f"microbatch:{e['instance']}", "section": "prefill_throughput",
            "action": f"Raise the prefill micro-batch on {e['instance']} ({e['model']}) from "
                      f"{e['microbatch_tokens']} to {e['recommended_microbatch_tokens']} tokens.",
            "because": f"It prefills at {e['measured_tokens_per_s']} tokens/s; below {e['ridge_tokens']} tokens a "
                       f"micro-batch re-reads the weights and is memory-bound on {e['hardware']}; the roofline "
                       f"predicts {e['fix_tokens_per_s']} tokens/s with the larger micro-batch ({e['evidence']}).",
            "evidence": {k: e[k] for k in ("microbatch_tokens", "recommended_microbatch_tokens", "ridge_tokens",
                                           "measured_tokens_per_s", "fix_tokens_per_s")},
        })
    for x in sections.get("prefix_cache", {}).get("busting", []):
        out.append({
            "id": f"cache_busting:{x['tenant']}:{x['system_prompt_id']}", "section": "prefix_cache",
            "action": f"Ask tenant {x['tenant']} to put the shared system prompt {x['system_prompt_id']} first and "
                      f"unchanged in every request (nothing request-specific before it).",
            "because": f"Only {x['full_hits']} of its {x['requests']} requests read the prompt's whole "
                       f"{x['system_prompt_tokens']}-token prefix from the cache; {x['lost_cached_tokens']} cached "
                       f"tokens were recomputed instead, ${x['lost_savings']} in lost savings.",
            "evidence": {k: x[k] for k in ("full_hits", "requests", "full_hit_rate", "lost_cached_tokens",
                                           "lost_savings")},
        })
    return out
