"""Prefill/decode disaggregation: prefill workers compute the prompt, a link carries its KV cache to a decode
worker, the decode worker generates.

KV bytes per token = 2 (K and V) · layers · kv_heads · head_dim · dtype_bytes. A link moves one transfer at a
time at its bandwidth (transfers queue behind each other) and adds its latency; congestion lowers the
bandwidth for transfers that start while it lasts.

As in vLLM's P/D connectors, the decode worker receives the KV of the prompt and recomputes only the last
prompt token, whose logits sample the first output token; that one-token prefill rides in a decode step.
"""

from __future__ import annotations

from reference_engine.engine.block_manager import BlockManager
from reference_engine.engine.models import ModelSpec
from reference_engine.engine.sequence import Sequence
from reference_engine.fleet.config import FaultWindow, LinkSpec


def kv_transfer_bytes(spec: ModelSpec, tokens: int) -> int:
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * spec.dtype_bytes * tokens


class Link:
    def __init__(self, spec: LinkSpec, faults: list[FaultWindow]) -> None:
        self.spec = spec
        self.faults = faults
        self.free_ns = 0  # when the link finishes the transfers already queued on it
        self.latency_ns = round(spec.latency_ms * 1e6)

    def bandwidth(self, t: int) -> float:
        """Bytes per second for a transfer starting at t."""
        bandwidth = self.spec.bandwidth_gb_s * 1e9
        for w in self.faults:
            if w.active(t):
                bandwidth *= w.fault.param("bandwidth_fraction")
        return max(bandwidth, 1.0)

    def transfer(self, t: int, nbytes: int) -> int:
        """Queue a transfer ready at t; returns when its last byte arrives."""
        start = max(t, self.free_ns)
        self.free_ns = start + round(nbytes / self.bandwidth(start) * 1e9)
        return self.free_ns + self.latency_ns


class DecodeWorkerBlockManager(BlockManager):
    """A decode worker's KV blocks: at a request's first admission every prompt token but the last counts as
    computed (its KV came over the link). The prefix-cache hit reported for the request stays the local one.
    A preempted request lost its blocks and is recomputed locally, as on any engine."""

    def allocate(self, seq: Sequence, num_tokens: int) -> int:
        hit = super().allocate(seq, num_tokens)
        if seq.preemptions:
            return hit
        if seq.num_cached_tokens < 0:
            seq.num_cached_tokens = hit
        return max(hit, min(seq.num_prompt_tokens, num_tokens) - 1)

    def cached_prefix_tokens(self, seq: Sequence, num_tokens: int) -> int:
        hit = super().cached_prefix_tokens(seq, num_tokens)
        return hit if seq.preemptions else max(hit, min(seq.num_prompt_tokens, num_tokens) - 1)
