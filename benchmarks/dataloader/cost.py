"""The simulated compute of a step and its calibration.

A rank's step costs ``attn·Σlen² + lin·Σlen`` over the sequences its ``cu_seqlens`` marks
(padding runs included: a varlen kernel and the linear layers process them too) and sleeps
``cost × seconds_per_cost``. ``seconds_per_cost`` is set per point so that an average rank's
step computes for ``target_s`` (100 ms): it is estimated from the sources' length distributions
packed the way the baseline packs them, so it depends on the data, never on a measured run.
The msd recipe's ``cost`` uses the same ``attn`` and ``lin``, so msd balances what is slept.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from benchmarks.dataloader.data import BenchSource
from benchmarks.dataloader.packing import Item, MicroBatchPacker, segment_lengths, split_long
from msd.synth.text import DEFAULT_SOURCES, sample_lengths


@dataclass(frozen=True)
class CostModel:
    """The backbone's ``attn·len² + lin·len`` per sequence; with images (the VLM benchmark),
    the vision encoder's ``enc_attn·p² + enc_lin·p`` per image of ``p`` patches (msd's
    ``cost.enc_attn``/``enc_lin``; unused by text batches)."""

    attn: float = 1.0
    lin: float = 256.0
    enc_attn: float = 1.0
    enc_lin: float = 256.0

    def cost(self, lengths: npt.ArrayLike) -> float:
        lens = np.asarray(lengths, dtype=np.float64)
        return float(self.attn * np.square(lens).sum() + self.lin * lens.sum())

    def encoder(self, patches: npt.ArrayLike, groups: npt.ArrayLike | None = None) -> float:
        """The encoder's cost of images of these patch counts (attention per image); with
        ``groups``, of videos whose patches attend within each of that many temporal patches
        (``enc_attn·p²/t + enc_lin·p``, as msd's balance weighs a video)."""
        p = np.asarray(patches, dtype=np.float64)
        t = 1.0 if groups is None else np.asarray(groups, dtype=np.float64)
        return float(self.enc_attn * (np.square(p) / t).sum() + self.enc_lin * p.sum())


def sequence_lengths(cu_seqlens: npt.ArrayLike) -> npt.NDArray[np.int64]:
    bounds: npt.NDArray[np.int64] = np.asarray(cu_seqlens, dtype=np.int64)
    return bounds[1:] - bounds[:-1]


def mean_rank_cost(
    sources: Sequence[BenchSource],
    seq_len: int,
    rows: int,
    patience: int,
    model: CostModel,
    batches: int = 400,
    seed: int = 0,
) -> float:
    """Mean cost of a micro-batch packed from the sources' length distributions."""
    packer = MicroBatchPacker(rows, seq_len, patience)
    items = _length_items(sources, seq_len, np.random.default_rng(seed))
    costs = [model.cost(segment_lengths(packer.next_rows(items), seq_len)) for _ in range(batches)]
    return float(np.mean(costs))


def _length_items(
    sources: Sequence[BenchSource], seq_len: int, rng: np.random.Generator
) -> Iterator[Item]:
    """Items with the right lengths (zero tokens): draws by weight, lengths by source shape."""
    by_median = {shape.median_tokens: sample_lengths(shape) for shape in DEFAULT_SOURCES}
    weights = np.array([s.weight for s in sources], dtype=np.float64)
    probabilities = weights / weights.sum()
    zeros = np.zeros(int(max(p.max() for p in by_median.values())), dtype=np.int32)
    while True:
        s = int(rng.choice(len(sources), p=probabilities))
        pool = by_median[sources[s].median_tokens]
        length = int(pool[rng.integers(len(pool))])
        yield from split_long(s, 0, zeros[:length], seq_len)


def seconds_per_cost(target_s: float, mean_cost: float) -> float:
    return target_s / max(mean_cost, 1e-12)
