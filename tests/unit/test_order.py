import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from msd.plan.order import EpochOrder, make_blocks


@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(1, 4), st.integers(0, 5))
@settings(max_examples=60, deadline=None)
def test_an_epoch_is_a_permutation_of_all_rows(rg_rows, block_rgs, epoch):
    blocks = make_blocks(rg_rows, block_rgs)
    order = EpochOrder(blocks, seed=7, source_key=123, epoch=epoch)
    rows = np.concatenate([order.rows_of_visit(k) for k in range(len(blocks))])
    assert sorted(rows.tolist()) == list(range(sum(rg_rows)))
    assert order.num_rows == sum(rg_rows)


def test_row_at_agrees_with_visits_and_blocks_stay_contiguous():
    blocks = make_blocks([10, 7, 3, 12], 2)
    order = EpochOrder(blocks, seed=1, source_key=99, epoch=0)
    flat = np.concatenate([order.rows_of_visit(k) for k in range(len(blocks))])
    assert [order.row_at(p) for p in range(order.num_rows)] == flat.tolist()
    first = order.rows_of_visit(0)
    block = blocks[int(order.block_perm[0])]
    assert set(first.tolist()) == set(range(block.first_row, block.first_row + block.num_rows))


def test_epochs_and_seeds_change_the_order_deterministically():
    blocks = make_blocks([50] * 8, 1)
    a = [EpochOrder(blocks, 1, 5, 0).row_at(p) for p in range(400)]
    assert a == [EpochOrder(blocks, 1, 5, 0).row_at(p) for p in range(400)]
    assert a != [EpochOrder(blocks, 1, 5, 1).row_at(p) for p in range(400)]
    assert a != [EpochOrder(blocks, 2, 5, 0).row_at(p) for p in range(400)]
