"""Speed work changes nothing that is simulated: for fixed seeds, one engine writes the same bytes and a fleet
serves every request the same way (same spans and times, same steps) as the code did before it was made faster.

The digests below were recorded from commit 01b214a (before the block manager, tracer, statistics and fleet
loop were reworked for speed) with `python -m tests.simulation_digests`. A change that means to alter what is
simulated records them again, and says so in its commit message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simulation_digests import AZURE, ENGINE_CASES, FLEET_CASES, MOONCAKE, NEEDS_WORKLOADS

RECORDED = {
    "azure_five_minutes": "dfa2ca26804633d5d4a61065b2d99efd263ad952ea88da89790efbeee8f6d3f7",
    "synthetic_decode_first_preempting": "a4786c639852f60e763c8f5106d401987daba57085e2608b313b923bf48bced8",
    "synthetic_prefill_first_rejecting": "2734f1ff19bba3458dec1112217d522e3cd3b899a9ae1aaf8fdb9b474aa582d8",
    "synthetic_tp4_microbatch_no_prefix_cache": "b189186105d6f579a16a2eb72b9d1cf35645946faf6b60eba6f7112e55072589",
    "synthetic_host_pauses": "ba308f433152821b3ce20f613f84c6695eea645d129fa35dc76b248a91e840e9",
    "mooncake_shared_prefixes": "b87a13c32da8427c05be8c88d7c5d57d934c423e67381c0507d898fcda0c5ebf",
    "round_robin_synthetic": "feac0e9244967efc17d07805ce83544be34655c8e32c4332aeacbf8d1396e934",
    "least_loaded_synthetic": "4f62aa14d5846425e5a37be1544333f18b19f2f3bb5670ff092a854aa123fe21",
    "round_robin_azure_4x": "8b34b56353024a4cd5b86a60a606062cfed372092d018a2e219fb009687e86a8",
    "least_loaded_azure_4x": "66b8b03b83c85609267da28251e8a50c8fe90f09932d3a50b692d484a408b5cb",
    "two_models_example": "62d4ced59b9eb6ced131b0b2c8c8b882259107599b476eb508b9ffedd575d940",
    "disaggregated_example": "a7afcf44a926d6a56dbae0b2c2aaca2f4d665933784e4a5b9d291eec2c750b49",
}


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
