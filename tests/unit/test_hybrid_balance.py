"""The ``sum`` objective's split (``hybrid_placement``): an exact partition within the rows'
token budget, deterministic, and never slower (judged by encoder + backbone cost) than the
split balanced on the backbone alone or the in-order split; and in ``plan_step`` it moves
samples between ranks without changing which samples form a step."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from msd.plan.balance import hybrid_placement, placement
from msd.plan.cost import CostModel
from msd.plan.hybrid_cost import HybridCost
from msd.plan.placement import Shape, rank_loads
from msd.plan.schedule import constant
from msd.plan.step import PlannerState, Slot, StreamSpec, plan_step

ROW = 512


@st.composite
def steps(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    """A step's samples: lengths, each one's patches (0: text), and (ranks, micro-batches,
    rows per micro-batch)."""
    ranks = draw(st.integers(1, 6))
    micro, rows = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    n = draw(st.integers(0, ranks * micro * rows * 4))
    lengths = draw(st.lists(st.integers(0, ROW), min_size=n, max_size=n))
    patches = draw(st.lists(st.sampled_from([0, 0, 16, 64, 256, 1024]), min_size=n, max_size=n))
    return np.array(lengths, dtype=np.int64), np.array(patches), (ranks, micro, rows)


def _costs(lengths: np.ndarray, patches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    model = HybridCost(enc_attn=1.0, enc_lin=64.0)
    backbone = CostModel()(lengths)
    encoder = model.encoder(patches, np.arange(len(patches)), len(patches))
    return backbone, encoder


@settings(max_examples=150, deadline=None)
@given(steps(), st.sampled_from(["greedy", "karmarkar_karp"]))
def test_the_sum_split_is_an_exact_partition_and_never_slower(step, method) -> None:
    lengths, patches, (ranks, micro, rows) = step
    backbone, encoder = _costs(lengths, patches)
    total = backbone + encoder
    args = (ranks, micro, rows, ROW, method)
    row_of = hybrid_placement(lengths, backbone, encoder, *args)
    assert np.array_equal(row_of, hybrid_placement(lengths, backbone, encoder, *args))
    shape = Shape(ranks, micro, rows, ROW)
    assert row_of.shape == lengths.shape and np.all(row_of < shape.num_rows)
    per_row = np.bincount(row_of[row_of >= 0], lengths[row_of >= 0], minlength=shape.num_rows)
    assert np.all(per_row <= ROW)  # the token budget of every row
    placed = np.count_nonzero(row_of >= 0)
    worst = rank_loads(shape, row_of, total).max(initial=0.0)
    for other in (
        placement(lengths, backbone, *args),
        placement(lengths, total, *args[:4], "none"),
    ):
        other_placed = np.count_nonzero(other >= 0)
        assert placed >= other_placed
        if placed == other_placed:
            assert worst <= rank_loads(shape, other, total).max(initial=0.0) + 1e-6


def _spec(rows: int) -> StreamSpec:
    return StreamSpec(
        seed=9,
        schedule=constant((0.5, 0.5)),
        num_rows=(500, 500),
        repeat=(True, True),
        dp=4,
        micro_batches=1,
        micro_batch_size=rows // 4,
        seq_len=ROW,
        steps=None,
    )


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_weighing_the_encoder_moves_samples_but_keeps_each_step(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, ROW, (2, 500))
    patches = np.where(np.arange(500) % 3 == 0, rng.integers(16, 1024, 500), 0)  # source 1

    def lookup(source: int, gpos: int) -> int:
        return int(lengths[source][gpos % 500])

    def encoder(sources: np.ndarray, gpos: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        p = np.where(sources == 1, patches[gpos % 500], 0).astype(np.float64)
        return p * p + 64 * p

    spec = _spec(8)
    plain = plan_step(spec, PlannerState.initial(2), lookup)
    hybrid = plan_step(spec, PlannerState.initial(2), lookup, encoder)
    assert isinstance(plain, tuple) and isinstance(hybrid, tuple)
    (a, after_a), (b, after_b) = plain, hybrid
    assert after_a == after_b  # the same samples taken, the same carried
    assert _pieces(a.slots) == _pieces(b.slots)


def _pieces(slots: list[Slot]) -> Counter[tuple[int, int, int]]:
    return Counter((s.source, s.gpos, s.offset) for s in slots)


# -- the patch budget (``balance.max_patches``) --------------------------------------------------


def _budget_spec(dp: int, rows_per_rank: int, mbs: int, budget: int) -> StreamSpec:
    return StreamSpec(
        seed=5,
        schedule=constant((0.5, 0.5)),
        num_rows=(400, 400),
        repeat=(True, True),
        dp=dp,
        micro_batches=rows_per_rank // mbs,
        micro_batch_size=mbs,
        seq_len=ROW,
        steps=None,
        max_patches=budget,
    )


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(1, 8, 1), (2, 4, 2), (4, 2, 2), (8, 1, 1)]))
@example(5874, (1, 8, 1))  # the balancer leaves pieces over: the packed rows are used
def test_no_micro_batch_holds_more_patches_than_the_budget_whatever_the_dp_size(seed, shape):
    """Rows of 512 tokens, 8 global rows; source 1's samples hold 0-600 patches. Every
    micro-batch of every rank stays within 900 patches and 512 tokens a row; and the global
    batch is the same whether 1, 2, 4 or 8 ranks share it (the budget binds per micro-batch
    of the global batch, which DP does not change)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, ROW, (2, 400))
    patches = np.where(rng.random(400) < 0.6, rng.integers(0, 600, 400), 0)
    budget = 900

    def lookup(source: int, gpos: int) -> int:
        return int(lengths[source][gpos % 400])

    def count(sources: np.ndarray, gpos: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        whole = offsets == 0
        return np.where((sources == 1) & whole, patches[gpos % 400], 0)

    def plan(dp: int, rows_per_rank: int, mbs: int, state: PlannerState) -> tuple:
        result = plan_step(_budget_spec(dp, rows_per_rank, mbs, budget), state, lookup, None, count)
        assert isinstance(result, tuple)
        return result

    state = PlannerState.initial(2)
    dp, per_rank, mbs = shape
    for _ in range(3):
        ours, after = plan(dp, per_rank, mbs, state)
        single, single_after = plan(1, 8, mbs, state)
        assert after == single_after and _pieces(ours.slots) == _pieces(single.slots)
        again, _ = plan(dp, per_rank, mbs, state)
        assert again.pieces == ours.pieces  # deterministic
        for rank in ours.rows:
            for m in range(0, per_rank, mbs):
                micro = [s for row in rank[m : m + mbs] for s in row]
                assert sum(int(count(*_cols(s))[0]) for s in micro) <= budget
                assert all(sum(s.padded for s in row) <= ROW for row in rank[m : m + mbs])
        state = after


def _cols(slot: Slot) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.array([slot.source]), np.array([slot.gpos]), np.array([slot.offset])
