"""Gateways in front of the engines. Their spans are not named as this project's (`gateway`, `auth`, ...): the
store finds components in the trace tree (component_calls.sql) and a `--components` file names their kinds.

LiteLLM proxy (read from BerriAI/litellm): a `Received Proxy Server Request` SERVER span per request, service-hook
spans named by the service (ServiceTypes: `auth`, `router`, `proxy_pre_call`, `redis`, `postgres`, ...) with
`service` and `call_type` attributes, `litellm_request` for the call to the model backend (gen_ai.request.model,
metadata.user_api_key_team_id, usage) and `raw_gen_ai_request` under it when message logging is on. The hooks run
in the proxy's process (same service as the entry span), so they count as components only when the components
file names them.
"""

from __future__ import annotations

from infertrace.sources.profile import Citation, SourceProfile, SpanShape

LITELLM = SourceProfile(
    name="litellm",
    title="LiteLLM proxy",
    export="callbacks: [\"otel\"] with OTEL_EXPORTER=otlp_http|otlp_grpc and OTEL_ENDPOINT",
    resource="service.name from OTEL_SERVICE_NAME (default litellm), deployment.environment",
    spans=(
        SpanShape("Received Proxy Server Request", "SERVER", "the proxy's handling of a request"),
        SpanShape("auth | router | proxy_pre_call | redis | ...", "INTERNAL", "service hooks",
                  (("service", "string", "ServiceTypes value"), ("call_type", "string", ""))),
        SpanShape("litellm_request", "INTERNAL", "the call to the backend model",
                  (("gen_ai.request.model", "string", ""), ("metadata.user_api_key_team_id", "string", "tenant"))),
    ),
    clocks="The proxy's wall clock.",
    normalised=("component_calls (entry, calls)",),
    missing=("the model on the entry span (a request rejected before the model call has none)", "tenant on the "
             "entry span", "HTTP status on the entry span unless an HTTP server instrumentation adds it"),
    citations=(
        Citation("BerriAI/litellm", "litellm/integrations/opentelemetry.py", "d59f8f952d87d1b57d0275d18e974610203b5201",
                 "litellm_request, raw_gen_ai_request, service-hook spans named by the service, "
                 "Failed Proxy Server Request; later versions make the proxy span SERVER "
                 "(create_litellm_proxy_request_started_span)"),
        Citation("BerriAI/litellm", "litellm/types/services.py", "507d528a4247ba34c8579d4e855d9b01e64739d9",
                 "ServiceTypes: auth, router, proxy_pre_call, redis, postgres, ..."),
    ),
)
