"""The samples loaders reported and the Planner has not routed yet: the length, sample id and
loader of each (source, position), in arrays of ``BLOCK`` positions (only blocks that hold
something exist, so memory follows what is reported, wherever it lies). Looked up and updated
a chunk at a time: a step of tens of thousands of samples costs a few numpy calls per block
drawn, not a dict lookup each.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

ABSENT = -1  # the length of a position not reported (or routed already)
SHIFT = 10
BLOCK = 1 << SHIFT
FEW = 256  # draws looked up one by one (fewer than this, numpy's fixed costs dominate)


class _Block:
    """Positions ``b × BLOCK ...`` of one source: ``held`` of them reported."""

    def __init__(self) -> None:
        self.length = np.full(BLOCK, ABSENT, dtype=np.int64)
        self.sample_id = np.zeros(BLOCK, dtype=np.uint64)
        self.loader = np.zeros(BLOCK, dtype=np.int32)
        self.held = 0


Group = tuple[int, int, np.ndarray, np.ndarray]  # source, block, entries, offsets in the block


class Reported:
    """State: ``blocks`` ((source, block) → ``_Block``), ``loaders`` (the identities that
    reported, by number: ``numbers``) and ``count`` (positions held)."""

    def __init__(self) -> None:
        self.blocks: dict[tuple[int, int], _Block] = {}
        self.loaders: list[bytes] = []
        self.numbers: dict[bytes, int] = {}
        self.count = 0

    def number(self, loader: bytes) -> int:
        if loader not in self.numbers:
            self.numbers[loader] = len(self.loaders)
            self.loaders.append(loader)
        return self.numbers[loader]

    def add(
        self, source: int, gpos: np.ndarray, lengths: np.ndarray, ids: np.ndarray, loader: bytes
    ) -> None:
        """Hold these positions of ``source`` (lengths, sample ids), reported by ``loader``."""
        number = self.number(loader)
        for _, b, which, offsets in _groups(np.full(len(gpos), source), gpos):
            block = self.blocks.get((source, b))
            if block is None:
                block = self.blocks[(source, b)] = _Block()
            new = int(np.count_nonzero(block.length[offsets] == ABSENT))
            block.held += new
            self.count += new
            block.length[offsets] = lengths[which]
            block.sample_id[offsets] = ids[which]
            block.loader[offsets] = number

    def __call__(self, source: int, gpos: int) -> int | None:
        """The length of sample ``gpos`` of ``source``, if held (``msd.plan.step.Lookup``)."""
        block = self.blocks.get((source, gpos >> SHIFT))
        n = ABSENT if block is None else int(block.length[gpos & (BLOCK - 1)])
        return None if n == ABSENT else n

    def many(self, sources: np.ndarray, gpos: np.ndarray) -> np.ndarray:
        """The length of each (source, gpos); ``ABSENT`` where not held."""
        if len(gpos) < FEW:  # grouping costs more than it saves
            each = map(self, sources.tolist(), gpos.tolist())
            return np.array([ABSENT if n is None else n for n in each], dtype=np.int64)
        found = np.full(len(gpos), ABSENT, dtype=np.int64)
        for source, b, which, offsets in _groups(sources, gpos):
            block = self.blocks.get((source, b))
            if block is not None:
                found[which] = block.length[offsets]
        return found

    def held(self, sources: np.ndarray, gpos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sample id and loader number of each (source, gpos), all held."""
        ids = np.zeros(len(gpos), dtype=np.uint64)
        loaders = np.zeros(len(gpos), dtype=np.int64)
        for source, b, which, offsets in _groups(sources, gpos):
            block = self.blocks.get((source, b))
            if block is None or np.any(block.length[offsets] == ABSENT):
                raise KeyError(f"a sample of source {source} that no loader holds")
            ids[which], loaders[which] = block.sample_id[offsets], block.loader[offsets]
        return ids, loaders

    def remove(self, sources: np.ndarray, gpos: np.ndarray) -> None:
        """Forget these positions (each held, once)."""
        for source, b, _, offsets in _groups(sources, gpos):
            self._clear(source, b, offsets)

    def remove_loader(self, source: int, loader: bytes) -> list[int]:
        """Forget what ``loader`` holds of ``source``; the positions it held."""
        number, gone = self.numbers.get(loader), []
        for s, b in [key for key in self.blocks if key[0] == source]:
            block = self.blocks[(s, b)]
            offsets = np.flatnonzero((block.loader == number) & (block.length != ABSENT))
            gone += (offsets + (b << SHIFT)).tolist()
            self._clear(s, b, offsets)
        return gone

    def _clear(self, source: int, b: int, offsets: np.ndarray) -> None:
        block = self.blocks[(source, b)]
        block.length[offsets] = ABSENT
        block.held -= len(offsets)
        self.count -= len(offsets)
        if not block.held:
            del self.blocks[(source, b)]


def _groups(sources: np.ndarray, gpos: np.ndarray) -> Iterator[Group]:
    """The entries of each (source, block) present: only those drawn are visited."""
    if not len(gpos):
        return
    block = gpos >> SHIFT
    offsets = gpos & (BLOCK - 1)
    order = np.lexsort((block, sources))
    s, b = sources[order], block[order]
    cuts = np.flatnonzero((s[1:] != s[:-1]) | (b[1:] != b[:-1])) + 1
    for part in np.split(order, cuts):
        yield int(sources[part[0]]), int(block[part[0]]), part, offsets[part]
