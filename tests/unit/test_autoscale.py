"""The scaling decision: demand looked ahead through the schedule, hysteresis, the budget."""

from __future__ import annotations

import pytest

from msd.plan.autoscale import Settings, SourceLoad, decide, needed_loaders, peak_token_shares
from msd.plan.schedule import Schedule

# source 1 goes from 5 % to 60 % of the samples between steps 100 and 200
RAMP = Schedule(
    (((0, 0.95), (100, 0.95), (200, 0.4)), ((0, 0.05), (100, 0.05), (200, 0.6))), linear=True
)
SETTINGS = Settings(max_loaders=8, lead_s=10.0, headroom=0.5, calm=3)


def test_token_shares_weigh_samples_by_their_length() -> None:
    flat = Schedule((((0, 1.0),), ((0, 1.0),)), False)
    assert peak_token_shares(flat, 0, 10, [100.0, 300.0]) == pytest.approx([0.25, 0.75])
    assert peak_token_shares(RAMP, 0, 50, [1.0, 1.0])[1] == pytest.approx(0.05)
    assert peak_token_shares(RAMP, 0, 150, [1.0, 1.0])[1] == pytest.approx(0.325)
    assert peak_token_shares(RAMP, 0, 1000, [1.0, 1.0])[1] == pytest.approx(0.6)


def test_need_grows_before_the_ramp_reaches_the_step() -> None:
    loads = [SourceLoad(1, 100.0, 100_000.0), SourceLoad(1, 100.0, 5_000.0)]

    def need(step: int) -> list[int | None]:
        # 10 steps/s × 10 s: the decision at step s looks at steps s .. s + 100
        needs = needed_loaders(RAMP, loads, step, 10.0, 1000, SETTINGS)
        return [None if n is None else n.loaders for n in needs]

    assert need(0) == [1, 1]  # 5 % of 10k tokens/s = 500, one loader supplies 2,500
    # the ramp's end (60 %: 6,000 tokens/s) is in sight at step 100: 3 loaders' worth, and one
    # more, since the loader whose visit is consumed is not reading ahead
    assert need(100) == [1, 4]
    assert need(90)[1] == 4  # and ahead of its start already: it grows from step 100 on
    assert need(0)[1] == 1
    unmeasured = [SourceLoad(1, None, None), SourceLoad(2, 100.0, None)]
    assert needed_loaders(RAMP, unmeasured, 0, 10.0, 1000, SETTINGS) == [None, None]
    _, slow = needed_loaders(RAMP, loads, 100, 10.0, 1000, SETTINGS)
    assert slow is not None and slow.demand == pytest.approx(6000) and slow.per_loader == 2500


def test_decide_scales_up_at_once_down_after_calm_and_keeps_the_budget() -> None:
    loads = [SourceLoad(2, 1.0, 1.0), SourceLoad(4, 1.0, 1.0)]
    assert decide(loads, [3, 4], [0, 0], SETTINGS) == [3, 4]
    assert decide(loads, [1, 4], [2, 0], SETTINGS) == [2, 4]  # not calm long enough
    assert decide(loads, [1, 4], [3, 0], SETTINGS) == [1, 4]
    assert decide(loads, [None, 4], [0, 0], SETTINGS) == [2, 4]
    # Down only by a quarter or more: 5 → 4 is not worth new processes, 5 → 3 is.
    five = [SourceLoad(5, 1.0, 1.0)]
    assert decide(five, [4], [9], SETTINGS) == [5]
    assert decide(five, [3], [9], SETTINGS) == [3]
    over = decide(loads, [10, 10], [0, 0], SETTINGS)
    assert sum(over) <= SETTINGS.max_loaders and over == [4, 4] and min(over) >= 1
