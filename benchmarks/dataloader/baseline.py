"""The paper's data-parallel baseline: per-rank DataLoaders whose every worker reads every source.

Each rank runs ``DataLoader(MixedParquetStream(...), num_workers=W, batch_size=None,
prefetch_factor=2, persistent_workers=True)``. Every worker of every rank:

* opens every source (one ``pyarrow.parquet.ParquetFile`` per file, read as msd's loaders read:
  no pre-buffering, the C library's allocator, freed memory returned after each read) and keeps
  the current decoded row group of each (only the ``text`` column), rows in a shuffled order;
* reads the row groups of its shard only: of a source's endless stream of row groups
  (epoch ``e``, row group ``g`` is number ``e·G + g``), worker ``k`` of ``N = R·W`` reads numbers
  ``k, k+N, k+2N, ...``, so no two workers ever read the same (epoch, row group) and together
  they read a source as often as one reader would;
* draws each next sample's source by weight with its own seeded generator, tokenizes it with
  msd's ``bytes`` transform, and packs its rank's micro-batch first fit (``packing.py``);
* collates with ``msd.batch.pack.pack_rows``, so the tensors are the ones msd delivers.

At start a worker reads the first row group of every source (as it will hold them all soon
after): its memory is then at its steady level, and that reading falls in start-up, not in the
measured steps. Nothing balances cost across ranks: that is the point of the comparison.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset, get_worker_info

from benchmarks.dataloader.packing import Item, MicroBatchPacker, split_long
from msd.batch.pack import pack_rows
from msd.recipe.schema import Transform
from msd.sources.formats.parquet import READ_BUFFER_BYTES
from msd.sources.transforms import Tokenize, make_transform

TEXT_COLUMN = "text"
DRAWS_PER_CALL = 1024  # source draws made at once (the generator is the same either way)


@dataclass(frozen=True)
class StreamConfig:
    """What one rank's stream needs; written as JSON for the rank processes."""

    paths: tuple[str, ...]
    weights: tuple[float, ...]
    seq_len: int
    rows: int
    patience: int
    seed: int = 0
    workers: int = 2
    steps: int = 100
    prime: bool = True
    sharing_strategy: str = "file_descriptor"  # torch's default on Linux

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @staticmethod
    def load(path: Path) -> StreamConfig:
        raw = json.loads(path.read_text())
        return StreamConfig(
            **{**raw, "paths": tuple(raw["paths"]), "weights": tuple(raw["weights"])}
        )


class SourceCursor:
    """One source as one worker sees it: its open file and its share of the row groups."""

    def __init__(
        self, path: str, shard: int, num_shards: int, tokenize: Tokenize, rng: np.random.Generator
    ) -> None:
        # The reader settings msd's loaders use: nothing kept once a read is done.
        self.file = pq.ParquetFile(path, pre_buffer=False, buffer_size=READ_BUFFER_BYTES)
        meta = self.file.metadata
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.row_starts = np.concatenate(([0], np.cumsum(counts)))
        self.shard, self.num_shards = shard, num_shards
        self.tokenize = tokenize
        self.rng = rng  # shuffles the rows of each row group it reads
        self.visits = 0
        self.position = (0, 0)  # (epoch, row group) being read
        self.column: pa.Array | None = None
        self.order = np.zeros(0, dtype=np.int64)
        self.at = 0

    @property
    def num_row_groups(self) -> int:
        return len(self.row_starts) - 1

    def load_next(self) -> None:
        """Decode this worker's next row group of the source (its column only)."""
        number = self.shard + self.visits * self.num_shards
        self.visits += 1
        self.position = divmod(number, self.num_row_groups)
        table = self.file.read_row_group(self.position[1], columns=[TEXT_COLUMN])
        self.column = table.column(0).combine_chunks()
        del table
        pa.default_memory_pool().release_unused()  # as msd's loaders do after each read
        self.order = self.rng.permutation(len(self.column))
        self.at = 0

    def next_sample(self) -> tuple[int, np.ndarray]:
        """(sample id, tokens) of the next row; the id counts rows over epochs, like msd's."""
        if self.column is None or self.at == len(self.order):
            self.load_next()
        assert self.column is not None
        row = int(self.order[self.at])
        self.at += 1
        epoch, group = self.position
        sample_id = epoch * int(self.row_starts[-1]) + int(self.row_starts[group]) + row
        return sample_id, self.tokenize(self.column.slice(row, 1))[0]


class MixedParquetStream(IterableDataset[dict[str, torch.Tensor]]):
    """One rank's endless stream of packed micro-batches (see the module docstring)."""

    def __init__(self, config: StreamConfig, rank: int, world_size: int) -> None:
        super().__init__()
        self.config = config
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.stream(worker, workers)

    def cursors(self, worker: int, workers: int) -> list[SourceCursor]:
        """Worker ``worker``'s cursor on every source (shard ``rank·workers + worker``)."""
        shard, num_shards = self.rank * workers + worker, self.world_size * workers
        tokenize = make_transform(Transform(kind="bytes"), "text")
        return [
            SourceCursor(path, shard, num_shards, tokenize, _rng(self.config.seed, s, shard))
            for s, path in enumerate(self.config.paths)
        ]

    def stream(self, worker: int, workers: int) -> Iterator[dict[str, torch.Tensor]]:
        """The micro-batches worker ``worker`` of ``workers`` makes for this rank."""
        config = self.config
        pa.set_memory_pool(pa.system_memory_pool())  # the allocator msd's loaders use
        cursors = self.cursors(worker, workers)
        if config.prime:
            for cursor in cursors:
                cursor.load_next()
        rng = np.random.default_rng([config.seed, self.rank, worker])
        items = self.items(cursors, rng)
        packer = MicroBatchPacker(config.rows, config.seq_len, config.patience)
        while True:
            arrays = pack_rows(packer.next_rows(items), config.seq_len)
            yield {name: torch.from_numpy(array) for name, array in arrays.items()}

    def items(self, cursors: list[SourceCursor], rng: np.random.Generator) -> Iterator[Item]:
        """Samples (pieces of long ones) mixed by weight, drawn with the worker's generator."""
        weights = np.asarray(self.config.weights, dtype=np.float64)
        probabilities = weights / weights.sum()
        while True:
            for s in rng.choice(len(cursors), size=DRAWS_PER_CALL, p=probabilities).tolist():
                sample_id, tokens = cursors[s].next_sample()
                yield from split_long(s, sample_id, tokens, self.config.seq_len)


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(list(key))
