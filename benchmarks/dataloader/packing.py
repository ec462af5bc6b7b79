"""First-fit packing of one rank's micro-batch, as a per-rank DataLoader does on its own.

A sample longer than ``seq_len`` becomes ``seq_len`` pieces (msd's default ``split``), each its
own sequence. Items go first fit into ``rows`` rows of ``seq_len`` tokens; one that does not fit
is carried, first, into the next micro-batch, and the micro-batch closes after ``patience`` such
misfits (msd closes a global step after ``min(rows, 8)`` misfits), so rows fill until the next
sample does not fit. Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from msd.batch.pack import Piece


@dataclass(frozen=True)
class Item:
    """A sample, or one piece of a long sample starting at ``offset``."""

    source: int
    sample_id: int
    tokens: np.ndarray
    offset: int = 0


def split_long(source: int, sample_id: int, tokens: np.ndarray, seq_len: int) -> list[Item]:
    """The sample as items of at most ``seq_len`` tokens, in order."""
    if len(tokens) <= seq_len:
        return [Item(source, sample_id, tokens)]
    return [
        Item(source, sample_id, tokens[at : at + seq_len], at)
        for at in range(0, len(tokens), seq_len)
    ]


def patience_of(global_rows: int) -> int:
    """Misfits after which a micro-batch closes: msd's ``carry_limit`` for the same rows."""
    return max(1, min(global_rows, 8))


class MicroBatchPacker:
    """Packs micro-batches of ``rows`` rows from a stream of items; keeps the misfits."""

    def __init__(self, rows: int, seq_len: int, patience: int) -> None:
        self.rows = rows
        self.seq_len = seq_len
        self.patience = patience
        self.carry: deque[Item] = deque()

    def next_rows(self, items: Iterator[Item]) -> list[list[Piece]]:
        """The next micro-batch's rows; raises StopIteration only if ``items`` ends first."""
        rows: list[list[Piece]] = [[] for _ in range(self.rows)]
        free = [self.seq_len] * self.rows
        pending, self.carry = self.carry, deque()
        misfits = 0
        while misfits < self.patience and sum(free) > 0:
            item = pending.popleft() if pending else next(items)
            row = _first_fit(free, len(item.tokens))
            if row is None:
                self.carry.append(item)
                misfits += 1
                continue
            rows[row].append(Piece(item.source, item.sample_id, item.tokens, offset=item.offset))
            free[row] -= len(item.tokens)
        self.carry.extend(pending)
        return rows


def _first_fit(free: list[int], length: int) -> int | None:
    for row, room in enumerate(free):
        if room >= length:
            return row
    return None


def segment_lengths(rows: list[list[Piece]], seq_len: int) -> list[int]:
    """Lengths of the sequences ``cu_seqlens`` marks: every piece and each row's padding run."""
    lengths = []
    for row in rows:
        used = [len(p.tokens) for p in row if len(p.tokens)]
        lengths += used
        if sum(used) < seq_len:
            lengths.append(seq_len - sum(used))
    return lengths
