import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from msd.plan.balance import balance_greedy
from msd.plan.cost import sample_cost

lengths_st = st.lists(st.integers(0, 64), min_size=0, max_size=60)


@given(lengths_st, st.integers(1, 6), st.integers(1, 4))
@settings(max_examples=150, deadline=None)
def test_balance_is_an_exact_partition_within_capacity(lengths, ranks, rows):
    lens = np.array(lengths, dtype=np.int64)
    a = balance_greedy(lens, sample_cost(lens), ranks, rows, 64)
    placed = [i for rank in a.rows for row in rank for i in row]
    assert sorted(placed + list(a.leftover)) == list(range(len(lengths)))
    assert len(a.rows) == ranks and all(len(rank) == rows for rank in a.rows)
    for rank in a.rows:
        for row in rank:
            assert sum(lengths[i] for i in row) <= 64


@given(lengths_st, st.integers(1, 6))
@settings(max_examples=60, deadline=None)
def test_balance_is_deterministic(lengths, ranks):
    lens = np.array(lengths, dtype=np.int64)
    assert balance_greedy(lens, sample_cost(lens), ranks, 3, 64) == balance_greedy(
        lens, sample_cost(lens), ranks, 3, 64
    )


def test_everything_fits_when_total_is_small_and_cost_is_balanced():
    rng = np.random.default_rng(0)
    lens = np.minimum(rng.lognormal(6, 1, size=200).astype(np.int64) + 1, 4096)
    keep = lens[np.cumsum(lens) <= 8 * 8 * 4096 * 0.85]
    cost = sample_cost(keep)
    a = balance_greedy(keep, cost, 8, 8, 4096)
    per_rank = [sum(cost[i] for row in rank for i in row) for rank in a.rows]
    assert a.leftover == ()
    assert max(per_rank) / np.mean(per_rank) < 1.15
