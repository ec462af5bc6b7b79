import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msd.batch.cp_slice import cp_slice
from msd.batch.pack import Piece, pack_rows
from msd.plan.topology import VISION, Coords, Topology

sizes = st.integers(1, 4)


@given(sizes, sizes, sizes, sizes, st.permutations(["tp", "cp", "dp", "pp"]))
def test_coords_and_rank_are_inverse_bijections(dp, pp, cp, tp, order):
    topo = Topology(dp, pp, cp, tp, tuple(order))
    seen = {topo.coords(r) for r in range(topo.world_size)}
    assert len(seen) == topo.world_size
    assert all(topo.rank(topo.coords(r)) == r for r in range(topo.world_size))


def test_megatron_order_puts_tp_fastest_and_pp_slowest():
    topo = Topology(dp=2, pp=2, cp=2, tp=2)
    assert topo.coords(0) == Coords(dp=0, pp=0, cp=0, tp=0)
    assert topo.coords(1) == Coords(dp=0, pp=0, cp=0, tp=1)
    assert topo.coords(2) == Coords(dp=0, pp=0, cp=1, tp=0)
    assert topo.coords(4) == Coords(dp=1, pp=0, cp=0, tp=0)
    assert topo.coords(8) == Coords(dp=0, pp=1, cp=0, tp=0)
    with pytest.raises(ValueError):
        topo.coords(16)


def test_pipeline_stages_get_only_what_they_use():
    topo = Topology(dp=1, pp=3)
    first, middle, last = (topo.tensors(Coords(0, s, 0, 0)) for s in range(3))
    assert "input_ids" in first and "labels" not in first
    assert not {"input_ids", "labels", "position_ids"} & set(middle)
    assert "labels" in last and "input_ids" not in last and "cu_seqlens" in middle
    single = Topology().tensors(Coords(0, 0, 0, 0))
    assert {"input_ids", "labels", "position_ids", "cu_seqlens"} <= set(single)


def test_only_the_first_stage_gets_the_images_and_cp_ranks_get_them_whole() -> None:
    topo = Topology(dp=1, pp=3, cp=2, vision=True)
    first, middle, last = (topo.tensors(Coords(0, s, 0, 0)) for s in range(3))
    assert set(VISION) <= set(first)
    assert not set(VISION) & (set(middle) | set(last))
    assert not set(VISION) & set(Topology(pp=2).tensors(Coords(0, 0, 0, 0)))  # text jobs
    rows = [[Piece(0, 1, np.arange(1, 9, dtype=np.int32))]]
    images = pack_rows(rows, 8, image_token_id=5, patch_values=4)
    images["pixel_values"] = np.arange(8, dtype=np.uint8).reshape(2, 4)
    slices = [cp_slice(images, 2, r) for r in range(2)]
    for part in slices:  # each CP rank: its half of the tokens, all of the group's pixels
        assert part["input_ids"].size == 4
        assert np.array_equal(part["pixel_values"], images["pixel_values"])
