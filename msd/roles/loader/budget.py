"""How much a shard may hold unrouted, and whether it reads ahead now (``ReadAhead``).

Memory is bounded per source, not per rank: a shard reads ahead only while it holds fewer
unrouted tokens than its share of ``buffer_tokens`` (the source's largest share of the mix)
and, for an image source, fewer bytes of images than its share of ``buffer_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from msd.plan.schedule import peak_shares, schedule_of
from msd.recipe.schema import Recipe
from msd.roles.loader.counts import ReadCounts

_peaks: list[tuple[Recipe, tuple[float, ...]]] = []  # the last recipe's, computed once


def peak_share(recipe: Recipe, source: int) -> float:
    """``source``'s largest share of the mix: worked out once for all of a recipe's sources (a
    loader serving thousands asks once for each, and each answer looks at every source)."""
    if not _peaks or _peaks[0][0] is not recipe:
        _peaks[:] = [(recipe, peak_shares(schedule_of(recipe)))]
    return _peaks[0][1][source]


def shard_budget(recipe: Recipe, source: int, loaders: int) -> int:
    """Unrouted tokens one of ``loaders`` shards of ``source`` may hold: the read-ahead shared
    out by the source's largest share of the mix, over its shards; at least one row."""
    peak = peak_share(recipe, source)
    return max(recipe.seq_len, int(recipe.loader_buffer_tokens * peak / loaders))


def shard_bytes(recipe: Recipe, source: int, loaders: int) -> int:
    """Bytes of images one of ``loaders`` shards of ``source`` may hold unrouted:
    ``buffer_bytes`` shared out like the tokens (a shard holding nothing still reads: at least
    one sample is held whatever the share)."""
    peak = peak_share(recipe, source)
    return max(1, int(recipe.loader_buffer_bytes * peak / loaders))


def held_cost(tokens: np.ndarray) -> int:
    """What a held sample counts against the read-ahead: its tokens, and at least 1, so that
    samples holding none (null or empty text) still fill it and reading stops."""
    return max(1, len(tokens))


@dataclass
class ReadAhead:
    """A shard's read-ahead: its share of the mix's (``mix_tokens``, ``mix_bytes``), what it
    holds against them, and whether it is reading (``filling``). ``siblings``: other shards
    read the same source; ``block_rows``: rows of the source's largest block."""

    mix_tokens: int
    mix_bytes: int
    block_rows: int
    siblings: bool
    images: bool  # an image source: the bytes of its images count too
    held_tokens: int = 0
    held_bytes: int = 0  # of images (patches, or bytes not decoded yet)
    filling: bool = True

    def tokens(self, counts: ReadCounts) -> int:
        """Tokens this shard may hold unrouted: its share of the read-ahead; and, when it has
        sibling shards, two blocks' worth: the trainers consume a source visit by visit, so
        each shard must hold the visit being consumed and read its next one whole while the
        others' visits are consumed, or the source is only ever as fast as one loader."""
        if not self.siblings or not counts.samples:
            return self.mix_tokens
        block_tokens = int(self.block_rows * counts.tokens / counts.samples)
        return max(self.mix_tokens, 2 * block_tokens)

    def bytes(self, counts: ReadCounts) -> int:
        """Bytes of patches this shard may hold unrouted: like ``tokens``, its share of the
        read-ahead, or two blocks' worth when it has sibling shards."""
        if not self.siblings or not counts.samples:
            return self.mix_bytes
        block_bytes = int(self.block_rows * counts.image_bytes / counts.samples)
        return max(self.mix_bytes, 2 * block_bytes)

    def fill(self, counts: ReadCounts) -> float:
        """How full the read-ahead is (the emptiest hungry shard reads first)."""
        if not self.images:
            return self.held_tokens / self.tokens(counts)
        return max(self.held_tokens / self.tokens(counts), self.held_bytes / self.bytes(counts))

    def hungry(self, counts: ReadCounts, at_end: Callable[[], bool]) -> bool:
        """Reading ahead: from below half the budget up to all of it (so a shard reads in
        chunks, not a sample each time one is routed); not once there is nothing more to read
        (``at_end()``)."""
        fill = self.fill(counts)
        if fill >= 1 or at_end():
            self.filling = False
        elif 2 * fill < 1:
            self.filling = True
        return self.filling
