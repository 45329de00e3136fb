"""vLLM's traces, V1 (current main) and V0, read from vllm-project/vllm.

Both export one `llm_request` span per finished request and nothing per step. V1 makes it in the API-server
process when the request finishes (`OutputProcessor.do_tracing`), V0 in the engine after the step that finished
it (`LLMEngine.create_trace_span`). Journey tracing (`--enable-journey-tracing`: an `llm_request` span linked to an
`llm_core` engine span, lifecycle events, sampling) is described in JOURNEY_TRACING.md on a branch of the
repository but has not landed on main: main's ObservabilityConfig has no such option and the V1 scheduler makes
no span. The store still counts `journey.PREEMPTED` events on an `llm_request` span as preemptions, so traces
from that branch are read where they overlap.
"""

from __future__ import annotations

from infertrace.sources.profile import Citation, SourceProfile, SpanShape

REPO = "vllm-project/vllm"

V1 = SourceProfile(
    name="vllm-v1",
    title="vLLM V1 (main)",
    export=("--otlp-traces-endpoint URL; OTLP over gRPC unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf; "
            "BatchSpanProcessor"),
    resource=("Resource.create: vllm.instrumenting_module_name, vllm.process_id (a string), the SDK's "
              "telemetry.sdk.*; service.name only from OTEL_SERVICE_NAME (else unknown_service), "
              "service.instance.id only from OTEL_RESOURCE_ATTRIBUTES"),
    spans=(SpanShape(
        "llm_request", "SERVER",
        "from the API server's arrival time (time.time() when the request came in) to when do_tracing runs, after "
        "the last output was processed; parent: the caller's traceparent",
        (("gen_ai.latency.time_to_first_token", "double s", "API-server clock: first output processed - arrival"),
         ("gen_ai.latency.e2e", "double s", "API-server clock: last output's iteration - arrival"),
         ("gen_ai.latency.time_in_queue", "double s", "engine-core monotonic clock: scheduled - queued"),
         ("gen_ai.latency.time_in_model_prefill", "double s", "engine core: first token - scheduled"),
         ("gen_ai.latency.time_in_model_decode", "double s", "engine core: last token - first token"),
         ("gen_ai.latency.time_in_model_inference", "double s", "engine core: last token - scheduled"),
         ("gen_ai.usage.prompt_tokens", "int", ""), ("gen_ai.usage.completion_tokens", "int", ""),
         ("gen_ai.request.id", "string", "the external request id"),
         ("gen_ai.response.finish_reasons", "string", "json.dumps of a list, e.g. '[\"stop\"]'"),
         ("gen_ai.request.top_p, max_tokens, temperature, n", "double/int", "only when truthy"))),),
    clocks=("TTFT and E2E on the API server's wall clock; queue, prefill, decode and inference on the engine "
            "core's monotonic clock. The span starts at the API server's arrival, so start + time_in_queue is "
            "early by the API server's latency (tokenisation, IPC): the store places scheduling at the first "
            "token less the prefill time instead."),
    normalised=("requests",),
    missing=("response model (no gen_ai.response.model: the model comes from a gateway's span in the trace, else "
             "service.name)", "service.instance.id (replicas told apart by vllm.process_id only)",
             "cached (prefix-hit) tokens", "per-step spans and per-token times (ITL attribution needs a client's "
             "token times or the iteration-detail log)", "tenant", "spans for requests rejected at validation"),
    citations=(
        Citation(REPO, "vllm/v1/engine/output_processor.py", "d07822605346f767b672503c9aae85aa23ef2d82",
                 "OutputProcessor.do_tracing: span name, kind, start, attributes and their clocks"),
        Citation(REPO, "vllm/tracing/__init__.py", "bef65387bad4bddbca2b720ea0402500596c10c2",
                 "instrument_manual: a span without end_time ends when made"),
        Citation(REPO, "vllm/tracing/utils.py", "0bf3270fe12361d1f31f8955f17e5bc5dde6780e",
                 "SpanAttributes: attribute keys, gen_ai.response.finish_reasons, gen_ai.usage.cached_tokens"),
        Citation(REPO, "vllm/tracing/otel.py", "40eeb0c5e942e511bf73359f99265d72470c2f59",
                 "init_tracer: Resource.create(vllm.instrumenting_module_name, vllm.process_id); gRPC by default"),
        Citation(REPO, "vllm/config/observability.py", "06d5289f8d032b0fd865000e835887db3354aee1",
                 "ObservabilityConfig on main: otlp_traces_endpoint, collect_detailed_traces, "
                 "enable_logging_iteration_details; no journey tracing"),
        Citation(REPO, "vllm/v1/core/sched/scheduler.py", "b4622cf924bc72504aed99e486062d6633fde39e",
                 "the V1 scheduler on main: no tracer, no journey events"),
        Citation(REPO, "JOURNEY_TRACING.md", "995ffad5c3f170a943e0cbfdc82b2ce3f70d21b9",
                 "journey tracing as proposed (events journey.QUEUED … FINISHED with ts.monotonic): not on main"),
    ),
)

V0 = SourceProfile(
    name="vllm-v0",
    title="vLLM V0",
    export="--otlp-traces-endpoint URL; OTLP over gRPC unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf",
    resource=("TracerProvider(): the SDK's default resource only (service.name from OTEL_SERVICE_NAME, anything "
              "else from OTEL_RESOURCE_ATTRIBUTES)"),
    spans=(SpanShape(
        "llm_request", "SERVER",
        "from the request's arrival to when create_trace_span runs, right after the step that finished it",
        (("gen_ai.response.model", "string", "the --model value"), ("gen_ai.request.id", "string", ""),
         ("gen_ai.request.temperature, top_p, max_tokens, n", "double/int", "always set"),
         ("gen_ai.usage.num_sequences, prompt_tokens, completion_tokens", "int", ""),
         ("gen_ai.latency.time_in_queue", "double s", "first scheduled - arrival"),
         ("gen_ai.latency.time_to_first_token", "double s", "first token - arrival"),
         ("gen_ai.latency.e2e", "double s", "finished - arrival"),
         ("gen_ai.latency.time_in_scheduler", "double s", "scheduler time spent on it"),
         ("gen_ai.latency.time_in_model_forward, _execute", "double s", "with --collect-detailed-traces"))),),
    clocks="Every time on the engine process's wall clock (time.time()).",
    normalised=("requests",),
    missing=("finish reasons", "service.instance.id (replicas of a model are one instance unless "
             "OTEL_RESOURCE_ATTRIBUTES sets it)", "cached tokens", "prefill and decode times (only queue, TTFT, "
             "E2E)", "per-step spans and per-token times", "tenant"),
    citations=(
        Citation(REPO, "vllm/engine/llm_engine.py", "",
                 "LLMEngine.create_trace_span (V0, removed from main in 2025): name, kind, attributes; the copy "
                 "read carried no commit in the index used"),
        Citation(REPO, "vllm/tracing.py", "91310096deedb007defd3f019a7058ac4e8587d9",
                 "init_tracer: TracerProvider() with no resource; SpanAttributes keys"),
    ),
)

ITERATION_LOG = Citation(
    REPO, "vllm/v1/engine/core.py", "ac3cb2e2eca80290181abb9365d572af6d287473",
    "EngineCore.log_iteration_details: 'Iteration(i): n context requests, n context tokens, n generation requests, "
    "n generation tokens, iteration elapsed time: x ms'; the timer wraps only the wait on the step's result. Newer "
    "DP engines also log their dummy iterations with ' (dummy)'")
