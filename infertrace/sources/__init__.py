"""Real engines' and gateways' telemetry: what each source emits (span names, attribute keys and types, clocks),
read from its code at a pinned commit and cited module by module, and what a store holding it can answer.

- `vllm`, `sglang`, `tgi`, `gateways`: one profile per source (`SourceProfile`), with its citations;
- `capabilities.store_capabilities`: which sources a store holds and which analyses it supports, and why not;
- `components`: the `--components components.toml` file that names the kinds of a gateway's components.

The store turns every source into the same relations (infertrace/store/relations/*.sql); nothing here parses
spans. The reference engine emulates each source (`infertrace simulate --telemetry`).
"""

from infertrace.sources.gateways import LITELLM
from infertrace.sources.profile import Citation, SourceProfile, SpanShape
from infertrace.sources.sglang import SGLANG
from infertrace.sources.tgi import TGI
from infertrace.sources.vllm import V0 as VLLM_V0
from infertrace.sources.vllm import V1 as VLLM_V1

# Engines by the `requests.source` value the store gives their requests; gateways apart.
ENGINES: dict[str, SourceProfile] = {p.name: p for p in (VLLM_V1, VLLM_V0, SGLANG, TGI)}
GATEWAYS: dict[str, SourceProfile] = {LITELLM.name: LITELLM}

__all__ = ["ENGINES", "GATEWAYS", "Citation", "SourceProfile", "SpanShape"]
