"""SGLang's request tracing (`--enable-trace --otlp-traces-endpoint`), read from sgl-project/sglang.

One trace per request: a `Req <rid[:8]>` span opened by the tokenizer manager at arrival and closed when the
request finishes, a span per process it passed through (`Tokenizer (host:… | pid:…)`, `Scheduler [TP 0] (…)`),
and under those its stages (SGLang's RequestStage: tokenize, dispatch, request_process, prefill_waiting,
prefill_forward, decode_waiting, decode_forward; at trace level 3, the default, also chunked_prefill per chunk and
decode_loop per decode iteration), each linked to the one before, with `schedule` events (batch id, batch size,
forward mode) and `retract` events.
"""

from __future__ import annotations

from infertrace.sources.profile import Citation, SourceProfile, SpanShape

REPO = "sgl-project/sglang"

SGLANG = SourceProfile(
    name="sglang",
    title="SGLang",
    export=("--enable-trace --otlp-traces-endpoint HOST:4317; gRPC unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="
            "http/protobuf; trace level from SGLANG_TRACE_LEVEL or /set_trace_level (3 by default)"),
    resource="Resource.create({service.name: 'sglang'}): every SGLang server has the same service.name",
    spans=(
        SpanShape("Req <rid[:8]>", "INTERNAL", "tokenizer manager: request received to finished",
                  (("rid", "string", ""), ("module", "string", "sglang::request"),
                   ("bootstrap_room", "string", "PD mode only: str(hex(room)), the key pairing the prefill and decode "
                    "requests (request_legs.pair_key); the span is then named `prefill Req …` / `decode Req …`"),
                   ("gen_ai.usage.prompt_tokens, completion_tokens, cached_tokens", "int", "set at finish"),
                   ("gen_ai.request.id", "string", ""), ("gen_ai.response.model", "string", "served model name"),
                   ("gen_ai.response.finish_reasons", "string", "json.dumps of a list"),
                   ("gen_ai.latency.time_to_first_token, e2e, time_in_model_decode, _inference, _prefill",
                    "double s", "the tokenizer's clock (perf_counter shifted to wall time)"))),
        SpanShape("<label> [TP n] (host:<id> | pid:<pid>)", "INTERNAL", "one per process the request passed through",
                  (("host_id", "string", "/etc/machine-id"), ("pid", "int", "native thread id"),
                   ("thread_label", "string", "Tokenizer, Scheduler, ..."), ("tp_rank, dp_rank", "int", ""))),
        SpanShape("tokenize … decode_loop", "INTERNAL", "stages on the process's clock; decode_loop: previous "
                  "token to this one", (("decode_ct", "int", "decode_loop: iteration index"),)),
    ),
    clocks=("Each process converts perf_counter to wall time with its own offset (recalibrated per request): the "
            "tokenizer's root span and the scheduler's slices may differ by clock skew between processes."),
    normalised=("requests", "tokens (prefill_forward end, each decode_loop end)"),
    missing=("service.instance.id (the instance is taken from the scheduler's host id and pid)", "tenant",
             "step spans: a batch's membership is only in the `schedule` events' batch ids (not normalised yet)",
             "time_in_queue (taken from the prefill_forward slice)"),
    citations=(
        Citation(REPO, "python/sglang/srt/observability/trace.py", "b8e5a7c39773b60a4d1f77647b8fda1fee65bba1",
                 "TraceReqContext: span names and tree, links, events, 64-bit trace ids, service.name, exporter"),
        Citation(REPO, "python/sglang/srt/observability/req_time_stats.py", "602413bc230f597e24cda749c7cc2f6ba92bff85",
                 "RequestStage names and levels, schedule and retract events, gen_ai.latency.* from the tokenizer"),
        Citation(REPO, "python/sglang/srt/managers/tokenizer_manager_components/request_tracing.py",
                 "2d396b526f4fd2749397c0bc3f966e79f3f4ab71", "make_span_attrs: the request span's attributes"),
    ),
)
