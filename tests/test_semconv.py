"""The conventions module is the single documented source of every name."""

from __future__ import annotations

from pathlib import Path

from infertrace import semconv as sc

DOC = Path(__file__).resolve().parents[1] / "docs" / "semconv.md"


def test_docs_semconv_md_is_generated_from_the_module_and_not_stale() -> None:
    assert DOC.read_text() == sc.markdown(), "regenerate: python -m infertrace.semconv > docs/semconv.md"


def test_every_name_is_defined_once_and_documented() -> None:
    names = [(c.kind, c.name) for c in sc.REGISTRY]
    assert len(names) == len(set(names))
    assert all(c.brief for c in sc.REGISTRY)


def test_engine_internals_live_under_one_prefix_and_vllm_latency_names_are_kept() -> None:
    for c in sc.REGISTRY:
        if c.source == "infertrace" and c.kind == "attribute" and not c.name.startswith(("gen_ai.", "error.", "http.")):
            assert c.name.startswith(sc.PREFIX), c.name
    vllm = {"gen_ai.latency.time_in_queue", "gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e",
            "gen_ai.latency.time_in_model_prefill", "gen_ai.latency.time_in_model_decode"}
    assert vllm <= {c.name for c in sc.REGISTRY}
    assert sc.SPAN_REQUEST == "llm_request"
