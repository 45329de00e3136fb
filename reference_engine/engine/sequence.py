"""A request as the workload describes it, and a sequence as the engine tracks it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

from reference_engine.engine.prompt import Prompt


@dataclass(slots=True)
class Request:
    request_id: str
    arrival_ns: int
    prompt: Prompt
    output_tokens: int  # what the model will generate before stopping (≤ max_tokens)
    max_tokens: int
    tenant: str = "default"
    model: str = ""
    system_prompt_id: str | None = None
    system_prompt_tokens: int = 0
    assistant_prefill_tokens: int = 0  # the last prompt tokens: a caller-supplied start of the reply
    # Trace context of the caller (trace id, parent span id) when a gateway sent the request.
    trace_parent: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.prompt.num_tokens < 1:
            raise ValueError(f"request {self.request_id}: the prompt is empty")
        if not 1 <= self.output_tokens <= self.max_tokens:
            raise ValueError(f"request {self.request_id}: output_tokens={self.output_tokens} must be in "
                             f"[1, max_tokens={self.max_tokens}]")


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """Engine-side state of one request. Token accounting, as in vLLM:

    - `num_tokens` = prompt + generated tokens;
    - `num_computed_tokens`: tokens whose KV is in the cache;
    - while `num_computed_tokens < prefill_target` the sequence is prefilling; the step that completes the
      prefill samples one token. A preempted sequence is recomputed: its next prefill target is every token
      it has (prompt and generated), and it samples its next token at the end.
    - a decode step computes the KV of the last token and samples one more.
    """

    __slots__ = (
        "block_hashes",
        "block_table",
        "error",
        "finish_ns",
        "first_scheduled_ns",
        "first_token_ns",
        "last_token_ns",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_hashed_blocks",
        "num_output_tokens",
        "num_prefill_chunks",
        "num_prompt_tokens",
        "preemptions",
        "prefill_target",
        "private_key",
        "request",
        "status",
    )

    def __init__(self, request: Request) -> None:
        self.request = request
        self.num_prompt_tokens = request.prompt.num_tokens
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.prefill_target = 0  # set when the sequence is admitted
        self.block_table: list[int] = []
        # Hashes of the prompt's full blocks, or of those before its private part while that is unhashed
        # (BlockManager): computed at the first look-up.
        self.block_hashes: list[int] | None = None
        self.private_key: str | None = None  # first segment key of the unhashed private part, if any
        self.num_hashed_blocks = 0  # leading blocks of block_table registered in the prefix cache
        self.num_cached_tokens = -1  # prefix-cache hit at first admission; -1 until then
        self.first_scheduled_ns: int | None = None
        self.first_token_ns: int | None = None
        self.last_token_ns = 0
        self.finish_ns: int | None = None
        self.preemptions = 0
        self.num_prefill_chunks = 0
        self.error: str | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.prefill_target

    @property
    def remaining_output(self) -> int:
        return self.request.output_tokens - self.num_output_tokens

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id}, {self.status.name}, computed={self.num_computed_tokens}, "
                f"out={self.num_output_tokens}/{self.request.output_tokens})")
