"""Split one global batch over data-parallel ranks and pack each rank's share into rows.

Each rank has ``micro_batches × rows_per_micro_batch`` rows of ``row_tokens`` tokens; row j
belongs to micro-batch ``j // rows_per_micro_batch``. A step waits for its slowest rank, and a
rank's pipeline for its slowest micro-batch, so the goal is the smallest maximum rank cost, then
even micro-batches inside each rank. Three methods:

* ``greedy`` (``greedy.py``) — longest processing time first: samples in decreasing cost go to
  the least-loaded rank with a row that holds them; inside it, to the least-loaded micro-batch
  with room, then to the best-fit row (in numpy batches with many ranks: ``phases.py``). Then
  exchanges with lighter ranks relieve the slowest rank (``exchange.py``).
* ``karmarkar_karp`` (``karmarkar_karp.py``) — the k-way largest differencing method splits the
  costs over ranks; each rank then packs its share like ``greedy``, and what does not fit tries
  the other ranks.
* ``none`` (``placement.py``) — what per-rank loaders give: samples in order fill rank 0, then
  rank 1, … .

``greedy`` and ``karmarkar_karp`` also compute ``none``, and return it instead unless their own
result places at least as many samples at no higher maximum rank cost: balancing never makes a
step worse (fewer samples placed, or a slower slowest rank). ``greedy`` then relieves ``none``'s
slowest ranks by exchanges too (which never raise the maximum nor drop a sample).
A sample that fits nowhere is left over for the caller to carry; nothing is dropped.
Pure and deterministic: ties break on sample index, then rank id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from msd.plan.exchange import exchange
from msd.plan.greedy import pack_greedy
from msd.plan.karmarkar_karp import pack_karmarkar_karp
from msd.plan.placement import Shape, pack_in_order, rank_loads, sum_by_rank

Method = Literal["greedy", "karmarkar_karp", "none"]
METHODS: tuple[Method, ...] = ("greedy", "karmarkar_karp", "none")


@dataclass(frozen=True)
class Assignment:
    """``rows[r][j]`` lists the samples (indices into the input, ascending) in row j of rank r.

    ``leftover`` (sorted) holds the samples placed nowhere; the caller carries them forward.
    """

    rows: tuple[tuple[tuple[int, ...], ...], ...]
    leftover: tuple[int, ...]


def balance(
    lengths: np.ndarray,
    costs: np.ndarray,
    num_ranks: int,
    micro_batches: int,
    rows_per_micro_batch: int,
    row_tokens: int,
    method: Method = "greedy",
) -> Assignment:
    """Assign samples to ``num_ranks`` ranks of ``micro_batches × rows_per_micro_batch`` rows."""
    shape = Shape(num_ranks, micro_batches, rows_per_micro_batch, row_tokens)
    return _assignment(
        shape,
        placement(
            lengths, costs, num_ranks, micro_batches, rows_per_micro_batch, row_tokens, method
        ),
    )


def placement(
    lengths: np.ndarray,
    costs: np.ndarray,
    num_ranks: int,
    micro_batches: int,
    rows_per_micro_batch: int,
    row_tokens: int,
    method: Method = "greedy",
) -> np.ndarray:
    """``balance`` as an array: the global row of each sample (row j of rank r is
    ``r × rows_per_rank + j``), or -1 for a sample left over."""
    _check(lengths, costs, num_ranks, micro_batches, rows_per_micro_batch, row_tokens, method)
    shape = Shape(num_ranks, micro_batches, rows_per_micro_batch, row_tokens)
    lens = np.asarray(lengths, dtype=np.int64)
    cost = np.asarray(costs, dtype=np.float64)
    if method == "none":
        return _in_order(shape, lens)
    if method == "karmarkar_karp":
        return _better(shape, pack_karmarkar_karp(shape, lens, cost), lens, cost)
    balanced = pack_greedy(shape, lens, cost)
    chosen = _better(shape, balanced, lens, cost)
    if chosen is not balanced:  # ``none``'s split: relieve its slowest ranks too
        exchange(shape, lens, cost, chosen)
    return chosen


def hybrid_placement(
    lengths: np.ndarray,
    backbone: np.ndarray,
    encoder: np.ndarray,
    num_ranks: int,
    micro_batches: int,
    rows_per_micro_batch: int,
    row_tokens: int,
    method: Method = "greedy",
) -> np.ndarray:
    """``placement`` by the encoder + backbone cost of each sample (the ``sum`` objective).

    The split balanced on the sum is compared with the one balanced on the backbone alone,
    both judged by the sum: the backbone's is kept only if it places more samples, or as many
    at a lower slowest-rank cost. So weighing the encoder never makes a step slower than
    balancing its tokens alone would (nor than ``none``: ``placement`` guarantees that).
    """
    total = np.asarray(backbone, dtype=np.float64) + np.asarray(encoder, dtype=np.float64)
    shape = Shape(num_ranks, micro_batches, rows_per_micro_batch, row_tokens)
    args = (num_ranks, micro_batches, rows_per_micro_batch, row_tokens, method)
    by_sum = placement(lengths, total, *args)
    if method == "none" or not np.any(encoder):
        return by_sum
    by_backbone = placement(lengths, backbone, *args)
    placed_sum, placed_backbone = np.count_nonzero(by_sum >= 0), np.count_nonzero(by_backbone >= 0)
    if placed_backbone != placed_sum:
        return by_backbone if placed_backbone > placed_sum else by_sum
    worst_sum = float(rank_loads(shape, by_sum, total).max(initial=0.0))
    worst_backbone = float(rank_loads(shape, by_backbone, total).max(initial=0.0))
    return by_backbone if worst_backbone < worst_sum else by_sum


def balance_greedy(
    lengths: np.ndarray, costs: np.ndarray, num_ranks: int, rows_per_rank: int, row_tokens: int
) -> Assignment:
    """``balance`` with one micro-batch of ``rows_per_rank`` rows and the ``greedy`` method."""
    return balance(lengths, costs, num_ranks, 1, rows_per_rank, row_tokens, "greedy")


def rank_costs(assignment: Assignment, costs: np.ndarray) -> np.ndarray:
    """The summed cost of each rank's samples."""
    rank_of = np.full(len(costs), -1, dtype=np.int64)
    for r, rank in enumerate(assignment.rows):
        for row in rank:
            rank_of[list(row)] = r
    return sum_by_rank(rank_of, np.asarray(costs, dtype=np.float64), len(assignment.rows))


def lower_bound(costs: np.ndarray, num_ranks: int) -> float:
    """No split beats ``max(mean rank cost, largest sample)``; 0 for no samples."""
    if len(costs) == 0:
        return 0.0
    return max(float(np.sum(costs)) / num_ranks, float(np.max(costs)))


def _check(
    lengths: np.ndarray,
    costs: np.ndarray,
    num_ranks: int,
    micro_batches: int,
    rows_per_micro_batch: int,
    row_tokens: int,
    method: str,
) -> None:
    if min(num_ranks, micro_batches, rows_per_micro_batch) < 1 or row_tokens < 0:
        raise ValueError("balance needs at least one rank, micro-batch and row, of >= 0 tokens")
    if np.ndim(lengths) != 1 or np.shape(lengths) != np.shape(costs):
        raise ValueError("lengths and costs must be 1-D arrays of the same length")
    if len(lengths) and (np.min(lengths) < 0 or not np.all(np.isfinite(costs))):
        raise ValueError("sample lengths must be >= 0 and costs finite")
    if method not in METHODS:
        raise ValueError(f"unknown balance method {method!r}; choose one of {METHODS}")


def _in_order(shape: Shape, lengths: np.ndarray) -> np.ndarray:
    row_of = pack_in_order(shape, lengths)
    assert row_of is not None  # it stops early only when given costs
    return row_of


def _better(
    shape: Shape, balanced: np.ndarray, lengths: np.ndarray, costs: np.ndarray
) -> np.ndarray:
    """``balanced`` if it places at least as many samples as ``none`` at no higher maximum rank
    cost; otherwise ``none``'s placement.

    When ``balanced`` places every sample, ``none`` is only followed until one of its ranks is
    as slow as ``balanced``'s slowest (usually within the first few ranks).
    """
    worst = float(rank_loads(shape, balanced, costs).max(initial=0.0))
    places_all = bool(np.all(balanced >= 0)) and (not len(costs) or costs.min() >= 0)
    if places_all and pack_in_order(shape, lengths, costs, stop_at=worst) is None:
        return balanced
    unbalanced = _in_order(shape, lengths)
    if np.count_nonzero(balanced >= 0) < np.count_nonzero(unbalanced >= 0):
        return unbalanced
    return (
        balanced if worst <= rank_loads(shape, unbalanced, costs).max(initial=0.0) else unbalanced
    )


def _assignment(shape: Shape, row_of: np.ndarray) -> Assignment:
    """The nested tuples of a placement (samples of a row in index order)."""
    num_rows = shape.ranks * shape.rows_per_rank
    keys = row_of + 1
    if num_rows < 2**16:  # numpy radix-sorts 16-bit keys: several times faster
        keys = keys.astype(np.uint16)
    order = np.argsort(keys, kind="stable")
    starts = np.searchsorted(keys[order], np.arange(num_rows + 2)).tolist()
    flat = order.tolist()
    rows = [tuple(flat[starts[g] : starts[g + 1]]) for g in range(1, num_rows + 1)]
    per_rank = shape.rows_per_rank
    ranks = tuple(zip(*(rows[j::per_rank] for j in range(per_rank)), strict=True))
    return Assignment(ranks, tuple(flat[: starts[1]]))
