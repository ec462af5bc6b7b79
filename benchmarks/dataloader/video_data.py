"""The video benchmark's sources: S WebDataset sources ``c0000, c0001, ...`` of captioned clips.

A long-tailed clip-length mix, as video corpora have: durations log-normal (median
``median_s``, σ 0.9, from 1 s to ``max_s``: most clips a few seconds, a tail to tens of
seconds), frame sizes from ``SIZES`` (240p to 360p) and rates from ``RATES``, each source with
its own seed. Each clip is an H.264 MP4 of moving gradients encoded with PyAV
(`benchmarks.video_decode.clip`, libx264's ``veryfast`` preset), with a caption of a few words
(``KEY.mp4`` + ``KEY.txt``, no ``<video>`` marker: the video comes before the text), in tar
shards of ``clips_per_shard`` samples.

Beside the shards, the manifest records each clip's frames, rate and size and its caption's
bytes (with the ``bytes`` transform, its text tokens): what calibrating the simulated cost needs
without decoding. The folder (``benchmarks/runs/dataloader-data/video-S{S}-...``) is reused when
its manifest matches.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.dataloader.data import DATA_ROOT
from benchmarks.video_decode import clip
from msd.sources.index import source_key

MANIFEST = "manifest.json"
SIZES = ((240, 426), (288, 512), (360, 640))  # (height, width)
RATES = (24, 25, 30)
SIGMA = 0.9
PRESET = "veryfast"
WORDS = ("a", "red", "blue", "gradient", "moves", "slowly", "across", "the", "frame", "clip")


@dataclass(frozen=True)
class VideoDataSpec:
    """What decides the files: source count, clips per source, shard size, the length mix."""

    num_sources: int
    clips: int = 32
    clips_per_shard: int = 8
    median_s: float = 4.0
    max_s: float = 40.0
    seed: int = 0

    @property
    def folder_name(self) -> str:
        return (
            f"video-S{self.num_sources}-c{self.clips}-sh{self.clips_per_shard}"
            f"-len{self.median_s:g}-{self.max_s:g}-seed{self.seed}"
        )


@dataclass(frozen=True)
class ClipShape:
    """One clip of the mix: its frames, frame rate and frame size."""

    frames: int
    fps: int
    height: int
    width: int

    @property
    def seconds(self) -> float:
        return self.frames / self.fps


def clip_mix(rng: np.random.Generator, n: int, median_s: float, max_s: float) -> list[ClipShape]:
    """``n`` clips: durations log-normal around ``median_s`` (1 s to ``max_s``), sizes and rates
    drawn evenly from ``SIZES`` and ``RATES``."""
    seconds = np.clip(rng.lognormal(np.log(median_s), SIGMA, n), 1.0, max_s)
    shapes = []
    for s in seconds.tolist():
        fps = RATES[int(rng.integers(len(RATES)))]
        height, width = SIZES[int(rng.integers(len(SIZES)))]
        shapes.append(ClipShape(max(2, round(s * fps)), fps, height, width))
    return shapes


def caption(rng: np.random.Generator) -> str:
    return " ".join(WORDS[int(i)] for i in rng.integers(len(WORDS), size=int(rng.integers(4, 24))))


@dataclass(frozen=True)
class VideoSource:
    """One written source: its shards, and per sample its clip and its caption's tokens."""

    name: str
    folder: str
    shards: tuple[str, ...]
    clips: tuple[ClipShape, ...]
    caption_tokens: tuple[int, ...]
    weight: float = 1.0

    @property
    def samples(self) -> int:
        return len(self.clips)


@dataclass(frozen=True)
class VideoDataset:
    spec: VideoDataSpec
    folder: Path
    sources: tuple[VideoSource, ...]

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(s.weight for s in self.sources)

    @property
    def bytes_on_disk(self) -> int:
        return sum(Path(p).stat().st_size for s in self.sources for p in s.shards)

    @property
    def video_s(self) -> float:
        return sum(c.seconds for s in self.sources for c in s.clips)


def write_source(index: int, spec: VideoDataSpec, folder: Path) -> VideoSource:
    """Source ``index``: ``spec.clips`` clips of the mix with their captions, in shards."""
    name = f"c{index:04d}"
    rng = np.random.default_rng([spec.seed, source_key(name), 0])
    shapes = clip_mix(rng, spec.clips, spec.median_s, spec.max_s)
    captions = [caption(rng) for _ in shapes]
    where = folder / name
    where.mkdir(parents=True, exist_ok=True)
    shards = []
    for start in range(0, len(shapes), spec.clips_per_shard):
        path = where / f"shard-{start // spec.clips_per_shard:05d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(start, min(len(shapes), start + spec.clips_per_shard)):
                c = shapes[i]
                data = clip(c.height, c.width, c.seconds, c.fps, phase=i, preset=PRESET)
                _add(tar, f"{i:06d}.mp4", data)
                _add(tar, f"{i:06d}.txt", captions[i].encode())
        shards.append(str(path))
    tokens = tuple(len(c.encode()) for c in captions)
    return VideoSource(name, str(where), tuple(shards), tuple(shapes), tokens)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def ensure_video_data(spec: VideoDataSpec, root: Path = DATA_ROOT) -> VideoDataset:
    """The sources of ``spec`` under ``root``, written unless a matching manifest is there."""
    folder = root / spec.folder_name
    manifest = folder / MANIFEST
    if manifest.exists():
        saved = json.loads(manifest.read_text())
        if saved.get("spec") == asdict(spec):
            return VideoDataset(spec, folder, tuple(_source_of(s) for s in saved["sources"]))
    if folder.exists():
        shutil.rmtree(folder)
    sources = tuple(write_source(i, spec, folder) for i in range(spec.num_sources))
    dataset = VideoDataset(spec, folder, sources)
    record = {
        "spec": asdict(spec),
        "bytes_on_disk": dataset.bytes_on_disk,
        "video_s": dataset.video_s,
        "sources": [asdict(s) for s in sources],
    }
    manifest.write_text(json.dumps(record))
    return dataset


def _source_of(raw: dict[str, Any]) -> VideoSource:
    return VideoSource(
        **{
            **raw,
            "shards": tuple(raw["shards"]),
            "clips": tuple(ClipShape(**c) for c in raw["clips"]),
            "caption_tokens": tuple(raw["caption_tokens"]),
        }
    )
