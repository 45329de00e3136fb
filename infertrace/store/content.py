"""Prompt and completion text that GenAI instrumentations put on spans: the store never keeps it.

infertrace explains latency from times and token counts; no analysis reads what a prompt or a completion said, and
a store of traces is read by more people than wrote the requests. Instrumentations record message text by default
(OpenLLMetry's `TRACELOOP_TRACE_CONTENT`, OpenInference, the Vercel AI SDK, Langfuse, MLflow), under the keys
below. Ingest leaves every attribute under such a key out of the spans it stores (of a span, of its events, and of
a span or line it quarantines), and counts what it left out in the store's notes ("removed N prompt or completion
texts (gen_ai.prompt.0.content: N, …)"), so the report says that the spans held message text and that it is not
kept. A line that is not JSON at all is quarantined as it was: nothing in it can be told apart.

Keys, each matched whole:
- OpenTelemetry GenAI conventions: `gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.system_instructions`,
  `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`; the event attributes of their earlier releases,
  `gen_ai.prompt` and `gen_ai.completion`;
- OpenLLMetry: `gen_ai.prompt.<i>.content`, `gen_ai.completion.<i>.content`, and any key under those two that
  ends in `.content`, `.text` or `.arguments` (tool calls); `llm.prompts`, `llm.completions`,
  `traceloop.entity.input`, `traceloop.entity.output` (roles, tool names and finish reasons are kept);
- OpenInference: `input.value`, `output.value`, and any key under `llm.input_messages.` or `llm.output_messages.`
  that ends in `.content`, `.text` or `.arguments`;
- Vercel AI SDK: `ai.prompt`, `ai.prompt.messages`, `ai.response.text`, `ai.response.object`,
  `ai.response.toolCalls`, `ai.toolCall.args`, `ai.toolCall.result`;
- Langfuse: `langfuse.observation.input`, `langfuse.observation.output`, `langfuse.trace.input`,
  `langfuse.trace.output`; MLflow: `mlflow.spanInputs`, `mlflow.spanOutputs`.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Final

CONTENT_KEY: Final = re.compile(
    r"gen_ai\.(input\.messages|output\.messages|system_instructions|tool\.call\.arguments|tool\.call\.result"
    r"|prompt|completion)"
    r"|(gen_ai\.(prompt|completion)|llm\.(input|output)_messages)\..*\.(content|text|arguments)"
    r"|llm\.(prompts|completions)(\..+)?|traceloop\.entity\.(input|output)|(input|output)\.value"
    r"|ai\.prompt(\.messages)?|ai\.response\.(text|object|toolCalls)|ai\.toolCall\.(args|result)"
    r"|langfuse\.(observation|trace)\.(input|output)|mlflow\.span(Inputs|Outputs)")


@functools.lru_cache(maxsize=4096)  # a few keys, asked for every attribute on the record-by-record path
def is_content(key: str) -> bool:
    """Whether an attribute under `key` holds prompt or completion text."""
    return CONTENT_KEY.fullmatch(key) is not None


def without_content(value: Any) -> Any:
    """`value` (parsed OTLP JSON: a line, a span, any part) with every attribute under a content key left out of
    every `KeyValue` list in it; the rest as it was. For what ingest quarantines."""
    if isinstance(value, dict):
        return {k: without_content(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_content(v) for v in value
                if not (isinstance(v, dict) and isinstance(v.get("key"), str) and is_content(v["key"]))]
    return value
