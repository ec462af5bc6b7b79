import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from msd.plan.rows import RowPacker, deal_rows


@given(
    st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=4), max_size=40), st.integers(1, 6)
)
@settings(max_examples=100, deadline=None)
def test_packer_places_groups_whole_and_within_capacity(groups, num_rows):
    packer = RowPacker(num_rows, 40)
    placed: list[int] = []
    for group in groups:
        before = sorted(packer.rooms)
        if packer.place(group):
            placed += group
        else:
            assert sorted(packer.rooms) == before, "a group that does not fit changes nothing"
    assert packer.count == len(placed)
    assert sorted(i for row in packer.members for i in row) == list(range(len(placed)))
    for row in packer.members:
        assert sum(placed[i] for i in row) <= 40


def test_dealing_rows_gives_each_rank_its_rows_and_balances_them():
    members = [[0], [1, 2], [3], [4, 5, 6], [7], [8], [9], [10]]
    costs = np.array([100, 5, 5, 90, 1, 1, 1, 80, 70, 60, 50], dtype=float)
    ranks = deal_rows(members, costs, num_ranks=2, rows_per_rank=4, rows_per_micro_batch=2)
    assert len(ranks) == 2 and all(len(rank) == 4 for rank in ranks)
    flat = sorted(i for rank in ranks for row in rank for i in row)
    assert flat == list(range(11))
    loads = [sum(costs[i] for row in rank for i in row) for rank in ranks]
    assert max(loads) - min(loads) <= 100
