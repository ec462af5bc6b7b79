"""``karmarkar_karp``: the k-way largest differencing method splits the costs over ranks; each
rank then packs its share like ``greedy`` does inside a rank, and what does not fit goes, largest
first, to the least-loaded other rank with room (or is left over).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from typing import TypeAlias

import numpy as np

from msd.plan.placement import Packer, Shape, fill_least_loaded, sum_by_rank


def pack_karmarkar_karp(shape: Shape, lengths: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """``karmarkar_karp``: split costs over ranks, pack each rank, spill what does not fit."""
    order = np.argsort(-costs, kind="stable").tolist()
    p = Packer(shape, lengths.tolist(), costs.tolist())
    target = [-1] * len(order)
    for rank, samples in enumerate(_largest_differencing(p.costs, order, shape.ranks)):
        for i in samples:
            target[i] = rank
    spill = []  # in decreasing cost, like ``order``
    for i in order:
        row = p.pick_row(target[i], p.lengths[i])
        if row < 0:
            spill.append(i)
        else:
            p.put(i, row)
    rank_of = np.asarray(p.row_of, dtype=np.int64)
    rank_of = np.where(rank_of >= 0, rank_of // shape.rows_per_rank, -1)
    heap = [(load, r) for r, load in enumerate(sum_by_rank(rank_of, costs, shape.ranks).tolist())]
    heapq.heapify(heap)
    fill_least_loaded(p, spill, heap)
    return np.asarray(p.row_of, dtype=np.int64)


# A subset of a partial partition: a sample index, or the union of two subsets.
_Node: TypeAlias = "int | tuple[_Node, _Node]"


class _Partial:
    """A partial k-way partition: its non-empty subsets, largest sum first.

    ``keys`` are the negated sums (ascending), so the smallest subset is at the end.
    """

    __slots__ = ("keys", "nodes")

    def __init__(self, keys: list[float], nodes: list[_Node]) -> None:
        self.keys, self.nodes = keys, nodes

    def spread(self, k: int) -> float:
        """Largest minus smallest subset sum (empty subsets count as 0)."""
        smallest = -self.keys[-1] if len(self.keys) == k else 0.0
        return -self.keys[0] - smallest


def _largest_differencing(costs: list[float], order: list[int], k: int) -> list[list[int]]:
    """Karmarkar–Karp for k subsets: repeatedly combine the two partial partitions that differ
    most, largest subset with smallest. Single samples wait in ``order`` (decreasing cost), so
    only combined partitions go through the heap; ties break on creation order.
    """
    n = len(order)
    heap: list[tuple[float, int, _Partial]] = []
    head = 0
    for created in itertools.count(n):
        if (n - head) + len(heap) <= 1:
            break
        first, head = _pop_widest(heap, costs, order, head)
        second, head = _pop_widest(heap, costs, order, head)
        merged = _combine(_partial(first, costs), second, costs, k)
        heapq.heappush(heap, (-merged.spread(k), created, merged))
    groups: list[list[int]] = [[] for _ in range(k)]
    last = heap[0][2] if heap else _partial(order[0], costs) if n else None
    for rank, node in enumerate(last.nodes if last else []):
        groups[rank] = _flatten(node)
    return groups


def _pop_widest(
    heap: list[tuple[float, int, _Partial]], costs: list[float], order: list[int], head: int
) -> tuple[_Partial | int, int]:
    """The partial partition with the largest spread: the heap top, or the next single sample
    (returned as its index)."""
    if head < len(order):
        i = order[head]
        if not heap or (-costs[i], head) < heap[0][:2]:
            return i, head + 1
    return heapq.heappop(heap)[2], head


def _partial(part: _Partial | int, costs: list[float]) -> _Partial:
    return _Partial([-costs[part]], [part]) if isinstance(part, int) else part


def _combine(a: _Partial, b: _Partial | int, costs: list[float], k: int) -> _Partial:
    """Pair a's subsets, largest first, with b's, smallest first (empty subsets included)."""
    if isinstance(b, int):  # one sample: the common case, kept fast
        key: float = -costs[b]
        node: _Node = b
        if len(a.keys) == k:  # it joins the smallest subset
            key, node = key + a.keys.pop(), (a.nodes.pop(), b)
        at = bisect.bisect_right(a.keys, key)
        a.keys.insert(at, key)
        a.nodes.insert(at, node)
        return a
    if len(a.keys) < len(b.keys):
        a, b = b, a
    overlap = max(0, len(a.keys) + len(b.keys) - k)
    alone = len(b.keys) - overlap  # b's largest subsets meet a's empty ones
    added = [(b.keys[t], b.nodes[t]) for t in range(alone)]
    for t in range(alone, len(b.keys)):
        added.append((a.keys.pop() + b.keys[t], (a.nodes.pop(), b.nodes[t])))
    if len(added) > 32:  # many: re-sort once rather than insert one by one
        merged = sorted([*zip(a.keys, a.nodes, strict=True), *added], key=lambda e: e[0])
        return _Partial([e[0] for e in merged], [e[1] for e in merged])
    for key, node in added:
        at = bisect.bisect_right(a.keys, key)
        a.keys.insert(at, key)
        a.nodes.insert(at, node)
    return a


def _flatten(node: _Node) -> list[int]:
    samples, stack = [], [node]
    while stack:
        top = stack.pop()
        if isinstance(top, int):
            samples.append(top)
        else:
            stack.extend(top)
    return samples
