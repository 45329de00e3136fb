"""Accelerator and host specifications for the roofline cost model.

Peak figures are dense bf16 tensor FLOP/s and memory bandwidth from the vendors' datasheets; a CPU-only
host uses AMX/AVX-512 bf16 throughput of a 2-socket server and its DDR5 bandwidth.

Collective latencies follow NCCL's own cost model (`src/graph/tuning.cc`, `ncclTopoTuneModel`): a ring
all-reduce over p ranks takes `baseLat + 2·(p−1)·hwLat + bytes / bandwidth`, with baseLat = 6.6 µs (ring, LL
protocol) and hwLat = 0.6 µs per step over NVLink, 1.0 µs over PCIe, 2.7 µs over the network.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s, Π
    mem_bandwidth: float  # HBM (or DRAM) bytes/s, β
    mem_bytes: float  # device memory per accelerator
    interconnect_bandwidth: float  # bytes/s per direction between accelerators of one instance (all-reduce)
    interconnect_latency_s: float  # fixed latency of one collective (NCCL's baseLat)
    host_flops: float  # the host CPU, for layers offloaded to it
    host_mem_bandwidth: float  # host DRAM bytes/s
    host_link_bandwidth: float  # PCIe bytes/s between host and device (0 on a CPU-only host)
    interconnect_hop_latency_s: float = 0.6e-6  # per ring step of a collective (NCCL's hwLat; NVLink)


_NCCL_BASE_LATENCY_S = 6.6e-6
HARDWARE: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        HardwareSpec("H100-SXM", 989e12, 3.35e12, 80e9, 450e9, _NCCL_BASE_LATENCY_S, 3.0e12, 300e9, 55e9),
        HardwareSpec("H200", 989e12, 4.8e12, 141e9, 450e9, _NCCL_BASE_LATENCY_S, 3.0e12, 300e9, 55e9),
        HardwareSpec("A100-80GB", 312e12, 2.039e12, 80e9, 300e9, _NCCL_BASE_LATENCY_S, 2.0e12, 200e9, 25e9),
        # No NVLink: collectives cross PCIe.
        HardwareSpec("L4", 121e12, 300e9, 24e9, 32e9, _NCCL_BASE_LATENCY_S, 1.5e12, 100e9, 25e9,
                     interconnect_hop_latency_s=1.0e-6),
        # A CPU-only host: the "device" is the host itself, so offloading costs nothing extra.
        HardwareSpec("CPU-host", 3.0e12, 300e9, 512e9, 100e9, 20e-6, 3.0e12, 300e9, 0.0,
                     interconnect_hop_latency_s=2.7e-6),
    )
}


def hardware(name: str) -> HardwareSpec:
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}") from None
