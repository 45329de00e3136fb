"""A fleet file (TOML): models and their engine replicas, the shared gateway components in front of them,
the links that carry KV between data centres, and the tenants that send traffic.

```toml
name = "two-models"
region = "us-east-1"

[gateway]
timeout_s = 120.0                      # the gateway answers 504 past this (the engine is not aborted)

[diurnal]                              # optional: every synthetic tenant's rate (and background load)
amplitude = 0.3                        # follows 1 + amplitude · sin(2π (t + phase_s) / period_s)
period_s = 1800.0

[[auth]]                               # every component kind is optional; each instance serves `models`
id = "auth-0"                          # (all models when omitted) and `tenants` (all when omitted); a
latency_ms = 2.0                       # request several instances serve is balanced over them
denied_tenants = ["intruder"]          # 401
workers = 8                            # optional: calls served at once (queueing beyond); 0: unlimited
background_rps = 200.0                 # optional: untraced calls from other callers, sharing the workers
timeout_ms = 1000.0                    # optional: the gateway gives up on the call (504) past this

[[rate_limiter]]                       # one token bucket per tenant, shared by all the models it serves
id = "ratelimit-0"
requests_per_s = 20.0
burst = 40.0

[[router]]
id = "router-0"
policy = "least_loaded"                # round_robin, least_loaded or prefix_aware
latency_ms = 1.0

[[global_queue]]                       # holds requests until an engine has fewer than max_inflight
id = "global-queue-0"
max_inflight_per_engine = 64

[[link]]                               # between prefill and decode workers
id = "dc1-dc2"
bandwidth_gb_s = 12.5                  # gigabytes per second
latency_ms = 1.0

[[model]]
name = "llama-3-8b"                    # a model spec (reference_engine.engine.models)
replicas = 2
hardware = "H100-SXM"
[model.engine]                         # any EngineConfig field
policy = "decode_first"
chunked_prefill = true
max_num_batched_tokens = 2048

[[model]]
name = "llama-3-70b"
hardware = "H100-SXM"
engine = { tensor_parallel = 4 }
disaggregation = { prefill_replicas = 1, decode_replicas = 2, decode_hardware = "H200", link = "dc1-dc2" }

[[fault]]                              # optional: an incident, acting through the mechanism it names
kind = "router_latency"                # see FAULT_KINDS
target = "router-0"
start_s = 300.0                        # from the start of traffic
duration_s = 120.0
extra_ms = 400.0

[[tenant]]
name = "acme"
models = { "llama-3-8b" = 3, "llama-3-70b" = 1 }   # weights; or a list (equal shares)
workload = "synthetic"                 # or azure / mooncake with path = "..." (relative to this file)
rate = 4.0                             # and any SyntheticWorkload field
retries = 2                            # optional: retry a 429, 503 or 504 answered before the router
retry_backoff_s = 1.0                  # (exponential backoff with jitter)
```
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from reference_engine.engine.config import EngineConfig
from reference_engine.engine.hardware import hardware
from reference_engine.engine.models import model as model_spec
from reference_engine.workload import SyntheticWorkload

ROUTER_POLICIES = ("round_robin", "least_loaded", "prefix_aware")
WORKLOADS = ("synthetic", "azure", "mooncake")
ENGINE_FIELDS = {f.name for f in fields(EngineConfig)} - {"model", "hardware", "instance_id", "region", "cost"}
SYNTHETIC_FIELDS = {f.name for f in fields(SyntheticWorkload)} - {"tenants"}


# kind -> (what `target` names, parameters with defaults)
# A latency fault's magnitude (extra_ms, factor, error_rate) rises linearly from 0 over its first `ramp_s`
# seconds (0: at once).
FAULT_KINDS: dict[str, tuple[str, dict[str, float | str]]] = {
    # the router adds latency to every route span, or multiplies its service time by `factor` (and answers
    # 503 to a share of requests); with `tenant`, to that tenant's requests only
    "router_latency": ("router", {"extra_ms": 300.0, "error_rate": 0.0, "tenant": "", "factor": 1.0,
                                  "ramp_s": 0.0}),
    # the auth component takes longer to answer (and answers 503 to a share of requests); with `tenant`:
    # that tenant's requests only
    "auth_latency": ("auth", {"extra_ms": 300.0, "tenant": "", "factor": 1.0, "error_rate": 0.0,
                              "ramp_s": 0.0}),
    # the limiter flaps between its configured limit and limit_fraction of it (period_s, duty on)
    "rate_limiter_flapping": ("rate_limiter", {"period_s": 30.0, "duty": 0.5, "limit_fraction": 0.05}),
    # the limiter rejects a share of the calls it would admit (a bad shard of its counter store); with
    # `tenant`: that tenant's calls only
    "rate_limiter_rejections": ("rate_limiter", {"share": 0.15, "tenant": ""}),
    # the global queue dispatches nothing
    "global_queue_stall": ("global_queue", {}),
    # every engine of the model computes each step `factor` times slower
    "engine_slowdown": ("model", {"factor": 2.0}),
    # one engine instance computes each step `factor` times slower (its machine throttles; a prefill or decode
    # worker: that pool loses capacity)
    "instance_slowdown": ("engine", {"factor": 2.0}),
    # the engine's host stops for pause_ms about every every_s seconds (garbage collection, swapping)
    "host_pauses": ("engine", {"pause_ms": 200.0, "every_s": 5.0}),
    # the link's bandwidth falls to bandwidth_fraction of nominal
    "link_congestion": ("link", {"bandwidth_fraction": 0.05}),
    # a tenant sends extra traffic to the model (long prompts: a prefill storm; long outputs: KV pressure)
    "request_surge": ("model", {"tenant": "", "rate": 1.0, "prompt_mean": 8192.0, "prompt_sigma": 0.3,
                                "output_mean": 200.0, "output_sigma": 0.5, "max_tokens": 2048.0}),
    # the tenant sends `factor` times its usual traffic (the same mix of requests); with `model`: to that
    # model only
    "traffic_surge": ("tenant", {"factor": 5.0, "model": "", "ramp_s": 0.0}),
    # the tenant's prompts start with fresh tokens (e.g. a timestamp before the system prompt)
    "cache_busting": ("tenant", {}),
    # requests with an assistant prefill make the model miss its stop token: it generates max_tokens; with
    # mode "fail", its output breaks the response format instead and the server answers 500
    "assistant_prefill_runaway": ("model", {"probability": 0.8, "mode": "runaway"}),
}


class FleetFileError(ValueError):
    """A fleet file that cannot describe a fleet; the message names the place and the problem."""


@dataclass(frozen=True)
class AuthSpec:
    id: str
    models: tuple[str, ...]
    latency_ms: float = 2.0
    denied_tenants: tuple[str, ...] = ()
    tenants: tuple[str, ...] = ()  # serves only these tenants' requests; () all
    workers: int = 0  # calls in service at once, later ones wait (in the span); 0 unlimited
    background_rps: float = 0.0  # untraced calls per second from other callers, on the same workers
    jitter: float = 0.25  # σ of the log-normal service time
    timeout_ms: float = 0.0  # the gateway gives up on a call past this (504); 0 never


@dataclass(frozen=True)
class RateLimiterSpec:
    id: str
    models: tuple[str, ...]
    latency_ms: float = 0.5
    requests_per_s: float = 50.0  # per tenant
    burst: float = 100.0
    tenants: tuple[str, ...] = ()


@dataclass(frozen=True)
class RouterSpec:
    id: str
    models: tuple[str, ...]
    policy: str = "least_loaded"
    latency_ms: float = 1.0
    tenants: tuple[str, ...] = ()
    workers: int = 0
    background_rps: float = 0.0
    jitter: float = 0.25
    timeout_ms: float = 0.0


# Component keys a fleet file may leave out; written back only when they differ from their default.
OPTIONAL_COMPONENT_KEYS = ("tenants", "workers", "background_rps", "jitter", "timeout_ms")


@dataclass(frozen=True)
class GlobalQueueSpec:
    id: str
    models: tuple[str, ...]
    max_inflight_per_engine: int = 64
    latency_ms: float = 0.2


@dataclass(frozen=True)
class LinkSpec:
    id: str
    bandwidth_gb_s: float = 12.5  # gigabytes per second (100 Gbit/s)
    latency_ms: float = 1.0


@dataclass(frozen=True)
class DisaggregationSpec:
    prefill_replicas: int
    decode_replicas: int
    link: str
    decode_hardware: str
    decode_region: str
    decode_engine: dict[str, Any]


@dataclass(frozen=True)
class ModelDeployment:
    name: str
    replicas: int
    hardware: str
    region: str
    engine: dict[str, Any]
    disaggregation: DisaggregationSpec | None = None

    def engine_config(self, instance_id: str, role: str = "engine") -> EngineConfig:
        """The EngineConfig of one replica; `role` is engine, prefill_worker or decode_worker."""
        if role == "decode_worker":
            d = self.disaggregation
            assert d is not None
            # The decode worker computes one token per arriving request (the rest of the KV came over the
            # link), so it batches that token with the running decodes: decode_first with chunks.
            options = {"policy": "decode_first", "chunked_prefill": True, **self.engine, **d.decode_engine}
            return EngineConfig(model=self.name, hardware=d.decode_hardware, instance_id=instance_id,
                                region=d.decode_region, **options)
        return EngineConfig(model=self.name, hardware=self.hardware, instance_id=instance_id,
                            region=self.region, **self.engine)


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    target: str
    start_s: float
    duration_s: float
    params: dict[str, float | str] = field(default_factory=dict)

    def param(self, name: str) -> float:
        return float(self.params.get(name, FAULT_KINDS[self.kind][1][name]))

    def window_ns(self, epoch_ns: int) -> tuple[int, int]:
        start = epoch_ns + round(self.start_s * 1e9)
        return start, start + round(self.duration_s * 1e9)


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """A fault in force on the fleet's clock, [start_ns, end_ns)."""

    start_ns: int
    end_ns: int
    fault: FaultSpec

    def active(self, t: int) -> bool:
        return self.start_ns <= t < self.end_ns

    def level(self, t: int) -> float:
        """How much of the fault's magnitude is in force at t (inside the window): rising linearly from 0 over
        its `ramp_s`, when it has one, else all of it."""
        ramp = float(self.fault.params.get("ramp_s", 0.0))
        return 1.0 if ramp <= 0 else min(1.0, (t - self.start_ns) / (ramp * 1e9))


@dataclass(frozen=True)
class TenantSpec:
    name: str
    models: dict[str, float]  # model -> weight
    workload: str = "synthetic"
    synthetic: SyntheticWorkload = field(default_factory=SyntheticWorkload)
    path: Path | None = None
    speedup: float = 1.0
    offset_s: float = 0.0  # replay: start this far into the trace (wrapping around)
    retries: int = 0  # times a client retries a request answered 429, 503 or 504 before the router
    retry_backoff_s: float = 1.0  # first retry after about this long, doubling each time (with jitter)


@dataclass(frozen=True)
class DiurnalSpec:
    """Traffic that rises and falls over the day: a rate is multiplied by 1 + amplitude · sin(2π (t +
    phase_s) / period_s), t from the start of traffic."""

    amplitude: float
    period_s: float = 86_400.0
    phase_s: float = 0.0

    def factor(self, t_s: float) -> float:
        return 1.0 + self.amplitude * math.sin(2 * math.pi * (t_s + self.phase_s) / self.period_s)


@dataclass(frozen=True)
class FleetSpec:
    name: str
    region: str
    models: tuple[ModelDeployment, ...]
    tenants: tuple[TenantSpec, ...]
    auth: tuple[AuthSpec, ...] = ()
    rate_limiters: tuple[RateLimiterSpec, ...] = ()
    routers: tuple[RouterSpec, ...] = ()
    global_queues: tuple[GlobalQueueSpec, ...] = ()
    links: tuple[LinkSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()
    gateway_id: str = "gateway-0"
    timeout_s: float = 600.0
    diurnal: DiurnalSpec | None = None

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    def deployment(self, name: str) -> ModelDeployment:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def with_faults(self, faults: tuple[FaultSpec, ...]) -> FleetSpec:
        return replace(self, faults=faults)

    def engine_instances(self, name: str) -> list[tuple[str, str]]:
        """(service.instance.id, role) of every engine of the model; role is engine, prefill_worker or
        decode_worker."""
        m = self.deployment(name)
        if m.disaggregation is None:
            return [(f"{name}-{i}", "engine") for i in range(m.replicas)]
        d = m.disaggregation
        return ([(f"{name}-prefill-{i}", "prefill_worker") for i in range(d.prefill_replicas)]
                + [(f"{name}-decode-{i}", "decode_worker") for i in range(d.decode_replicas)])


# ------------------------------------------------------------------------------------------- parsing
def _take(table: dict[str, Any], where: str, allowed: set[str]) -> dict[str, Any]:
    unknown = set(table) - allowed
    if unknown:
        raise FleetFileError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    return table


def _positive(value: Any, where: str, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FleetFileError(f"{where}: expected a number, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        raise FleetFileError(f"{where}: must be {'≥' if zero_ok else '>'} 0, got {value!r}")
    return float(value)


def _models_of(table: dict[str, Any], where: str, known: tuple[str, ...]) -> tuple[str, ...]:
    models = table.get("models", list(known))
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise FleetFileError(f"{where}.models: expected a list of model names, got {models!r}")
    for m in models:
        if m not in known:
            raise FleetFileError(f"{where}.models: {m!r} is not a model of this fleet ({', '.join(known)})")
    return tuple(models)


def _components(raw: dict[str, Any], key: str, cls: type, known: tuple[str, ...],
                numbers: dict[str, bool]) -> tuple[Any, ...]:
    """Parse `[[key]]` tables into `cls`; `numbers` maps numeric keys to whether zero is allowed (the optional
    `workers`, `background_rps`, `jitter` and `timeout_ms`, where the class has them, are numbers too)."""
    numbers = {**numbers, **{name: True for name in ("background_rps", "jitter", "timeout_ms")
                             if name in {f.name for f in fields(cls)}}}
    out = []
    tables = raw.get(key, [])
    if not isinstance(tables, list):
        raise FleetFileError(f"{key}: expected an array of tables ([[{key}]])")
    allowed = {f.name for f in fields(cls)}
    for i, table in enumerate(tables):
        where = f"{key}[{i}]"
        _take(table, where, allowed)
        if not isinstance(table.get("id"), str) or not table["id"]:
            raise FleetFileError(f"{where}: needs an id (its service.instance.id)")
        values: dict[str, Any] = {"id": table["id"]}
        if "models" in allowed:
            values["models"] = _models_of(table, where, known)
        for name, zero_ok in numbers.items():
            if name in table:
                values[name] = _positive(table[name], f"{where}.{name}", zero_ok)
        if "tenants" in table and (not isinstance(table["tenants"], list)
                                   or not all(isinstance(t, str) for t in table["tenants"])):
            raise FleetFileError(f"{where}.tenants: expected a list of tenant names, got {table['tenants']!r}")
        if "workers" in table:
            workers = table["workers"]
            if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
                raise FleetFileError(f"{where}.workers: must be an integer ≥ 0 (0: unlimited), got {workers!r}")
            values["workers"] = workers
        if values.get("background_rps") and not values.get("workers"):
            raise FleetFileError(f"{where}.background_rps: background load shares the component's workers: "
                                 f"give `workers` too")
        for name in allowed - set(values) - set(numbers):
            if name in table:
                values[name] = tuple(table[name]) if isinstance(table[name], list) else table[name]
        out.append(cls(**values))
    return tuple(out)


def _deployment(table: dict[str, Any], i: int, region: str, link_ids: set[str]) -> ModelDeployment:
    where = f"model[{i}]"
    _take(table, where, {"name", "replicas", "hardware", "region", "engine", "disaggregation"})
    name = table.get("name")
    try:
        model_spec(str(name))
        hardware(str(table.get("hardware", "H100-SXM")))
    except ValueError as e:
        raise FleetFileError(f"{where}: {e}") from None
    engine = dict(table.get("engine", {}))
    _take(engine, f"{where}.engine", ENGINE_FIELDS)
    replicas = table.get("replicas", 1)
    if not isinstance(replicas, int) or replicas < 1:
        raise FleetFileError(f"{where}.replicas: must be an integer ≥ 1, got {replicas!r}")
    disaggregation = None
    if "disaggregation" in table:
        d = _take(dict(table["disaggregation"]), f"{where}.disaggregation",
                  {"prefill_replicas", "decode_replicas", "link", "decode_hardware", "decode_region",
                   "decode_engine"})
        if d.get("link") not in link_ids:
            raise FleetFileError(f"{where}.disaggregation.link: {d.get('link')!r} is not a declared [[link]] "
                                 f"({', '.join(sorted(link_ids)) or 'none declared'})")
        decode_engine = dict(d.get("decode_engine", {}))
        _take(decode_engine, f"{where}.disaggregation.decode_engine", ENGINE_FIELDS)
        decode_hw = str(d.get("decode_hardware", table.get("hardware", "H100-SXM")))
        try:
            hardware(decode_hw)
        except ValueError as e:
            raise FleetFileError(f"{where}.disaggregation.decode_hardware: {e}") from None
        counts = [d.get("prefill_replicas", 1), d.get("decode_replicas", 1)]
        if not all(isinstance(c, int) and c >= 1 for c in counts):
            raise FleetFileError(f"{where}.disaggregation: replica counts must be integers ≥ 1, got {counts}")
        disaggregation = DisaggregationSpec(counts[0], counts[1], d["link"], decode_hw,
                                            str(d.get("decode_region", table.get("region", region))), decode_engine)
    deployment = ModelDeployment(str(name), replicas, str(table.get("hardware", "H100-SXM")),
                                 str(table.get("region", region)), engine, disaggregation)
    try:  # validate the engine options now, with the file's names in the message
        deployment.engine_config(f"{name}-check")
        if disaggregation is not None:
            deployment.engine_config(f"{name}-check", "decode_worker")
    except (TypeError, ValueError) as e:
        raise FleetFileError(f"{where}.engine: {e}") from None
    return deployment


def _tenant(table: dict[str, Any], i: int, known: tuple[str, ...], base: Path) -> TenantSpec:
    where = f"tenant[{i}]"
    _take(table, where, {"name", "models", "workload", "path", "speedup", "offset_s", "retries", "retry_backoff_s"}
          | SYNTHETIC_FIELDS)
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise FleetFileError(f"{where}: needs a name")
    raw_models = table.get("models", list(known))
    if isinstance(raw_models, list):
        raw_models = {m: 1.0 for m in raw_models}
    if not isinstance(raw_models, dict) or not raw_models:
        raise FleetFileError(f"{where}.models: expected a list of models or a table of weights")
    models = {}
    for m, w in raw_models.items():
        if m not in known:
            raise FleetFileError(f"{where}.models: {m!r} is not a model of this fleet ({', '.join(known)})")
        models[m] = _positive(w, f"{where}.models.{m}")
    workload = table.get("workload", "synthetic")
    if workload not in WORKLOADS:
        raise FleetFileError(f"{where}.workload: must be one of {WORKLOADS}, got {workload!r}")
    path = None
    if workload != "synthetic":
        if "path" not in table:
            raise FleetFileError(f"{where}: workload {workload!r} replays a trace: give its path")
        path = Path(os.path.abspath(base / str(table["path"])))  # symlinks kept: written back relative as given
        if not path.is_file():
            raise FleetFileError(f"{where}.path: {path} does not exist")
    options = {k: (tuple(v) if isinstance(v, list) else v) for k, v in table.items() if k in SYNTHETIC_FIELDS}
    try:
        synthetic = SyntheticWorkload(tenants=(name,), **options)
    except (TypeError, ValueError) as e:
        raise FleetFileError(f"{where}: {e}") from None
    retries = table.get("retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise FleetFileError(f"{where}.retries: must be an integer ≥ 0, got {retries!r}")
    return TenantSpec(name, models, workload, synthetic, path,
                      _positive(table.get("speedup", 1.0), f"{where}.speedup"),
                      _positive(table.get("offset_s", 0.0), f"{where}.offset_s", zero_ok=True),
                      retries, _positive(table.get("retry_backoff_s", 1.0), f"{where}.retry_backoff_s"))


def _fault(table: dict[str, Any], i: int, targets: dict[str, set[str]]) -> FaultSpec:
    where = f"fault[{i}]"
    kind = table.get("kind")
    if kind not in FAULT_KINDS:
        raise FleetFileError(f"{where}.kind: must be one of {sorted(FAULT_KINDS)}, got {kind!r}")
    target_kind, defaults = FAULT_KINDS[kind]
    _take(table, where, {"kind", "target", "start_s", "duration_s", *defaults})
    target = table.get("target")
    if target not in targets[target_kind]:
        raise FleetFileError(f"{where}.target: a {kind} fault targets a {target_kind} of this fleet "
                             f"({', '.join(sorted(targets[target_kind])) or 'none declared'}), got {target!r}")
    params: dict[str, float | str] = {}
    for name, default in defaults.items():
        if name in table:
            if isinstance(default, str):
                params[name] = str(table[name])
            else:
                params[name] = _positive(table[name], f"{where}.{name}", zero_ok=True)
    if kind == "request_surge" and params.get("tenant", "") not in targets["tenant"]:
        raise FleetFileError(f"{where}.tenant: a request surge comes from a tenant of this fleet "
                             f"({', '.join(sorted(targets['tenant']))}), got {params.get('tenant')!r}")
    if kind == "traffic_surge" and params.get("model", "") not in {"", *targets["model"]}:
        raise FleetFileError(f"{where}.model: a model of this fleet ({', '.join(sorted(targets['model']))}) or "
                             f"none, got {params.get('model')!r}")
    for name in ("error_rate", "share"):
        if float(params.get(name, 0.0)) > 1:
            raise FleetFileError(f"{where}.{name}: a share of calls, in [0, 1], got {params[name]!r}")
    if kind in ("router_latency", "auth_latency", "rate_limiter_rejections") \
            and params.get("tenant", "") not in {"", *targets["tenant"]}:
        raise FleetFileError(f"{where}.tenant: a tenant of this fleet ({', '.join(sorted(targets['tenant']))}) "
                             f"or none, got {params.get('tenant')!r}")
    if kind == "assistant_prefill_runaway" and params.get("mode", "runaway") not in ("runaway", "fail"):
        raise FleetFileError(f"{where}.mode: \"runaway\" or \"fail\", got {params.get('mode')!r}")
    return FaultSpec(kind, str(target), _positive(table.get("start_s", 0.0), f"{where}.start_s", zero_ok=True),
                     _positive(table.get("duration_s"), f"{where}.duration_s"), params)


def _diurnal(table: Any) -> DiurnalSpec | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise FleetFileError("diurnal: expected a table ([diurnal])")
    _take(table, "diurnal", {"amplitude", "period_s", "phase_s"})
    amplitude = _positive(table.get("amplitude", 0.0), "diurnal.amplitude", zero_ok=True)
    if amplitude >= 1:
        raise FleetFileError(f"diurnal.amplitude: must be < 1 (a rate never reaches 0), got {amplitude!r}")
    return DiurnalSpec(amplitude, _positive(table.get("period_s", 86_400.0), "diurnal.period_s"),
                       _positive(table.get("phase_s", 0.0), "diurnal.phase_s", zero_ok=True))


def parse_fleet(raw: dict[str, Any], base: Path = Path(".")) -> FleetSpec:
    """A fleet from a parsed TOML document; relative workload paths resolve against `base`."""
    _take(raw, "fleet", {"name", "region", "gateway", "diurnal", "auth", "rate_limiter", "router", "global_queue",
                         "link", "model", "tenant", "fault"})
    region = str(raw.get("region", "local"))
    links = _components(raw, "link", LinkSpec, (), {"bandwidth_gb_s": False, "latency_ms": True})
    model_tables = raw.get("model", [])
    if not isinstance(model_tables, list) or not model_tables:
        raise FleetFileError("fleet: declare at least one [[model]]")
    models = tuple(_deployment(t, i, region, {link.id for link in links}) for i, t in enumerate(model_tables))
    names = tuple(m.name for m in models)
    if len(set(names)) != len(names):
        raise FleetFileError(f"model: each model is declared once, got {list(names)}")
    auth = _components(raw, "auth", AuthSpec, names, {"latency_ms": True})
    limiters = _components(raw, "rate_limiter", RateLimiterSpec, names,
                           {"latency_ms": True, "requests_per_s": False, "burst": False})
    routers = _components(raw, "router", RouterSpec, names, {"latency_ms": True})
    queues = _components(raw, "global_queue", GlobalQueueSpec, names,
                         {"latency_ms": True, "max_inflight_per_engine": False})
    for r in routers:
        if r.policy not in ROUTER_POLICIES:
            raise FleetFileError(f"router {r.id}: policy must be one of {ROUTER_POLICIES}, got {r.policy!r}")
    for q in queues:
        if int(q.max_inflight_per_engine) != q.max_inflight_per_engine or q.max_inflight_per_engine < 1:
            raise FleetFileError(f"global_queue {q.id}: max_inflight_per_engine must be an integer ≥ 1")
    ids: list[str] = [c.id for group in (auth, limiters, routers, queues, links) for c in group]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise FleetFileError(f"component ids must be unique in the fleet: {duplicated} repeat")
    for m in names:
        serving = [q.id for q in queues if m in q.models]
        if len(serving) > 1:
            raise FleetFileError(f"global_queue: model {m!r} is served by {serving}; at most one global_queue "
                                 f"per model")
    tenant_tables = raw.get("tenant", [])
    if not isinstance(tenant_tables, list) or not tenant_tables:
        raise FleetFileError("fleet: declare at least one [[tenant]]")
    tenants = tuple(_tenant(t, i, names, base) for i, t in enumerate(tenant_tables))
    tenant_names = {t.name for t in tenants}
    for kind, group in (("auth", auth), ("rate_limiter", limiters), ("router", routers)):
        for c in group:
            unknown = sorted(set(c.tenants) - tenant_names)
            if unknown:
                raise FleetFileError(f"{kind} {c.id}.tenants: {unknown} are not tenants of this fleet "
                                     f"({', '.join(sorted(tenant_names))})")
    gateway = _take(dict(raw.get("gateway", {})), "gateway", {"id", "timeout_s"})
    spec = FleetSpec(str(raw.get("name", "fleet")), region, models, tenants, auth, limiters, routers, queues, links,
                     gateway_id=str(gateway.get("id", "gateway-0")),
                     timeout_s=_positive(gateway.get("timeout_s", 600.0), "gateway.timeout_s"),
                     diurnal=_diurnal(raw.get("diurnal")))
    targets = {"router": {c.id for c in routers}, "auth": {c.id for c in auth},
               "rate_limiter": {c.id for c in limiters}, "global_queue": {c.id for c in queues},
               "link": {c.id for c in links}, "model": set(names), "tenant": {t.name for t in tenants},
               "engine": {i for m in names for i, _ in spec.engine_instances(m)}}
    fault_tables = raw.get("fault", [])
    if not isinstance(fault_tables, list):
        raise FleetFileError("fault: expected an array of tables ([[fault]])")
    faults = tuple(_fault(t, i, targets) for i, t in enumerate(fault_tables))
    replayed = {t.name for t in tenants if t.workload != "synthetic"}
    for i, f in enumerate(faults):
        if f.kind == "traffic_surge" and f.target in replayed:
            raise FleetFileError(f"fault[{i}].target: a traffic surge multiplies a synthetic tenant's rate; "
                                 f"{f.target!r} replays a trace")
    return spec.with_faults(faults)


def load_fleet(path: str | Path) -> FleetSpec:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise FleetFileError(f"{path}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise FleetFileError(f"{path}: not valid TOML: {e}") from None
    try:
        return parse_fleet(raw, path.parent)
    except FleetFileError as e:
        raise FleetFileError(f"{path}: {e}") from None


# ------------------------------------------------------------------------------------------- writing
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        text = str(value).replace("\\", "\\\\").replace('"', '\\"')
        return f'"{text}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_value(key)


def _table(name: str, values: dict[str, Any]) -> list[str]:
    return [f"[[{name}]]", *(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in values.items()), ""]


def fleet_to_toml(spec: FleetSpec, relative_to: Path | None = None) -> str:
    """The fleet file that `load_fleet` reads back as the same fleet. Workload paths are absolute, or relative
    to `relative_to` (the directory the file will be written in) when given."""
    lines = [f"name = {_toml_value(spec.name)}", f"region = {_toml_value(spec.region)}", "",
             "[gateway]", f"id = {_toml_value(spec.gateway_id)}", f"timeout_s = {spec.timeout_s!r}", ""]
    if spec.diurnal is not None:
        d = spec.diurnal
        lines += ["[diurnal]", f"amplitude = {d.amplitude!r}", f"period_s = {d.period_s!r}",
                  f"phase_s = {d.phase_s!r}", ""]
    for kind, group in (("auth", spec.auth), ("rate_limiter", spec.rate_limiters), ("router", spec.routers),
                        ("global_queue", spec.global_queues), ("link", spec.links)):
        for c in group:
            values = {f.name: getattr(c, f.name) for f in fields(c)
                      if f.name not in OPTIONAL_COMPONENT_KEYS or getattr(c, f.name) != f.default}
            for name in ("models", "tenants"):
                if name in values:
                    values[name] = list(values[name])
            lines += _table(kind, values)
    for m in spec.models:
        values: dict[str, Any] = {"name": m.name, "replicas": m.replicas, "hardware": m.hardware, "region": m.region}
        if m.engine:
            values["engine"] = m.engine
        if m.disaggregation is not None:
            d = m.disaggregation
            values["disaggregation"] = {"prefill_replicas": d.prefill_replicas, "decode_replicas": d.decode_replicas,
                                        "link": d.link, "decode_hardware": d.decode_hardware,
                                        "decode_region": d.decode_region, "decode_engine": d.decode_engine}
        lines += _table("model", values)
    defaults = SyntheticWorkload()
    for t in spec.tenants:
        values = {"name": t.name, "models": t.models, "workload": t.workload}
        if t.path is not None:
            path = os.path.relpath(t.path, os.path.abspath(relative_to)) if relative_to is not None else str(t.path)
            values.update(path=path, speedup=t.speedup, offset_s=t.offset_s)
        if t.retries:
            values.update(retries=t.retries, retry_backoff_s=t.retry_backoff_s)
        for name in sorted(SYNTHETIC_FIELDS):
            value = getattr(t.synthetic, name)
            if value != getattr(defaults, name):
                values[name] = value
        lines += _table("tenant", values)
    for f in spec.faults:
        lines += _table("fault", {"kind": f.kind, "target": f.target, "start_s": f.start_s,
                                  "duration_s": f.duration_s, **f.params})
    return "\n".join(lines)
