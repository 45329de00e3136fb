"""Whose telemetry a run emits: this project's own (`infertrace`: step spans, phase spans, every attribute the
analyzers could want), or exactly what a real engine or gateway exports, emulated on the same simulation.

- engine profiles: `infertrace`, `vllm-v1`, `vllm-v0`, `sglang`, `tgi` (modules of the same names here);
- gateway profiles (fleets): `infertrace` (a `gateway` span with `auth`, `rate_limit`, `route`, `global_queue`
  children), `litellm` (spans named as LiteLLM proxy names them: `Received Proxy Server Request`, its service
  hooks `auth`, `proxy_pre_call`, `router`, `scheduler`, and `litellm_request` around the engine's span; HTTP
  semantic-convention attributes; no infertrace attribute), or `none` (no gateway span: the engines' spans start
  their own traces);
- beside the spans, what a user can add: vLLM V1's iteration-detail log (one file per engine) and a streaming
  client's token times (one JSON-lines file).

The simulation itself does not depend on the profile: for a seed, every profile serves the same requests at the
same times; only what is recorded differs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertrace import semconv as sc
from reference_engine.telemetry.client import ClientTokenLog
from reference_engine.telemetry.otlp import Attributes, SpanSink
from reference_engine.telemetry.sglang import SglangTracer, sglang_resource
from reference_engine.telemetry.tgi import TgiTracer, tgi_resource
from reference_engine.telemetry.tracer import EngineTracer, engine_resource
from reference_engine.telemetry.vllm import IterationLogGroup, VllmTracer, vllm_resource

if TYPE_CHECKING:
    from reference_engine.engine.config import EngineConfig
    from reference_engine.engine.sequence import Request

ENGINE_PROFILES = ("infertrace", "vllm-v1", "vllm-v0", "sglang", "tgi")
GATEWAY_PROFILES = ("infertrace", "litellm", "none")


@dataclass(frozen=True)
class TelemetrySpec:
    engine: str = "infertrace"
    gateway: str = "infertrace"
    instance_ids: bool = False  # the deployments set service.instance.id (OTEL_RESOURCE_ATTRIBUTES) on engines
    iteration_logs: Path | None = None  # vLLM V1's iteration-detail log: one `<instance>.log` per engine here
    client_tokens: Path | None = None  # a streaming client's token times (JSON lines)
    client_delay_ms: float = 2.0
    client_jitter_ms: float = 1.0

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_PROFILES:
            raise ValueError(f"--telemetry must be one of {', '.join(ENGINE_PROFILES)}, got {self.engine!r}")
        if self.gateway not in GATEWAY_PROFILES:
            raise ValueError(f"--gateway-telemetry must be one of {', '.join(GATEWAY_PROFILES)}, got "
                             f"{self.gateway!r}")
        if self.iteration_logs is not None and self.engine != "vllm-v1":
            raise ValueError("iteration-detail logs are vLLM V1's (--enable-logging-iteration-details): use them "
                             "with --telemetry vllm-v1")

    @property
    def is_native(self) -> bool:
        return (self.engine, self.gateway) == ("infertrace", "infertrace") and not self.extras

    @property
    def extras(self) -> bool:
        return self.iteration_logs is not None or self.client_tokens is not None


def _pid(*key: object) -> int:
    return 1000 + random.Random("pid-" + "-".join(map(str, key))).randrange(60000)


class TelemetryRun:
    """The tracers and side files of one run under a `TelemetrySpec`."""

    def __init__(self, spec: TelemetrySpec, sink: SpanSink | None, seed: int = 0) -> None:
        self.spec, self.sink, self.seed = spec, sink, seed
        self.iteration_logs = IterationLogGroup(spec.iteration_logs) if spec.iteration_logs is not None else None
        self.client = (ClientTokenLog(spec.client_tokens, spec.client_delay_ms, spec.client_jitter_ms, seed)
                       if spec.client_tokens is not None else None)
        self.tracers: list[Any] = []

    def expect(self, requests: list[Request]) -> None:
        if self.client is not None:
            self.client.expect(requests)

    def engine_observers(self, config: EngineConfig, seed: int, role: str = "engine",
                         executor: str = "simulated") -> list[Any]:
        """The tracer (when spans go anywhere) and side recorders of one engine."""
        observers: list[Any] = []
        if self.sink is not None:
            tracer = self._tracer(config, seed, role, executor)
            self.tracers.append(tracer)
            observers.append(tracer)
        if self.iteration_logs is not None:
            observers.append(self.iteration_logs.add(config.model, config.instance_id,
                                                     _pid(seed, config.instance_id, "core"), seed))
        if self.client is not None:
            observers.append(self.client.observer(role))
        return observers

    def _tracer(self, config: EngineConfig, seed: int, role: str, executor: str) -> Any:
        assert self.sink is not None
        engine, instance = self.spec.engine, config.instance_id
        own_id = instance if self.spec.instance_ids else None
        if engine == "infertrace":
            return EngineTracer(self.sink, engine_resource(config, executor=executor, kind=role), seed=seed)
        if engine in ("vllm-v1", "vllm-v0"):
            version = engine.rsplit("-", 1)[1]
            resource = vllm_resource(version, config.model, _pid(seed, instance, "api"), own_id)
            return VllmTracer(self.sink, resource, version, config.model, seed=seed)
        if engine == "sglang":
            host = f"{random.Random(f'host-{seed}-{instance}').getrandbits(128):032x}"
            pids = (_pid(seed, instance, "tokenizer"), _pid(seed, instance, "scheduler"))
            return SglangTracer(self.sink, sglang_resource(own_id), config.model, host, pids, seed=seed)
        return TgiTracer(self.sink, tgi_resource(config.model), seed=seed)

    @property
    def emits_kv_transfer(self) -> bool:
        """`kv_transfer` spans are this project's: only its own engines emit them."""
        return self.spec.engine == "infertrace"

    def close(self) -> list[Path]:
        """Flushes the tracers, writes the side files; returns the side files written."""
        for tracer in self.tracers:
            tracer.close()
        written = []
        if self.iteration_logs is not None:
            written += self.iteration_logs.close()
        if self.client is not None:
            self.client.close()
            written.append(self.client.path)
        return written


# ------------------------------------------------------------------------------------------ gateway names
LITELLM_SPANS = {sc.SPAN_AUTH: ("auth", "user_api_key_auth"),
                 sc.SPAN_RATE_LIMIT: ("proxy_pre_call", "parallel_request_limiter"),
                 sc.SPAN_ROUTE: ("router", "async_get_available_deployment"),
                 sc.SPAN_GLOBAL_QUEUE: ("scheduler", "scheduler_poll")}
CHAT_ROUTE = "/v1/chat/completions"


@dataclass(frozen=True)
class GatewayNaming:
    """How the fleet's gateway names its spans and what it puts on them, per gateway profile. The native profile
    is the gateway's own code path (`native`); the others rewrite each span where it is built."""

    profile: str = "infertrace"

    @property
    def native(self) -> bool:
        return self.profile == "infertrace"

    @property
    def emits(self) -> bool:
        return self.profile != "none"

    def resource(self, native: Attributes) -> Attributes:
        """A component's resource: its service and instance, without this project's component kind."""
        return native if self.native else {k: v for k, v in native.items() if k != sc.COMPONENT_KIND}

    def component(self, name: str, status: int) -> tuple[str, Attributes]:
        """A component call (auth, rate limit, route, global queue) as a LiteLLM-style service-hook span."""
        service, call_type = LITELLM_SPANS[name]
        attributes: Attributes = {sc.LITELLM_SERVICE: service, sc.LITELLM_CALL_TYPE: call_type,
                                  sc.HTTP_STATUS_CODE: status}
        return service, attributes

    def root(self, status: int, model: str, tenant: str) -> tuple[str, Attributes]:
        """The entry span: HTTP server attributes, and the requested model and caller as a GenAI-instrumented
        gateway records them (LiteLLM itself puts them on `litellm_request` only, which a request rejected
        before the model call never gets)."""
        return sc.LITELLM_SPAN_PROXY, {sc.HTTP_REQUEST_METHOD: "POST", sc.HTTP_ROUTE: CHAT_ROUTE,
                                       sc.HTTP_STATUS_CODE: status, sc.REQUEST_MODEL: model, sc.USER_ID: tenant}

    def backend_call(self, model: str, tenant: str, input_tokens: int, output_tokens: int | None) -> Attributes:
        """Attributes of `litellm_request`, the proxy's call to the engine (the parent of the engine's span)."""
        attributes: Attributes = {sc.REQUEST_MODEL: model, sc.GEN_AI_SYSTEM: "hosted_vllm",
                                  sc.LITELLM_TEAM_ID: tenant, "llm.is_streaming": "True",
                                  sc.USAGE_INPUT_TOKENS: input_tokens}
        if output_tokens is not None:
            attributes[sc.USAGE_OUTPUT_TOKENS] = output_tokens
        return attributes
