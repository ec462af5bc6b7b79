"""The VLM baseline: per-rank DataLoaders whose every worker reads and decodes every image source.

The text baseline's structure (``baseline.py``) with images: each rank runs
``DataLoader(MixedImageStream(...), num_workers=W, batch_size=None, prefetch_factor=2,
persistent_workers=True)``, and every worker of every rank

* opens every source and keeps its current row group (the ``text`` and image columns, the
  compressed image bytes) in a shuffled order, reading only its shard of the row groups (worker
  ``k`` of ``N = R·W`` reads numbers ``k, k+N, ...`` of the endless stream): no two workers read
  the same (epoch, row group);
* draws each next sample's source by weight, and makes the sample with msd's own code
  (``msd.sources.fuse.Fuser``): the text tokenized with the ``bytes`` transform, each image
  decoded by ``msd.sources.vision.decode`` with the recipe's geometry (Pillow, Qwen2-VL resize,
  uint8 patches), a run of ``patches / merge²`` placeholder tokens at its marker;
* packs its rank's micro-batch first fit (``packing.py``; a sample with images is never split,
  ``truncate`` cut it to ``seq_len``) and collates with ``msd.batch.pack.pack_rows``, so the tensors
  (``pixel_values``, ``image_grid_thw``, ``vision_cu_seqlens``, ...) are the ones msd delivers.

Nothing balances cost across ranks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset, get_worker_info

from benchmarks.dataloader.baseline import DRAWS_PER_CALL
from benchmarks.dataloader.packing import Item, MicroBatchPacker
from msd.batch.pack import Piece, pack_rows
from msd.batch.sample import SampleImages
from msd.recipe.schema import Transform, Vision
from msd.sources.formats.parquet import READ_BUFFER_BYTES
from msd.sources.fuse import Fuser, FuseSpec, geometry_of
from msd.sources.image_rows import rows_of
from msd.sources.transforms import make_transform

TEXT_COLUMN = "text"


# The benchmark's images: at most 256 tokens each (the recipe's ``vision.max_pixels``).
MAX_PIXELS = 14 * 14 * 4 * 256
VISION = Vision(max_pixels=MAX_PIXELS)


def truncating_fuse_spec(vision: Vision, seq_len: int) -> FuseSpec:
    """What msd's loaders use for ``balance.long_samples: truncate``."""
    return FuseSpec(
        geometry_of(vision), vision.image_token_id, vision.marker, seq_len, "truncate", 1
    )


@dataclass(frozen=True)
class VlmStreamConfig:
    """What one rank's stream needs; written as JSON for the rank processes."""

    paths: tuple[str, ...]
    image_columns: tuple[str, ...]
    weights: tuple[float, ...]
    seq_len: int
    rows: int
    patience: int
    vision: Vision = VISION
    seed: int = 0
    workers: int = 2
    steps: int = 100
    prime: bool = True
    sharing_strategy: str = "file_descriptor"

    def save(self, path: Path) -> None:
        fields = {**asdict(self), "vision": msgspec.to_builtins(self.vision)}
        path.write_text(json.dumps(fields))

    @staticmethod
    def load(path: Path) -> VlmStreamConfig:
        raw = json.loads(path.read_text())
        tuples = {k: tuple(raw[k]) for k in ("paths", "image_columns", "weights")}
        return VlmStreamConfig(
            **{**raw, **tuples, "vision": msgspec.convert(raw["vision"], Vision)}
        )


def image_rows(table: pa.Table, image_column: str) -> pa.StructArray:
    """A row group's ``text`` and image column as msd's image rows (``image_rows.ROW_TYPE``):
    text bytes, and each row's images as a list of bytes (an Image struct's ``bytes``; one image
    a list of one)."""
    text = table.column(TEXT_COLUMN).combine_chunks().cast(pa.large_binary())
    column = table.column(image_column).combine_chunks()
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = pc.fill_null(column.value_lengths(), 0).to_numpy(zero_copy_only=False)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
        values = _bytes_of(column.flatten())
    else:
        offsets = np.arange(len(column) + 1, dtype=np.int32)
        values = _bytes_of(column)
    images = pa.ListArray.from_arrays(pa.array(offsets), values)
    return rows_of(text, images)


def _bytes_of(values: pa.Array) -> pa.Array:
    if pa.types.is_struct(values.type):
        values = pc.struct_field(values, "bytes")
    return values.cast(pa.large_binary())


@dataclass(frozen=True)
class Sample:
    source: int
    sample_id: int
    tokens: np.ndarray
    images: SampleImages | None


class ImageSourceCursor:
    """One image source as one worker sees it: its open file, its share of the row groups, the
    current row group's rows (compressed), and the Fuser that decodes them."""

    def __init__(
        self,
        path: str,
        image_column: str,
        shard: int,
        num_shards: int,
        fuser: Fuser,
        rng: np.random.Generator,
    ) -> None:
        self.file = pq.ParquetFile(path, pre_buffer=False, buffer_size=READ_BUFFER_BYTES)
        meta = self.file.metadata
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.row_starts = np.concatenate(([0], np.cumsum(counts)))
        self.image_column = image_column
        self.shard, self.num_shards = shard, num_shards
        self.fuser, self.rng = fuser, rng
        self.visits = 0
        self.position = (0, 0)
        self.rows: pa.StructArray | None = None
        self.order = np.zeros(0, dtype=np.int64)
        self.at = 0

    @property
    def num_row_groups(self) -> int:
        return len(self.row_starts) - 1

    def load_next(self) -> None:
        number = self.shard + self.visits * self.num_shards
        self.visits += 1
        self.position = divmod(number, self.num_row_groups)
        table = self.file.read_row_group(self.position[1], columns=[TEXT_COLUMN, self.image_column])
        self.rows = image_rows(table, self.image_column)
        del table
        pa.default_memory_pool().release_unused()
        self.order = self.rng.permutation(len(self.rows))
        self.at = 0

    def next_sample(self, source: int) -> Sample:
        """The next row, decoded and fused; its id counts rows over epochs, like msd's."""
        if self.rows is None or self.at == len(self.order):
            self.load_next()
        assert self.rows is not None
        row = int(self.order[self.at])
        self.at += 1
        epoch, group = self.position
        sample_id = epoch * int(self.row_starts[-1]) + int(self.row_starts[group]) + row
        ids, images = self.fuser(self.rows.slice(row, 1))
        return Sample(source, sample_id, ids[0], images[0])


class VlmPacker:
    """``MicroBatchPacker`` over samples with images: the packer places tokens; each placed
    piece gets back its sample's images (held here while the sample waits in the carry)."""

    def __init__(self, rows: int, seq_len: int, patience: int) -> None:
        self.packer = MicroBatchPacker(rows, seq_len, patience)
        self.images: dict[tuple[int, int], SampleImages] = {}

    def items(self, samples: Iterator[Sample]) -> Iterator[Item]:
        for sample in samples:
            if sample.images is not None:
                self.images[(sample.source, sample.sample_id)] = sample.images
            yield Item(sample.source, sample.sample_id, sample.tokens)

    def next_rows(self, items: Iterator[Item]) -> list[list[Piece]]:
        rows = self.packer.next_rows(items)
        return [
            [replace(p, images=self.images.pop((p.source, p.sample_id), None)) for p in row]
            for row in rows
        ]


class MixedImageStream(IterableDataset[dict[str, torch.Tensor]]):
    """One rank's endless stream of packed micro-batches with their images."""

    def __init__(self, config: VlmStreamConfig, rank: int, world_size: int) -> None:
        super().__init__()
        self.config = config
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.stream(worker, workers)

    def cursors(self, worker: int, workers: int) -> list[ImageSourceCursor]:
        shard, num_shards = self.rank * workers + worker, self.world_size * workers
        tokenize = make_transform(Transform(kind="bytes"), "text")
        spec = truncating_fuse_spec(self.config.vision, self.config.seq_len)
        return [
            ImageSourceCursor(
                path,
                column,
                shard,
                num_shards,
                Fuser(tokenize, spec, require_text=False),
                np.random.default_rng([self.config.seed, s, shard]),
            )
            for s, (path, column) in enumerate(
                zip(self.config.paths, self.config.image_columns, strict=True)
            )
        ]

    def stream(self, worker: int, workers: int) -> Iterator[dict[str, torch.Tensor]]:
        config = self.config
        pa.set_memory_pool(pa.system_memory_pool())
        cursors = self.cursors(worker, workers)
        if config.prime:
            for cursor in cursors:
                cursor.load_next()
        rng = np.random.default_rng([config.seed, self.rank, worker])
        packer = VlmPacker(config.rows, config.seq_len, config.patience)
        items = packer.items(self.samples(cursors, rng))
        token_id = config.vision.image_token_id
        while True:
            arrays = pack_rows(packer.next_rows(items), config.seq_len, token_id)
            yield {name: torch.from_numpy(array) for name, array in arrays.items()}

    def samples(
        self, cursors: list[ImageSourceCursor], rng: np.random.Generator
    ) -> Iterator[Sample]:
        weights = np.asarray(self.config.weights, dtype=np.float64)
        probabilities = weights / weights.sum()
        while True:
            for s in rng.choice(len(cursors), size=DRAWS_PER_CALL, p=probabilities).tolist():
                yield cursors[s].next_sample(s)
