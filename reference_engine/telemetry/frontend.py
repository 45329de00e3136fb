"""What the engines' API servers add around the engine core the simulation models: their share of each request's
latency, and the resource and finish reasons every Python engine's spans carry."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reference_engine.telemetry.otlp import Attributes

if TYPE_CHECKING:
    from reference_engine.engine.sequence import Sequence

# What the OpenTelemetry Python SDK's Resource.create adds by itself.
SDK_RESOURCE: Attributes = {"telemetry.sdk.language": "python", "telemetry.sdk.name": "opentelemetry",
                            "telemetry.sdk.version": "1.27.0"}


@dataclass
class FrontendLatency:
    """The API server's share of a request: from its arrival at the server to the engine core (tokenisation, IPC),
    and from the core's output to the server (detokenisation). Drawn uniformly per request, in milliseconds."""

    in_ms: tuple[float, float] = (1.0, 3.0)
    out_ms: tuple[float, float] = (0.2, 1.0)
    rng: random.Random = field(default_factory=random.Random)

    def draw(self) -> tuple[int, int]:
        return (round(self.rng.uniform(*self.in_ms) * 1e6), round(self.rng.uniform(*self.out_ms) * 1e6))


def finish_reason(seq: Sequence) -> str:
    return "length" if seq.num_output_tokens >= seq.request.max_tokens else "stop"
