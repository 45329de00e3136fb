"""Real engines' and gateways' telemetry: what each source emits (span names, attribute keys and types, clocks),
read from its code at a pinned commit and cited module by module, and what a store holding it can answer.

- `vllm`, `sglang`, `tgi`, `gateways`: one profile per source (`SourceProfile`), with its citations;
- `capabilities.store_capabilities`: which sources a store holds and which analyses it supports, and why not;
- `components`: the `--components components.toml` file that names the kinds of a gateway's components.

The store turns every source into the same relations (infertrace/store/relations/*.sql); nothing here parses
spans. The reference engine emulates each source (`infertrace simulate --telemetry`).
"""
