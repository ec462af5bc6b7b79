"""benchmarks.hybrid_balance judges real balance calls: on a seeded mixture, weighing the encoder
gives a slowest rank no slower than text-only balancing or the in-order split, and no faster
than the bound."""

from __future__ import annotations

import pytest

from benchmarks.hybrid_balance import run
from msd.plan.hybrid_cost import HybridCost


@pytest.mark.parametrize("mix", ["image", "video"])
def test_sum_is_between_the_bound_and_the_other_splits(mix: str) -> None:
    result = run(8, steps=3, model=HybridCost(enc_attn=0.4, enc_lin=40.0), seed=1, mix=mix)
    cost = result["slowest_rank_cost"]
    assert cost["bound"] <= cost["sum"] * (1 + 1e-9)
    assert cost["sum"] <= cost["backbone"] * (1 + 1e-9)
    assert cost["sum"] <= cost["none"]
    assert result["leftover_samples"]["sum"] == 0
    assert 0 < result["encoder_share"] < 1
