import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from msd.plan.rows import RowPacker, best_fit_rows, deal_rows


@given(
    st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=4), max_size=40), st.integers(1, 6)
)
@settings(max_examples=100, deadline=None)
def test_packer_places_groups_whole_and_within_capacity(groups, num_rows):
    packer = RowPacker(num_rows, 40)
    placed: list[int] = []
    for group in groups:
        before = packer.free_rooms()
        if packer.place(group):
            placed += group
        else:
            assert packer.free_rooms() == before, "a group that does not fit changes nothing"
    assert packer.count == len(placed)
    members = best_fit_rows(placed, num_rows, 40)
    assert sorted(i for row in members for i in row) == list(range(len(placed)))
    free = sorted(40 - sum(placed[i] for i in row) for row in members)
    assert packer.free_rooms() == free, "the rows worked out again are the rows packed"


def reference_best_fit(lengths, num_rows, row_tokens):
    """Best fit as plainly as possible: the row with the least room that holds the piece, ties to
    the lower row id; None for a piece no row holds."""
    free, row_of = [row_tokens] * num_rows, []
    for length in lengths:
        fits = [j for j in range(num_rows) if free[j] >= length]
        j = min(fits, key=lambda j: (free[j], j)) if fits else None
        if j is not None:
            free[j] -= length
        row_of.append(j)
    return row_of


@given(st.lists(st.integers(0, 50), max_size=60), st.integers(1, 6), st.integers(1, 8))
@settings(max_examples=200, deadline=None)
def test_place_each_is_best_fit_and_stops_after_the_misfits(lengths, num_rows, misfits):
    packer = RowPacker(num_rows, 40)
    looked, missed = packer.place_each(lengths, {}, misfits)
    expected = reference_best_fit(lengths, num_rows, 40)
    never = [j for j, row in enumerate(expected) if row is None]
    # a misfit changes nothing, so the reference's misfits are the packer's, up to the limit
    assert missed == never[:misfits]
    assert looked == (never[misfits - 1] + 1 if len(never) >= misfits else len(lengths))
    kept = [length for j, length in enumerate(lengths[:looked]) if j not in missed]
    assert packer.count == len(kept)
    members = best_fit_rows(kept, num_rows, 40)
    want = [
        [i for i, j in enumerate(r for r in expected[:looked] if r is not None) if j == row]
        for row in range(num_rows)
    ]
    assert members == want


def test_place_each_places_marked_positions_as_groups():
    packer = RowPacker(2, 10)
    # position 1 is a sample cut into pieces 10 and 3 (given a length no row holds alone);
    # position 2 is a dropped sample (an empty group): passed over, neither placed nor missed.
    looked, missed = packer.place_each([4, 11, 11, 3, 9], {1: [10, 3], 2: []}, misfits=1)
    assert (looked, missed) == (5, [4])
    assert packer.count == 4  # 4 (row 0), then 10 (row 1) and 3 (row 0), then 3 (row 0)
    assert packer.free_rooms() == [0, 0]


def test_dealing_rows_gives_each_rank_its_rows_and_balances_them():
    members = [[0], [1, 2], [3], [4, 5, 6], [7], [8], [9], [10]]
    costs = np.array([100, 5, 5, 90, 1, 1, 1, 80, 70, 60, 50], dtype=float)
    ranks = deal_rows(members, costs, num_ranks=2, rows_per_rank=4, rows_per_micro_batch=2)
    assert len(ranks) == 2 and all(len(rank) == 4 for rank in ranks)
    flat = sorted(i for rank in ranks for row in rank for i in row)
    assert flat == list(range(11))
    loads = [sum(costs[i] for row in rank for i in row) for rank in ranks]
    assert max(loads) - min(loads) <= 100
