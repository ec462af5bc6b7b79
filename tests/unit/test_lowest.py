"""``Lowest``: the running minimum the Planner keeps of its Constructors' progress."""

from __future__ import annotations

import random

import pytest

from msd.roles.planner.lowest import Lowest


@pytest.mark.parametrize("seed", range(20))
def test_low_is_the_minimum_of_the_highest_value_each_key_was_given(seed: int) -> None:
    rng = random.Random(seed)
    lowest, highest = Lowest(), {}
    assert lowest.low is None
    for _ in range(2_000):
        key = rng.randrange(12)
        value = highest.get(key, 0) + rng.choice([-2, -1, 0, 0, 1, 1, 2, 5])
        if key not in highest:
            value = rng.randrange(-3, 10)
        lowest.rise(key, value)
        highest[key] = max(highest.get(key, value), value)
        assert lowest.low == min(highest.values())
        assert lowest.get(key, -99) == highest[key]
        assert len(lowest) == len(highest)


def test_a_new_key_below_the_minimum_lowers_it_and_a_value_that_falls_is_ignored() -> None:
    lowest = Lowest()
    lowest.rise(0, 5)
    lowest.rise(1, 3)
    assert lowest.low == 3
    lowest.rise(1, 2)  # falls: ignored
    assert (lowest.low, lowest.get(1, 0)) == (3, 3)
    lowest.rise(1, 9)
    assert lowest.low == 5
