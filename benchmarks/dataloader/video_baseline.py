"""The video baseline: per-rank DataLoaders whose every worker reads and decodes every video source.

The image baseline's structure (``vlm_baseline.py``) over WebDataset shards of clips: each rank
runs ``DataLoader(MixedVideoStream(...), num_workers=W, batch_size=None, prefetch_factor=2,
persistent_workers=True)``, and every worker of every rank

* opens every source and reads its shard of the tar files (worker ``k`` of ``N = R·W`` reads
  numbers ``k, k+N, ...`` of the endless stream of shards: no two workers read the same
  (epoch, shard)), each tar read whole with ``tarfile`` as a plain WebDataset reader does, its
  samples (``KEY.mp4`` + ``KEY.txt``) in a shuffled order;
* draws each next sample's source by weight, and makes the sample with msd's own code
  (``msd.sources.fuse.Fuser``): the caption tokenized with the ``bytes`` transform, the clip
  decoded once with PyAV by ``msd.sources.video`` with the recipe's ``video:`` rules (the same
  frames sampled, the same resize and patches), ``patches / merge²`` placeholder tokens;
* packs its rank's micro-batch first fit (``packing.py``; ``truncate``) and collates with
  ``msd.batch.pack.pack_rows``, so the tensors (``pixel_values_videos``, ``video_grid_thw``,
  ``video_cu_seqlens``, ...) are the ones msd delivers.

Nothing balances cost across ranks.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from benchmarks.dataloader.baseline import DRAWS_PER_CALL
from benchmarks.dataloader.vlm_baseline import Sample, VlmPacker
from msd.batch.pack import VideoOutput, pack_rows
from msd.recipe.schema import Transform, Video, Vision
from msd.sources.fuse import Fuser, FuseSpec, geometry_of, video_spec_of
from msd.sources.image_rows import rows_of
from msd.sources.transforms import make_transform

VIDEO_EXT, TEXT_EXT = "mp4", "txt"
SHARD_SAMPLES = 1 << 20  # more than a shard holds: sample ids need only be distinct


def video_fuse_spec(vision: Vision, video: Video, seq_len: int) -> FuseSpec:
    """What msd's loaders use for a video source with ``balance.long_samples: truncate``."""
    return FuseSpec(
        geometry_of(vision),
        vision.image_token_id,
        vision.marker,
        seq_len,
        "truncate",
        1,
        video=video_spec_of(video, vision),
        video_token_id=video.video_token_id,
        video_marker=video.marker,
    )


def video_output(vision: Vision, video: Video) -> VideoOutput:
    """How msd's Constructor hands out a batch's videos (``pack_rows``' ``video``)."""
    rows = video.temporal_patch_size // vision.temporal_patch_size
    patch_values = 3 * vision.temporal_patch_size * vision.patch_size**2
    return VideoOutput(video.video_token_id, patch_values * rows, video.seconds_per_grid)


@dataclass(frozen=True)
class VideoStreamConfig:
    """What one rank's stream needs; written as JSON for the rank processes."""

    shards: tuple[tuple[str, ...], ...]  # per source
    weights: tuple[float, ...]
    seq_len: int
    rows: int
    patience: int
    vision: Vision
    video: Video
    seed: int = 0
    workers: int = 2
    steps: int = 100
    sharing_strategy: str = "file_descriptor"

    def save(self, path: Path) -> None:
        fields = {
            **asdict(self),
            "vision": msgspec.to_builtins(self.vision),
            "video": msgspec.to_builtins(self.video),
        }
        path.write_text(json.dumps(fields))

    @staticmethod
    def load(path: Path) -> VideoStreamConfig:
        raw = json.loads(path.read_text())
        return VideoStreamConfig(
            **{
                **raw,
                "shards": tuple(tuple(s) for s in raw["shards"]),
                "weights": tuple(raw["weights"]),
                "vision": msgspec.convert(raw["vision"], Vision),
                "video": msgspec.convert(raw["video"], Video),
            }
        )


def read_shard(path: str) -> pa.StructArray:
    """A tar shard's samples as msd's image rows (text, no images, its videos), in tar order."""
    members: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for member in tar:
            handle = tar.extractfile(member)
            if handle is not None:
                key, _, ext = member.name.partition(".")
                members.setdefault(key, {})[ext] = handle.read()
    samples = list(members.values())
    text = pa.array([s.get(TEXT_EXT) for s in samples], pa.large_binary())
    empty = pa.array([[] for _ in samples], pa.list_(pa.large_binary()))
    clips = pa.array(
        [[s[VIDEO_EXT]] if VIDEO_EXT in s else [] for s in samples], pa.list_(pa.large_binary())
    )
    return rows_of(text, empty, clips)


class ShardCursor:
    """One video source as one worker sees it: its share of the shards, the current shard's
    samples (compressed) in a shuffled order, and the Fuser that decodes them."""

    def __init__(
        self,
        shards: tuple[str, ...],
        shard: int,
        num_shards: int,
        fuser: Fuser,
        rng: np.random.Generator,
    ) -> None:
        self.shards = shards
        self.shard, self.num_shards = shard, num_shards
        self.fuser, self.rng = fuser, rng
        self.visits = 0
        self.position = (0, 0)
        self.rows: pa.StructArray | None = None
        self.order = np.zeros(0, dtype=np.int64)
        self.at = 0

    def load_next(self) -> None:
        number = self.shard + self.visits * self.num_shards
        self.visits += 1
        self.position = divmod(number, len(self.shards))
        self.rows = read_shard(self.shards[self.position[1]])
        self.order = self.rng.permutation(len(self.rows))
        self.at = 0

    def next_sample(self, source: int) -> Sample:
        """The next sample, decoded and fused; its id tells its epoch, shard and row."""
        if self.rows is None or self.at == len(self.order):
            self.load_next()
        assert self.rows is not None
        row = int(self.order[self.at])
        self.at += 1
        epoch, shard = self.position
        sample_id = (epoch * len(self.shards) + shard) * SHARD_SAMPLES + row
        ids, images = self.fuser(self.rows.slice(row, 1))
        return Sample(source, sample_id, ids[0], images[0])


class MixedVideoStream(IterableDataset[dict[str, torch.Tensor]]):
    """One rank's endless stream of packed micro-batches with their videos."""

    def __init__(self, config: VideoStreamConfig, rank: int, world_size: int) -> None:
        super().__init__()
        self.config = config
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.stream(worker, workers)

    def cursors(self, worker: int, workers: int) -> list[ShardCursor]:
        config = self.config
        shard, num_shards = self.rank * workers + worker, self.world_size * workers
        tokenize = make_transform(Transform(kind="bytes"), "text")
        spec = video_fuse_spec(config.vision, config.video, config.seq_len)
        return [
            ShardCursor(
                shards,
                shard,
                num_shards,
                Fuser(tokenize, spec, require_text=True),
                np.random.default_rng([config.seed, s, shard]),
            )
            for s, shards in enumerate(config.shards)
        ]

    def stream(self, worker: int, workers: int) -> Iterator[dict[str, torch.Tensor]]:
        config = self.config
        pa.set_memory_pool(pa.system_memory_pool())
        rng = np.random.default_rng([config.seed, self.rank, worker])
        packer = VlmPacker(config.rows, config.seq_len, config.patience)
        items = packer.items(self.samples(self.cursors(worker, workers), rng))
        vision, output = config.vision, video_output(config.vision, config.video)
        patch_values = 3 * vision.temporal_patch_size * vision.patch_size**2
        while True:
            rows = packer.next_rows(items)
            arrays = pack_rows(rows, config.seq_len, vision.image_token_id, patch_values, output)
            yield {name: torch.from_numpy(array) for name, array in arrays.items()}

    def samples(self, cursors: list[ShardCursor], rng: np.random.Generator) -> Iterator[Sample]:
        weights = np.asarray(self.config.weights, dtype=np.float64)
        probabilities = weights / weights.sum()
        while True:
            for s in rng.choice(len(cursors), size=DRAWS_PER_CALL, p=probabilities).tolist():
                yield cursors[s].next_sample(s)
