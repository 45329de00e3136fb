"""Text Generation Inference's traces (`--otlp-endpoint`), read from huggingface/text-generation-inference.

TGI's router traces with Rust's `tracing` crate, exported by tracing-opentelemetry over gRPC: per request the
HTTP handler's span (`chat_completions`, `generate`, `generate_stream`, `completions`) with Infer, validation and
backend spans under it (`queued` while in the queue, `infer` per batch step, `send_generation` per token), and per
step a `batch` span in a trace of its own with a `prefill` or `decode` child, linked both ways to the requests'
`infer` spans.
"""

from __future__ import annotations

from infertrace.sources.profile import Citation, SourceProfile, SpanShape

REPO = "huggingface/text-generation-inference"
COMMIT = "db931fcf42da018a3657580c64bf2720f167f9ab"

TGI = SourceProfile(
    name="tgi",
    title="Text Generation Inference",
    export=("--otlp-endpoint URL (gRPC only, tonic), --otlp-service-name NAME (default "
            "text-generation-inference.router)"),
    resource="Resource::new([service.name]) alone: OTEL_RESOURCE_ATTRIBUTES is not read",
    spans=(
        SpanShape("chat_completions | generate | generate_stream | completions", "INTERNAL",
                  "the HTTP handler: request in to response done",
                  (("total_time, validation_time, queue_time, inference_time, time_per_token", "string",
                    "Rust Duration Debug form, e.g. 1.234567891s"), ("seed, parameters", "string", "Debug form"),
                   ("code.namespace", "string", "text_generation_router::server"))),
        SpanShape("queued", "INTERNAL", "enqueued to picked into a batch"),
        SpanShape("infer", "INTERNAL", "one per batch step the request took part in; linked to the batch span"),
        SpanShape("send_generation", "INTERNAL", "one per token handed to the response stream"),
        SpanShape("batch", "INTERNAL", "one per step, a trace of its own; child prefill or decode",
                  (("batch_size", "int", "requests in the batch"),)),
    ),
    clocks="One process, Instant-based durations; span times are the exporter's wall clock.",
    normalised=("requests", "tokens (send_generation)"),
    missing=("request id", "model (the model comes from a gateway's span in the trace, else service.name)",
             "instance (replicas are told apart only by distinct --otlp-service-name values)",
             "token counts (response headers only: output tokens are counted from send_generation spans, prompt "
             "tokens taken from a gateway's span in the trace that reports the engine's usage, LiteLLM's)",
             "cached tokens", "tenant", "steps: batch spans and their links carry membership (not normalised yet)"),
    citations=(
        Citation(REPO, "router/src/logging.rs", COMMIT, "init_logging: tonic exporter, Resource::new(service.name)"),
        Citation(REPO, "router/src/server.rs", COMMIT, "handler spans and their recorded fields"),
        Citation(REPO, "router/src/infer/mod.rs", COMMIT, "Infer spans (generate_stream, generate)"),
        Citation(REPO, "backends/v3/src/backend.rs", COMMIT, "schedule, batch, infer, waiting, prefill, decode, "
                 "send_generation spans and their links"),
        Citation(REPO, "backends/v3/src/queue.rs", COMMIT, "queued span; batch span with batch_size"),
    ),
)
