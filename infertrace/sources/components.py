"""Naming the components a gateway's spans show: a small TOML file (`--components components.toml`) that gives
each kind of span a component kind, for gateways that do not say it themselves (LiteLLM proxy, Envoy AI Gateway,
Kong, an in-house gateway). docs/sources.md has one for each.

    # the first rule that matches a span wins; a rule matches on every key it gives
    [[component]]
    span = "auth"                 # the span's name
    kind = "auth"
    [[component]]
    service = "envoy-ratelimit"   # the span's service.name
    kind = "rate_limiter"
    [[component]]
    route = "/v1/route"           # the span's http.route
    kind = "router"
    [[component]]
    span = "redis"
    kind = "ignore"               # not a component: drop its spans

Kinds: auth, rate_limiter, router, scheduler (a queue), gateway, component (a component of unknown kind), or
ignore. Without a file, a component found in the trace tree is a `component` named by its service, instance and
operation; spans in a proxy's own process (same service as the entry span) count only when a rule names them.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from infertrace.store.store import Store

KINDS = ("auth", "rate_limiter", "router", "scheduler", "gateway", "component", "ignore")
ALIASES = {"queue": "scheduler", "rate-limiter": "rate_limiter", "ratelimiter": "rate_limiter",
           "limiter": "rate_limiter"}
MATCH_KEYS = ("service", "span", "route")
TABLE = "component_rules"


@dataclass(frozen=True)
class Rule:
    kind: str
    service: str | None = None
    span: str | None = None
    route: str | None = None

    def matches(self, service: object, span: object, route: object) -> bool:
        return ((self.service is None or self.service == service) and (self.span is None or self.span == span)
                and (self.route is None or self.route == route))


def parse_rules(raw: dict[str, object], source: str = "components.toml") -> tuple[Rule, ...]:
    """The rules of a parsed components file; ValueError naming the file and the rule for anything else."""
    unknown = set(raw) - {"component"}
    if unknown:
        raise ValueError(f"{source}: unknown top-level keys {sorted(unknown)}; expected [[component]] tables")
    entries = raw.get("component", [])
    if not isinstance(entries, list):
        raise ValueError(f"{source}: `component` must be an array of tables ([[component]])")
    rules = []
    for i, entry in enumerate(entries, 1):
        where = f"{source}: component #{i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not a table")
        extra = set(entry) - {"kind", *MATCH_KEYS}
        if extra:
            raise ValueError(f"{where}: unknown keys {sorted(extra)}; use kind and any of {', '.join(MATCH_KEYS)}")
        kind = str(entry.get("kind", "")).strip().lower()
        kind = ALIASES.get(kind, kind)
        if kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, got {entry.get('kind')!r}")
        match = {k: entry[k] for k in MATCH_KEYS if k in entry}
        if not match:
            raise ValueError(f"{where}: give at least one of {', '.join(MATCH_KEYS)} to match spans on")
        if any(not isinstance(v, str) or not v for v in match.values()):
            raise ValueError(f"{where}: {', '.join(MATCH_KEYS)} must be non-empty strings")
        rules.append(Rule(kind, **match))
    return tuple(rules)


def load_rules(path: str | Path) -> tuple[Rule, ...]:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"--components {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--components {path}: not TOML: {e}") from None
    return parse_rules(raw, str(path))


def register(store: Store, rules: tuple[Rule, ...]) -> None:
    """Makes `rules` the store connection's component names (read by `topology.load_paths`)."""
    store.con.execute(f"CREATE OR REPLACE TEMP TABLE {TABLE} (position INTEGER, kind VARCHAR, service VARCHAR, "
                      "span VARCHAR, route VARCHAR)")
    for i, r in enumerate(rules):
        store.con.execute(f"INSERT INTO {TABLE} VALUES (?, ?, ?, ?, ?)", [i, r.kind, r.service, r.span, r.route])


def registered(store: Store) -> tuple[Rule, ...]:
    ((found,),) = store.con.execute("SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = ?",
                                    [TABLE]).fetchall()
    if not found:
        return ()
    rows = store.con.execute(f"SELECT kind, service, span, route FROM {TABLE} ORDER BY position").fetchall()
    return tuple(Rule(*row) for row in rows)


def name_components(paths: pd.DataFrame, rules: tuple[Rule, ...]) -> pd.DataFrame:
    """`request_paths` rows with each component's kind settled: a rule's kind where one matches (rows of kind
    `ignore` dropped), else the span's own (this project's gateway says it), else `component`. A span in the
    entry's own process (found_by `same_service`) stays only when a rule names it, and is told apart from the
    proxy's other hooks by its operation: its instance becomes `<instance> <operation>`."""
    if paths.empty:
        return paths
    out = paths.copy()
    calls = (out["found_by"] != "engine").to_numpy()
    matched: list[str | None] = [None] * len(out)
    if rules:
        for i, (call, service, span, operation) in enumerate(zip(calls, out["service"], out["span_name"],
                                                                  out["operation"], strict=True)):
            if call:
                matched[i] = next((r.kind for r in rules if r.matches(service, span, operation)), None)
    mapped = pd.Series(matched, index=out.index, dtype=object)
    in_process = (out["found_by"] == "same_service").to_numpy()
    keep = ~(in_process & mapped.isna().to_numpy()) & (mapped != "ignore").to_numpy()
    out["kind"] = mapped.where(mapped.notna(), out["kind"])
    out.loc[calls & out["kind"].isna().to_numpy(), "kind"] = "component"
    out.loc[in_process, "instance"] = out.loc[in_process, "instance"] + " " + out.loc[in_process, "operation"]
    return out[keep].reset_index(drop=True)
