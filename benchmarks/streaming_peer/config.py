"""What a Streaming rank needs (written as JSON for the rank processes) and how it is sized.

``batch_size`` is Streaming's per-rank batch in samples, which it uses to lay out each epoch's
partition (and, by default, how far ahead to download: ``predownload = 8·batch_size``). A packed
micro-batch takes a varying number of samples, so it is set to the number an average
micro-batch takes: ``rows·seq_len`` over the mean sample length of the (per-sample, equal) mix.

``epoch_size`` is set so that one Streaming epoch outlasts the run: at an epoch's end each
rank's DataLoader stops, and Streaming's next ``__iter__`` waits (a node-wide barrier) for every
worker of every rank, which ranks packing different numbers of samples per step reach at
different steps. Users packing on the fly avoid that the same way (or pack offline). Past the
data's own samples Streaming repeats each stream within the epoch, as ``repeat: true`` does
for msd.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.dataloader.data import BenchSource, mean_tokens, shape_of

EPOCH_MARGIN = 3.0  # an epoch holds this many times the samples the run is expected to take
EXTRA_STEPS = 50  # and room for prefetching and packing misfits


@dataclass(frozen=True)
class PeerConfig:
    """One Streaming rank's dataset and loader."""

    remotes: tuple[str, ...]
    locals: tuple[str, ...]
    proportions: tuple[float, ...]
    seq_len: int
    rows: int
    patience: int
    batch_size: int
    epoch_size: int
    workers: int = 2
    steps: int = 100
    shuffle_seed: int = 9176  # Streaming's default
    sharing_strategy: str = "file_descriptor"  # torch's default, as the baseline's

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(path: Path) -> PeerConfig:
        raw = json.loads(path.read_text())
        for key in ("remotes", "locals", "proportions"):
            raw[key] = tuple(raw[key])
        return PeerConfig(**raw)


def mean_sample_tokens(sources: tuple[BenchSource, ...]) -> float:
    """Mean length of a sample drawn by weight (per sample, as both systems draw)."""
    weights = [s.weight for s in sources]
    means = [mean_tokens(shape_of(i)) for i in range(len(sources))]
    return sum(w * m for w, m in zip(weights, means, strict=True)) / sum(weights)


def samples_per_micro_batch(sources: tuple[BenchSource, ...], seq_len: int, rows: int) -> int:
    return max(1, round(rows * seq_len / mean_sample_tokens(sources)))


def epoch_samples(
    sources: tuple[BenchSource, ...], seq_len: int, rows: int, ranks: int, steps: int
) -> int:
    """Samples in one Streaming epoch: at least the data's, and ``EPOCH_MARGIN`` times what
    ``steps`` (plus ``EXTRA_STEPS``) of ``ranks`` micro-batches take."""
    data = sum(s.rows_per_row_group * s.num_row_groups for s in sources)
    per_step = ranks * rows * seq_len / mean_sample_tokens(sources)
    return max(data, math.ceil(EPOCH_MARGIN * (steps + EXTRA_STEPS) * per_step))
