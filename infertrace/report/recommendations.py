"""Recommendations, each tied to the analyzer numbers that justify it. A rule only compares numbers that the
analyzers produced (an observed p99 against the analyzer's own counterfactual, or against the SLO target);
it computes nothing new.

- chunked prefill: the ITL analyzer's counterfactual says a per-step prefill budget lowers an engine's ITL
  p99 (prefill collisions stalled its slowest tokens);
- disaggregation: with that budget the engine's ITL p99 would still exceed the model's ITL target, while
  without prefill interference it would meet it: only separating prefill from decode removes the rest;
- incident: look first at the top-ranked cause of each incident, with its evidence.
"""

from __future__ import annotations

from typing import Any


def _itl_target(doc: dict[str, Any]) -> tuple[str, float] | None:
    for t in doc["sections"].get("slo", {}).get("targets", []):
        if t["metric"] == "itl":
            return t["key"], t["threshold"]
    return None


def recommend(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    sections = doc["sections"]
    itl = sections.get("itl", {})
    target = _itl_target(doc)
    for e in itl.get("engines", []) if itl.get("status") == "ok" else []:
        observed, chunked, clean = e["itl_p99_ms"], e["itl_p99_with_chunk_budget_ms"], e["itl_p99_without_prefill_ms"]
        if not e["stalls"].get("prefill") or observed is None or chunked is None or chunked >= observed:
            continue
        budget = e["chunk_budget_tokens"]
        evidence = {"instance": e["instance"], "itl_p99_ms": observed, "itl_p99_with_chunk_budget_ms": chunked,
                    "itl_p99_without_prefill_ms": clean, "prefill_share_of_p99": e["prefill_share_of_p99"],
                    "prefill_stalls": e["stalls"]["prefill"], "chunk_budget_tokens": budget}
        out.append({
            "id": f"chunked_prefill:{e['instance']}", "section": "itl",
            "action": f"Enable chunked prefill on {e['instance']} ({e['model']}) with a per-step budget of {budget} "
                      f"tokens (max_num_batched_tokens={budget}, decode-first scheduling).",
            "because": f"{e['stalls']['prefill']} steps stalled "
                       f"its decodes behind prefills, and {e['prefill_share_of_p99']:.0%} of its tokens at or "
                       f"above ITL p99 were such stalls; the ITL analyzer bounds p99 from {observed} ms to "
                       f"{chunked} ms with that budget ({clean} ms without any prefill interference).",
            "evidence": evidence,
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
    for inc in sections.get("incidents", {}).get("incidents", []):
        if not inc["causes"]:
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
    return out
