"""Semantic conventions: every span name, event name and attribute key that the engine emits and the
toolkit reads.

This module is the contract between `reference_engine` (or any other instrumented engine) and
`infertrace`. OpenTelemetry GenAI names are used where they exist; vLLM's `gen_ai.latency.*` attributes are
set on the engine request span so that the same analyzers work on vLLM's own `llm_request` spans; engine
internals live under the `infertrace.` prefix.

Times inside attributes are seconds (doubles) where vLLM defines them so, and integer nanoseconds where
the name ends in `_ns`. Token counts are integers. No prompt or completion text is ever recorded.

`python -m infertrace.semconv` prints docs/semconv.md; a test fails when that page is stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Convention:
    name: str
    kind: str  # "span", "event", "attribute" or "resource"
    type: str  # value type for attributes; span kind for spans
    where: str  # which spans or resources carry it
    brief: str
    source: str = "infertrace"  # who emits it: this project, or another engine or gateway whose name the store reads


REGISTRY: list[Convention] = []


def _define(name: str, kind: str, type_: str, where: str, brief: str, source: str = "infertrace") -> str:
    REGISTRY.append(Convention(name, kind, type_, where, brief, source))
    return name


def _span(name: str, span_kind: str, brief: str) -> str:
    return _define(name, "span", span_kind, "", brief)


def _event(name: str, where: str, brief: str) -> str:
    return _define(name, "event", "", where, brief)


def _attr(name: str, type_: str, where: str, brief: str) -> str:
    return _define(name, "attribute", type_, where, brief)


def _res(name: str, type_: str, brief: str) -> str:
    return _define(name, "resource", type_, "every resource", brief)


PREFIX: Final = "infertrace."
INSTRUMENTATION_SCOPE: Final = "infertrace.reference_engine"

# --------------------------------------------------------------------------------------------- spans
SPAN_GATEWAY: Final = _span(
    "gateway", "SERVER", "The request as the gateway served it: root of the request's trace.")
SPAN_AUTH: Final = _span(
    "auth", "INTERNAL",
    "Authentication of the caller by an auth component. Like every component span, it starts when the request "
    "arrives at the component and ends when it leaves: a wait for a free worker is inside it (and set as "
    "`infertrace.component.queue_ns`).")
SPAN_RATE_LIMIT: Final = _span(
    "rate_limit", "INTERNAL", "Admission by a rate limiter (token bucket per tenant), from arrival to decision.")
SPAN_ROUTE: Final = _span(
    "route", "INTERNAL",
    "Routing to an engine instance, from arrival at the router (or release by the global queue) to dispatch; "
    "a wait for a free router worker is inside it (`infertrace.component.queue_ns`). When the model has a "
    "global queue, the router's backlog waits there instead: the queue releases only to a router with a free "
    "worker.")
SPAN_GLOBAL_QUEUE: Final = _span(
    "global_queue", "INTERNAL",
    "Time the request waited in a global scheduler queue before routing: all of it is waiting (for an engine "
    "with room, or a router worker), so it carries no queue-time attribute.")
SPAN_REQUEST: Final = _span(
    "llm_request", "SERVER",
    "The engine's request span (vLLM's name): arrival at the engine to the last token. Parent of the "
    "phase spans below.")
SPAN_QUEUE: Final = _span("queue", "INTERNAL", "Arrival at the engine to first scheduling.")
SPAN_PREFILL: Final = _span(
    "prefill", "INTERNAL",
    "First scheduling to the first token: every prefill chunk (one event each) and the waits between "
    "them. A request preempted and recomputed gets a second prefill span.")
SPAN_KV_TRANSFER: Final = _span(
    "kv_transfer", "INTERNAL",
    "Transfer of the prompt's KV cache from a prefill worker to a decode worker (disaggregated serving).")
SPAN_DECODE: Final = _span("decode", "INTERNAL", "First token to last token.")
SPAN_STEP: Final = _span(
    "engine_step", "INTERNAL",
    "One engine step, or a run of consecutive decode-only steps with unchanged membership. Each span is "
    "the root of its own trace. Every token time is derivable: a request in `infertrace.step.decode."
    "request_ids` receives one token at the end of every step of the run; a request in `infertrace.step."
    "prefill.request_ids` whose `samples_token` flag is true receives one token at the end of the (single) "
    "step. Step i ends at start + sum(durations_ns[0..i]).")

# --------------------------------------------------------------------------------------------- events
EVENT_PREFILL_CHUNK: Final = _event(
    "prefill_chunk", SPAN_PREFILL, "One chunk of the prompt computed in one step (time = end of that step).")
EVENT_PREEMPTED: Final = _event(
    "preempted", SPAN_REQUEST, "The request lost its KV blocks and will be recomputed.")
EVENT_FIRST_TOKEN: Final = _event("first_token", SPAN_REQUEST, "The first output token was produced.")

# -------------------------------------------------------------------- GenAI and vLLM request attributes
OPERATION_NAME: Final = _attr(
    "gen_ai.operation.name", "string", "llm_request", "GenAI operation, e.g. `chat` or `text_completion`.")
PROVIDER_NAME: Final = _attr(
    "gen_ai.provider.name", "string", "llm_request", "Who serves the model (`infertrace` for the "
    "reference engine).")
REQUEST_MODEL: Final = _attr("gen_ai.request.model", "string", "gateway, llm_request", "Requested model.")
RESPONSE_MODEL: Final = _attr("gen_ai.response.model", "string", "llm_request", "Model that answered.")
REQUEST_ID: Final = _attr(
    "gen_ai.request.id", "string", "gateway, component spans, llm_request, phase spans",
    "Request id (vLLM's attribute); the join key between request, phase and step spans.")
REQUEST_MAX_TOKENS: Final = _attr("gen_ai.request.max_tokens", "int", "llm_request", "Output token limit.")
USAGE_INPUT_TOKENS: Final = _attr(
    "gen_ai.usage.input_tokens", "int", "gateway, llm_request",
    "Prompt tokens, including any assistant prefill.")
USAGE_OUTPUT_TOKENS: Final = _attr("gen_ai.usage.output_tokens", "int", "gateway, llm_request",
                                   "Generated tokens.")
USAGE_CACHE_READ_INPUT_TOKENS: Final = _attr(
    "gen_ai.usage.cache_read.input_tokens", "int", "llm_request",
    "Prompt tokens served from the prefix (KV) cache at first scheduling.")
RESPONSE_FINISH_REASONS: Final = _attr(
    "gen_ai.response.finish_reasons", "string[]", "llm_request", "`stop`, `length` or `error`.")
ERROR_TYPE: Final = _attr("error.type", "string", "any span", "Error class when the operation failed.")
HTTP_STATUS_CODE: Final = _attr(
    "http.response.status_code", "int", "gateway, component spans",
    "HTTP-style outcome (200, 401, 429, 5xx). Where a span has none, `http.status_code` (the HTTP conventions "
    "before 1.21, Envoy, Zipkin's tags) is read instead.")
HTTP_RESEND_COUNT: Final = _attr(
    "http.request.resend_count", "int", "gateway",
    "The client's retry number of this request (OpenTelemetry's HTTP name; clients send it, e.g. as an "
    "`x-stainless-retry-count` header); absent on a first attempt.")

LATENCY_TIME_IN_QUEUE: Final = _attr(
    "gen_ai.latency.time_in_queue", "double (s)", "llm_request", "Arrival to first scheduling (vLLM).")
LATENCY_TIME_TO_FIRST_TOKEN: Final = _attr(
    "gen_ai.latency.time_to_first_token", "double (s)", "llm_request", "Arrival to first token (vLLM).")
LATENCY_TIME_IN_MODEL_PREFILL: Final = _attr(
    "gen_ai.latency.time_in_model_prefill", "double (s)", "llm_request",
    "First scheduling to first token (vLLM).")
LATENCY_TIME_IN_MODEL_DECODE: Final = _attr(
    "gen_ai.latency.time_in_model_decode", "double (s)", "llm_request", "First token to last token (vLLM).")
LATENCY_E2E: Final = _attr(
    "gen_ai.latency.e2e", "double (s)", "llm_request", "Arrival to last token (vLLM).")

# vLLM's own `llm_request` span (vllm/tracing.py `SpanAttributes`) uses older GenAI names for usage and
# sampling; the store reads them so the analyzers work on vLLM's traces too. The reference engine does not
# emit them.
VLLM_USAGE_PROMPT_TOKENS: Final = _attr(
    "gen_ai.usage.prompt_tokens", "int", "llm_request (vLLM)", "Prompt tokens (vLLM's name).")
VLLM_USAGE_COMPLETION_TOKENS: Final = _attr(
    "gen_ai.usage.completion_tokens", "int", "llm_request (vLLM)", "Generated tokens (vLLM's name).")
VLLM_REQUEST_TEMPERATURE: Final = _attr(
    "gen_ai.request.temperature", "double", "llm_request (vLLM)", "Sampling temperature.")
VLLM_REQUEST_TOP_P: Final = _attr("gen_ai.request.top_p", "double", "llm_request (vLLM)", "Nucleus sampling p.")
VLLM_REQUEST_N: Final = _attr("gen_ai.request.n", "int", "llm_request (vLLM)", "Completions per request.")

# ------------------------------------------------------------------------- infertrace request attributes
TENANT_ID: Final = _attr("infertrace.tenant.id", "string", "gateway, component spans, llm_request",
                         "Tenant (customer or API key owner).")
SYSTEM_PROMPT_ID: Final = _attr(
    "infertrace.request.system_prompt.id", "string", "llm_request",
    "Id of the shared system prompt the request starts with (absent when none); never the text.")
SYSTEM_PROMPT_TOKENS: Final = _attr(
    "infertrace.request.system_prompt.tokens", "int", "llm_request", "Length of that system prompt.")
ASSISTANT_PREFILL_TOKENS: Final = _attr(
    "infertrace.request.assistant_prefill_tokens", "int", "llm_request",
    "Tokens of caller-supplied reply start, prefilled as part of the prompt (0 when none).")
PREEMPTIONS: Final = _attr("infertrace.request.preemptions", "int", "llm_request",
                           "Times the request was preempted.")
PREFILL_CHUNKS: Final = _attr("infertrace.request.prefill_chunks", "int", "llm_request, prefill",
                              "Prefill chunks (steps that computed part of the prompt).")
PREFILL_KV_DEVICE_TOKENS: Final = _attr(
    "infertrace.prefill.kv_hit.device_tokens", "int", "prefill",
    "Prompt tokens found in the GPU's prefix cache when the episode was scheduled (set when the engine has a KV "
    "tier behind the GPU or reuse accounting on).")
PREFILL_KV_HOST_TOKENS: Final = _attr(
    "infertrace.prefill.kv_hit.host_tokens", "int", "prefill",
    "Prompt tokens found in the host-memory KV tier and copied back to the GPU.")
PREFILL_KV_REMOTE_TOKENS: Final = _attr(
    "infertrace.prefill.kv_hit.remote_tokens", "int", "prefill",
    "Prompt tokens found in the remote (pooled) KV tier and copied back to the GPU.")
PREFILL_KV_EVICTED_TOKENS: Final = _attr(
    "infertrace.prefill.kv_evicted_tokens", "int", "prefill",
    "Prompt tokens right after the hits that this engine had cached before but evicted from every tier: "
    "recomputed for lack of capacity.")
PREFILL_KV_EVICTED_REUSE_BLOCKS: Final = _attr(
    "infertrace.prefill.kv_evicted_reuse_blocks", "int", "prefill",
    "KV blocks of extra capacity (behind the last tier, least recently used first) that would have kept all of "
    "those evicted tokens: the evictions from the last tier since the oldest of them left it.")
CHUNK_TOKENS: Final = _attr("infertrace.chunk.tokens", "int", "prefill_chunk", "Tokens computed in the chunk.")
CHUNK_CACHED_TOKENS: Final = _attr(
    "infertrace.chunk.computed_tokens", "int", "prefill_chunk",
    "Tokens already in the KV cache before this chunk (prefix hit plus earlier chunks).")
CHUNK_STEP_INDEX: Final = _attr("infertrace.chunk.step_index", "int", "prefill_chunk",
                                "Index of the step that computed the chunk.")

# ---------------------------------------------------------------------------- engine step attributes
STEP_INDEX: Final = _attr("infertrace.step.index", "int", "engine_step", "Index of the first step in the span.")
STEP_COUNT: Final = _attr("infertrace.step.count", "int", "engine_step", "Steps in the span (≥ 1).")
STEP_DURATIONS_NS: Final = _attr(
    "infertrace.step.durations_ns", "int[]", "engine_step", "Duration of each step, in order.")
STEP_PREFILL_REQUEST_IDS: Final = _attr(
    "infertrace.step.prefill.request_ids", "string[]", "engine_step",
    "Requests that computed a prefill chunk in the step (only single-step spans have any).")
STEP_PREFILL_CHUNK_TOKENS: Final = _attr(
    "infertrace.step.prefill.chunk_tokens", "int[]", "engine_step", "Chunk size of each prefilling request.")
STEP_PREFILL_COMPUTED_TOKENS: Final = _attr(
    "infertrace.step.prefill.computed_tokens", "int[]", "engine_step",
    "Tokens each prefilling request already had in the KV cache before the chunk.")
STEP_PREFILL_SAMPLES_TOKEN: Final = _attr(
    "infertrace.step.prefill.samples_token", "bool[]", "engine_step",
    "Whether the chunk completed the prompt (or the recomputed context after a preemption), so the "
    "request received a token at the step's end.")
STEP_DECODE_REQUEST_IDS: Final = _attr(
    "infertrace.step.decode.request_ids", "string[]", "engine_step",
    "Requests that received one token at the end of every step of the span.")
STEP_DECODE_CONTEXT_TOKENS: Final = _attr(
    "infertrace.step.decode.context_tokens", "int", "engine_step",
    "Sum over decoding requests of their context length at the first step.")
STEP_PREFILL_TOKENS: Final = _attr("infertrace.step.prefill_tokens", "int", "engine_step",
                                   "Prefill tokens per step.")
STEP_DECODE_TOKENS: Final = _attr("infertrace.step.decode_tokens", "int", "engine_step",
                                  "Decode tokens per step.")
STEP_RUNNING: Final = _attr("infertrace.step.running", "int", "engine_step", "Running requests after scheduling.")
STEP_WAITING: Final = _attr("infertrace.step.waiting", "int", "engine_step", "Waiting requests after scheduling.")
STEP_KV_USED_BLOCKS: Final = _attr("infertrace.step.kv.used_blocks", "int", "engine_step",
                                   "KV blocks held by requests at the end of the span.")
STEP_KV_TOTAL_BLOCKS: Final = _attr("infertrace.step.kv.total_blocks", "int", "engine_step",
                                    "KV blocks the engine has.")
STEP_PREEMPTED_REQUEST_IDS: Final = _attr(
    "infertrace.step.preempted.request_ids", "string[]", "engine_step",
    "Requests preempted while scheduling this step.")
STEP_PAUSE_NS: Final = _attr(
    "infertrace.step.pause_ns", "int", "engine_step",
    "Time inside the step not spent computing (host pause, garbage collection); 0 normally.")

STEP_OFFLOAD_HOST_LINK_BYTES: Final = _attr(
    "infertrace.step.offload.host_link_bytes", "int", "engine_step",
    "Per step: bytes of offloaded expert weights copied from host memory to the GPU (absent when no expert is "
    "offloaded).")
STEP_OFFLOAD_TRANSFER_NS: Final = _attr(
    "infertrace.step.offload.transfer_ns", "int", "engine_step",
    "Per step: time spent copying those weights over the host link (PCIe).")
STEP_OFFLOAD_HOST_COMPUTE_NS: Final = _attr(
    "infertrace.step.offload.host_compute_ns", "int", "engine_step",
    "Per step: time the host CPU spent computing offloaded experts.")
STEP_OFFLOAD_STREAMED_MICROBATCHES: Final = _attr(
    "infertrace.step.offload.streamed_microbatches", "int", "engine_step",
    "Per step: micro-batches whose offloaded experts ran on the GPU after being copied to it.")
STEP_OFFLOAD_HOST_MICROBATCHES: Final = _attr(
    "infertrace.step.offload.host_microbatches", "int", "engine_step",
    "Per step: micro-batches whose offloaded experts ran on the host CPU (small batches: decodes).")

STEP_KV_LOAD_HOST_TOKENS: Final = _attr(
    "infertrace.step.kv_load.host_tokens", "int", "engine_step",
    "Prompt tokens whose KV the step copied from the host tier to the GPU (absent when none).")
STEP_KV_LOAD_REMOTE_TOKENS: Final = _attr(
    "infertrace.step.kv_load.remote_tokens", "int", "engine_step",
    "Prompt tokens whose KV the step copied from the remote tier to the GPU.")
STEP_KV_LOAD_NS: Final = _attr(
    "infertrace.step.kv_load_ns", "int", "engine_step", "Time of the step spent on those copies (in its duration).")

# -------------------------------------------------------------------------------- KV transfer, gateway
KV_TRANSFER_BYTES: Final = _attr("infertrace.kv_transfer.bytes", "int", "kv_transfer", "KV bytes moved.")
KV_TRANSFER_SOURCE: Final = _attr("infertrace.kv_transfer.source", "string", "kv_transfer",
                                  "Instance that computed the prefill.")
KV_TRANSFER_DESTINATION: Final = _attr("infertrace.kv_transfer.destination", "string", "kv_transfer",
                                       "Instance that decodes.")
KV_TRANSFER_LINK: Final = _attr("infertrace.kv_transfer.link", "string", "kv_transfer",
                                "Name of the link between them.")
COMPONENT_OUTCOME: Final = _attr(
    "infertrace.component.outcome", "string", "component spans",
    "What the component decided: `ok`, `rejected`, `timeout` (the caller gave up waiting for it), `error`.")
COMPONENT_QUEUE_NS: Final = _attr(
    "infertrace.component.queue_ns", "int", "component spans of components with workers",
    "Time the call waited for a free worker of the component, inside the span; its service time is the "
    "span's duration less this. Absent when the component does not queue.")
ROUTE_TARGET: Final = _attr("infertrace.route.target", "string", "route",
                            "Engine instance (`service.instance.id`) the router chose.")

# ------------------------------------------------------------------------------------------- resources
SERVICE_NAME: Final = _res("service.name", "string", "Logical service (e.g. `llm-engine`, `router`).")
SERVICE_INSTANCE_ID: Final = _res("service.instance.id", "string", "This instance; unique in the fleet.")
COMPONENT_KIND: Final = _res(
    "infertrace.component.kind", "string",
    "engine, router, auth, rate_limiter, scheduler, gateway, prefill_worker or decode_worker.")
HARDWARE: Final = _res("infertrace.hardware", "string", "Accelerator name, e.g. `H100-SXM`.")
HARDWARE_COUNT: Final = _res("infertrace.hardware.count", "int", "Accelerators per instance (tensor parallel).")
CLOUD_REGION: Final = _res("cloud.region", "string", "Region or data centre.")
ENGINE_MODEL: Final = _res("infertrace.engine.model", "string", "Model the engine serves.")
ENGINE_POLICY: Final = _res("infertrace.engine.policy", "string", "`prefill_first` or `decode_first`.")
ENGINE_MAX_NUM_BATCHED_TOKENS: Final = _res(
    "infertrace.engine.max_num_batched_tokens", "int", "Per-step token budget.")
ENGINE_MAX_NUM_SEQS: Final = _res("infertrace.engine.max_num_seqs", "int", "Most running requests.")
ENGINE_CHUNKED_PREFILL: Final = _res("infertrace.engine.chunked_prefill", "bool", "Chunked prefill on.")
ENGINE_PREFIX_CACHING: Final = _res("infertrace.engine.prefix_caching", "bool", "Prefix caching on.")
ENGINE_PREFILL_MICROBATCH: Final = _res(
    "infertrace.engine.prefill_microbatch_tokens", "int", "Prefill micro-batch size in tokens (0: none).")
ENGINE_BLOCK_SIZE: Final = _res("infertrace.engine.block_size", "int", "Tokens per KV block.")
ENGINE_CPU_MOE_LAYERS: Final = _res(
    "infertrace.engine.cpu_moe_layers", "int",
    "MoE layers whose experts live in host memory (llama.cpp's --n-cpu-moe); absent when none.")
ENGINE_KV_HOST_TIER_BLOCKS: Final = _res(
    "infertrace.engine.kv_host_tier_blocks", "int", "KV blocks the host-memory tier behind the GPU holds; absent when "
    "none.")
ENGINE_KV_REMOTE_TIER_BLOCKS: Final = _res(
    "infertrace.engine.kv_remote_tier_blocks", "int", "KV blocks the remote (pooled) tier holds; absent when none.")
ENGINE_KV_REUSE_ACCOUNTING: Final = _res(
    "infertrace.engine.kv_reuse_accounting", "bool",
    "true when prefill spans count evicted prompt tokens (`infertrace.prefill.kv_evicted_tokens`); absent when off.")
ENGINE_CUDA_GRAPHS: Final = _res(
    "infertrace.engine.cuda_graphs", "bool", "false when the engine runs without CUDA graphs; absent when on.")
ENGINE_EXECUTOR: Final = _res("infertrace.engine.executor", "string", "`simulated` or `real`.")

# ------------------------------------------------------------------- what other engines and gateways emit
# Names the store reads from other sources (infertrace/sources/ says, per source, what each means, which clock it
# is on, and where in that source's code it is set). Declared here so that their columns always exist with their
# type, and so that the reference engine's emulations of those sources (`simulate --telemetry`) use the same names.


def _other(name: str, kind: str, type_: str, where: str, brief: str, source: str) -> str:
    return _define(name, kind, type_, where, brief, source)


VLLM_USAGE_CACHED_TOKENS: Final = _other(
    "gen_ai.usage.cached_tokens", "attribute", "int", "Req (SGLang), llm_request (vLLM, declared)",
    "Prompt tokens served from the prefix cache.", "SGLang, vLLM")
VLLM_LATENCY_TIME_IN_MODEL_INFERENCE: Final = _other(
    "gen_ai.latency.time_in_model_inference", "attribute", "double (s)", "llm_request (vLLM V1), Req (SGLang)",
    "First scheduling to last token (V1: engine-core clock).", "vLLM, SGLang")
VLLM_LATENCY_TIME_IN_SCHEDULER: Final = _other(
    "gen_ai.latency.time_in_scheduler", "attribute", "double (s)", "llm_request (vLLM V0)",
    "Time the scheduler spent on the request.", "vLLM")
VLLM_LATENCY_TIME_IN_MODEL_FORWARD: Final = _other(
    "gen_ai.latency.time_in_model_forward", "attribute", "double (s)", "llm_request (vLLM V0)",
    "Forward-pass time (with --collect-detailed-traces model).", "vLLM")
VLLM_LATENCY_TIME_IN_MODEL_EXECUTE: Final = _other(
    "gen_ai.latency.time_in_model_execute", "attribute", "double (s)", "llm_request (vLLM V0)",
    "Model-execute time (with --collect-detailed-traces worker).", "vLLM")
VLLM_USAGE_NUM_SEQUENCES: Final = _other(
    "gen_ai.usage.num_sequences", "attribute", "int", "llm_request (vLLM V0)", "Sequences in the request.", "vLLM")
VLLM_RES_PROCESS_ID: Final = _other(
    "vllm.process_id", "resource", "string", "", "PID of the process that made the span (vLLM's tracer).", "vLLM")
VLLM_RES_MODULE: Final = _other(
    "vllm.instrumenting_module_name", "resource", "string", "", "Module that initialised vLLM's tracer.", "vLLM")

SGLANG_SPAN_REQUEST_PREFIX: Final = "Req "
SGLANG_SPAN_REQUEST: Final = _other(
    "Req {rid[:8]}", "span", "INTERNAL", "", "SGLang's request root span (\"{role} Req …\" on a disaggregated "
    "worker), opened by the tokenizer manager when the request arrives, closed when it finishes.", "SGLang")
SGLANG_SPAN_THREAD: Final = _other(
    "{label} [TP n] (host:{host_id[:8]} | pid:{pid})", "span", "INTERNAL", "",
    "One per process (thread) the request passed through, child of the request span; parent of its slices.",
    "SGLang")
SGLANG_SLICES: Final = ("tokenize", "dispatch", "request_process", "prefill_waiting", "prefill_forward",
                        "chunked_prefill", "decode_waiting", "decode_forward", "decode_loop")
for _slice in SGLANG_SLICES:
    _other(_slice, "span", "INTERNAL", "", "A stage of the request in one process (SGLang's RequestStage); "
           "decode_loop is one decode iteration and chunked_prefill one prefill chunk (trace level 3).", "SGLang")
SGLANG_EVENT_SCHEDULE: Final = _other(
    "schedule", "event", "", "slices (SGLang)", "The request was put in a batch: attributes bid (batch id), "
    "batch_size and forward_mode (prefill, decode).", "SGLang")
SGLANG_EVENT_RETRACT: Final = _other(
    "retract", "event", "", "slices (SGLang)", "The request was retracted (preempted) to free KV cache.", "SGLang")
SGLANG_RID: Final = _other("rid", "attribute", "string", "Req (SGLang)", "Request id.", "SGLang")
SGLANG_MODULE: Final = _other("module", "attribute", "string", "Req (SGLang)", "`sglang::request`.", "SGLang")
SGLANG_HOST_ID: Final = _other(
    "host_id", "attribute", "string", "thread span (SGLang)", "/etc/machine-id of the host.", "SGLang")
SGLANG_PID: Final = _other("pid", "attribute", "int", "thread span (SGLang)", "Native thread id.", "SGLang")
SGLANG_THREAD_LABEL: Final = _other(
    "thread_label", "attribute", "string", "thread span (SGLang)", "`Tokenizer`, `Scheduler`, ….", "SGLang")
SGLANG_TP_RANK: Final = _other("tp_rank", "attribute", "int", "thread span (SGLang)", "Tensor-parallel rank.",
                               "SGLang")
SGLANG_DECODE_CT: Final = _other(
    "decode_ct", "attribute", "int", "decode_loop (SGLang)", "Index of the decode iteration.", "SGLang")
SGLANG_TOP_K: Final = _other("gen_ai.request.top_k", "attribute", "int", "Req (SGLang)", "Top-k sampling.", "SGLang")

TGI_HANDLERS: Final = ("chat_completions", "completions", "generate", "generate_stream")
for _handler in TGI_HANDLERS:
    _other(_handler, "span", "INTERNAL", "", "TGI's HTTP handler span (router/src/server.rs): the request as the "
           "router served it. `generate_stream` also names the inner Infer span.", "TGI")
TGI_SPANS: Final = ("validate", "schedule", "queued", "infer", "send_generation", "batch")
for _name in TGI_SPANS:
    _other(_name, "span", "INTERNAL", "", "TGI's span of the same name: queued (in the queue), infer (one per "
           "batch step, linked to the batch span), send_generation (one per token), batch (one per step, its own "
           "trace) with a `prefill` or `decode` child (names shared with this project's phase spans).", "TGI")
TGI_TOTAL_TIME: Final = _other(
    "total_time", "attribute", "string", "handler (TGI)", "Rust `Duration` in Debug form, e.g. `1.234567891s`.",
    "TGI")
TGI_QUEUE_TIME: Final = _other("queue_time", "attribute", "string", "handler (TGI)", "Time in the queue, Debug form.",
                               "TGI")
TGI_INFERENCE_TIME: Final = _other("inference_time", "attribute", "string", "handler (TGI)",
                                   "Batch pickup to the last token, Debug form.", "TGI")
TGI_TIME_PER_TOKEN: Final = _other("time_per_token", "attribute", "string", "handler (TGI)",
                                   "inference_time / generated tokens, Debug form.", "TGI")
TGI_BATCH_SIZE: Final = _other("batch_size", "attribute", "int", "batch (TGI)", "Requests in the batch.", "TGI")
CODE_NAMESPACE: Final = _other(
    "code.namespace", "attribute", "string", "every span (TGI, via tracing-opentelemetry)",
    "Rust module path, e.g. `text_generation_router::server`.", "TGI")

LITELLM_SPAN_PROXY: Final = _other(
    "Received Proxy Server Request", "span", "INTERNAL", "", "LiteLLM proxy's span for a request: the root.",
    "LiteLLM")
LITELLM_SPAN_REQUEST: Final = _other(
    "litellm_request", "span", "INTERNAL", "", "LiteLLM's call to the model backend (parent of the engine's span "
    "when the trace context is propagated).", "LiteLLM")
LITELLM_SERVICE_SPANS: Final = ("router", "proxy_pre_call", "scheduler")
for _hook in LITELLM_SERVICE_SPANS:
    _other(_hook, "span", "INTERNAL", "", "A LiteLLM service-hook span (ServiceTypes value; `auth` is one too): "
           "routing, pre-call checks such as rate limits, a priority scheduler.", "LiteLLM")
LITELLM_SERVICE: Final = _other("service", "attribute", "string", "service-hook spans (LiteLLM)",
                                "The ServiceTypes value.", "LiteLLM")
LITELLM_CALL_TYPE: Final = _other("call_type", "attribute", "string", "service-hook spans (LiteLLM)",
                                  "The function that made the call.", "LiteLLM")
LITELLM_TEAM_ID: Final = _other(
    "metadata.user_api_key_team_id", "attribute", "string", "litellm_request (LiteLLM)",
    "Team of the API key: the tenant.", "LiteLLM")
GEN_AI_SYSTEM: Final = _other("gen_ai.system", "attribute", "string", "litellm_request (LiteLLM)",
                              "Provider of the backend, e.g. `hosted_vllm`.", "LiteLLM")

HTTP_ROUTE: Final = _other("http.route", "attribute", "string", "HTTP server spans",
                           "Matched route template, e.g. `/v1/chat/completions`.", "OpenTelemetry")
HTTP_REQUEST_METHOD: Final = _other("http.request.method", "attribute", "string", "HTTP spans", "`POST`, ….",
                                    "OpenTelemetry")
PEER_SERVICE: Final = _other("peer.service", "attribute", "string", "client spans",
                             "Logical name of the service called.", "OpenTelemetry")
SERVER_ADDRESS: Final = _other("server.address", "attribute", "string", "client spans", "Host called.",
                               "OpenTelemetry")
USER_ID: Final = _other("user.id", "attribute", "string", "any span", "End user (a tenant when nothing else says).",
                        "OpenTelemetry")
HOST_NAME: Final = _other("host.name", "resource", "string", "", "Host the process runs on.", "OpenTelemetry")
PROCESS_PID: Final = _other("process.pid", "resource", "int", "", "Process id.", "OpenTelemetry")

COMPONENT_KINDS: Final = (
    "engine", "router", "auth", "rate_limiter", "scheduler", "gateway", "prefill_worker", "decode_worker")


def markdown() -> str:
    """The human-readable page, docs/semconv.md."""
    lines = [
        "# infertrace semantic conventions",
        "",
        "Generated by `python -m infertrace.semconv` from `infertrace/semconv.py`; do not edit by hand.",
        "",
        (__doc__ or "").strip().split("\n\n", 1)[1].replace("`python -m infertrace.semconv` prints "
                                                            "docs/semconv.md; a test fails when that "
                                                            "page is stale.", "").strip(),
        "",
    ]
    ours = [c for c in REGISTRY if c.source == "infertrace"]
    sections = [("span", "Spans", ("name", "span kind", "meaning")),
                ("event", "Span events", ("name", "on", "meaning")),
                ("attribute", "Attributes", ("key", "type", "on", "meaning")),
                ("resource", "Resource attributes", ("key", "type", "meaning"))]
    for kind, title, header in sections:
        lines += [f"## {title}", "", *_table(header, [
            {"span": (c.name, c.type, c.brief), "event": (c.name, c.where, c.brief),
             "attribute": (c.name, c.type, c.where, c.brief), "resource": (c.name, c.type, c.brief)}[kind]
            for c in ours if c.kind == kind]), ""]
    lines += ["## Names other engines and gateways emit, which the store reads", "",
              "What each means and on which clock it is, with the source file and commit it was read from: "
              "`infertrace/sources/` and docs/sources.md.", "",
              *_table(("name", "kind", "type", "on", "source", "meaning"),
                      [(c.name, c.kind, c.type, c.where, c.source, c.brief) for c in REGISTRY
                       if c.source != "infertrace"]), ""]
    return "\n".join(lines).rstrip() + "\n"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cells in rows:
        escaped = [f"`{cells[0]}`", *cells[1:]]
        escaped = [x.replace("|", "\\|") for x in escaped]
        out.append("| " + " | ".join(escaped) + " |")
    return out


if __name__ == "__main__":
    print(markdown(), end="")
