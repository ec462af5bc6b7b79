"""What the Planner knows of the images of samples reported and not routed yet: per sample, its
encoder cost, each piece's patches, and how many images it keeps and left out (``Meta``). Text
samples have no entry, so a job without images pays nothing here."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from msd.wire.protocol import Meta

# The vision encoder's cost of a sample's images and videos: their patch counts, and their
# temporal patches (None: images only).
EncoderCost = Callable[[np.ndarray, np.ndarray | None], float]


class Images(NamedTuple):
    cost: float  # the vision encoder's, of all the sample's images
    kept: int
    skipped: int
    pieces: np.ndarray  # patches of each piece (piece k: from token k × seq_len on)


class ImageBook:
    def __init__(self, sources: int, encoder: EncoderCost, seq_len: int) -> None:
        self.by_source: dict[int, dict[int, Images]] = {i: {} for i in range(sources)}
        self.encoder, self.seq_len = encoder, seq_len

    def add(self, msg: Meta, offsets: Iterable[int]) -> None:
        """The images of the samples at these offsets of ``msg`` (those planning keeps)."""
        if not (msg.images or msg.skipped):
            return
        book = self.by_source[msg.source]
        patches = np.array(msg.patches, dtype=np.int64)
        rows = np.array(msg.image_rows or [0] * len(patches), dtype=np.int64)
        frames = np.array(msg.frames, dtype=np.int64) if msg.frames else None
        first = np.cumsum((0, *msg.images)).tolist() if msg.images else []
        for offset in offsets:
            kept = msg.images[offset] if msg.images else 0
            skipped = msg.skipped[offset] if msg.skipped else 0
            if not (kept or skipped):
                continue
            own = patches[first[offset] : first[offset + 1]] if kept else patches[:0]
            groups = None if frames is None else frames[first[offset] : first[offset + 1]]
            cost = self.encoder(own, groups) if kept else 0.0
            pieces = np.bincount(rows[first[offset] : first[offset + 1]], own) if kept else own
            book[msg.gpos_start + offset] = Images(cost, kept, skipped, pieces)

    def get(self, source: int, gpos: int) -> Images | None:
        return self.by_source[source].get(gpos)

    def forget(self, source: int, gpos: int) -> None:
        self.by_source[source].pop(gpos, None)

    def any(self) -> bool:
        return any(self.by_source.values())

    def encoder_costs(
        self, sources: np.ndarray, gpos: np.ndarray, lengths: np.ndarray, full: np.ndarray
    ) -> np.ndarray:
        """The encoder's cost of each piece ``lengths`` long of a sample ``full`` long: the
        sample's, shared out over its pieces by length; 0 for samples without images."""
        costs = []
        for s, g, n, total in zip(
            sources.tolist(), gpos.tolist(), lengths.tolist(), full.tolist(), strict=True
        ):
            entry = self.by_source[s].get(g)
            costs.append(0.0 if entry is None else entry.cost * n / max(1, total))
        return np.array(costs, dtype=np.float64)

    def patch_counts(
        self, sources: np.ndarray, gpos: np.ndarray, offsets: np.ndarray
    ) -> np.ndarray:
        """The image patches of each piece starting at ``offsets`` of a (source, gpos) sample."""
        counts = []
        for s, g, offset in zip(sources.tolist(), gpos.tolist(), offsets.tolist(), strict=True):
            entry = self.by_source[s].get(g)
            k = offset // self.seq_len
            counts.append(0 if entry is None or k >= len(entry.pieces) else int(entry.pieces[k]))
        return np.array(counts, dtype=np.int64)
