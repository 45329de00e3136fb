"""Speed work changes nothing that is simulated: for fixed seeds, one engine writes the same bytes and a fleet
serves every request the same way (same spans and times, same steps) as the code did before it was made faster.

The digests (tests/simulation_digests.json) were recorded from commit 01b214a, before the block manager,
tracer, statistics and fleet loop were reworked for speed, except synthetic_tp4_microbatch_no_prefix_cache: it was
recorded again when NCCL's all-reduce cost model (a ring's base and per-hop latencies, a floor) replaced the
single-latency one, which changes the step times of every engine with tensor parallelism. A change that means to
alter what is simulated records them again with `python -m tests.simulation_digests --record` and says so in its
commit message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simulation_digests import AZURE, ENGINE_CASES, FLEET_CASES, MOONCAKE, NEEDS_WORKLOADS, recorded

RECORDED = recorded()


def _skip_without_workloads(name: str) -> None:
    if name in NEEDS_WORKLOADS and not (AZURE.is_file() and MOONCAKE.is_file()):
        pytest.skip("../shared/workloads is not beside this clone")


@pytest.mark.parametrize("name", list(ENGINE_CASES))
def test_an_engine_writes_the_same_spans_byte_for_byte_as_before(name: str, tmp_path: Path) -> None:
    _skip_without_workloads(name)
    assert ENGINE_CASES[name](tmp_path) == RECORDED[name]


@pytest.mark.parametrize("name", list(FLEET_CASES))
def test_a_fleet_serves_every_request_exactly_as_before(name: str, tmp_path: Path) -> None:
    _skip_without_workloads(name)
    assert FLEET_CASES[name](tmp_path) == RECORDED[name]
