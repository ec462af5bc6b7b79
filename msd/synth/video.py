"""Deterministic video-text demo data: WebDataset clips with captions, Parquet video questions.

Video mixtures differ most in duration (a few seconds to minutes) and frame size, which is what
makes decode cost and patch counts uneven, so that is what the demo models: durations are
log-normal (median `MEDIAN_SECONDS`, a tail to `MAX_SECONDS`), sides drawn from a few common
sizes, frame rates from the usual ones. Each clip is a coloured shape moving across a moving
gradient, and its caption says which shape, colour and direction. Clips are encoded with PyAV
as VP9 in WebM, on one thread, at a fixed quality, with bit-exact muxing, so the same
arguments give byte-identical files.
"""

from __future__ import annotations

import io
import itertools
import logging
import tarfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa

from msd.sources.index import source_key
from msd.synth.text import OnFile, Wrote, counting, write_parquet

logger = logging.getLogger(__name__)

VIDEO_MARKER = "<video>"
MEDIAN_SECONDS = 4.0
MAX_SECONDS = 40.0
DEFAULT_VIDEOS = 24
TAR_MTIME = 1_700_000_000
WDS_SOURCE = "video-captions-wds"
PARQUET_SOURCE = "video-qa-parquet"
VIDEO_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
_SIZES = ((96, 128), (120, 160), (144, 256), (180, 320), (240, 320))  # (height, width)
_RATES = (12, 15, 24, 25, 30)
_SHAPES = ("square", "disc", "bar")
_COLOURS = {"red": (220, 40, 40), "green": (40, 180, 70), "blue": (50, 80, 220)}
_DIRECTIONS = ("left", "right", "up", "down")
# VP9 at a fixed quality ("good" deadline: "realtime" adapts to how fast the encode runs).
_OPTIONS = {"deadline": "good", "cpu-used": "8", "crf": "40", "b": "0"}


@dataclass(frozen=True)
class ClipSpec:
    """One clip: its frames, frame rate and size, and what moves in it."""

    frames: int
    fps: int
    height: int
    width: int
    shape: str
    colour: str
    direction: str

    @property
    def caption(self) -> str:
        seconds = self.frames / self.fps
        return f"A {self.colour} {self.shape} moves {self.direction} for {seconds:.1f} seconds."


@dataclass(frozen=True)
class VideoSourceSummary:
    """What was written for one source: its files, samples (rows), videos and bytes on disk."""

    name: str
    files: tuple[Path, ...]
    samples: int
    videos: int
    seconds: float
    bytes: int


def clip_specs(rng: np.random.Generator, n: int) -> list[ClipSpec]:
    """``n`` clips, durations log-normal around MEDIAN_SECONDS (at least 1 s, at most
    MAX_SECONDS)."""
    seconds = np.clip(rng.lognormal(np.log(MEDIAN_SECONDS), 0.9, n), 1.0, MAX_SECONDS)
    specs = []
    for s in seconds.tolist():
        fps = _RATES[int(rng.integers(len(_RATES)))]
        height, width = _SIZES[int(rng.integers(len(_SIZES)))]
        specs.append(
            ClipSpec(
                max(2, round(s * fps)),
                fps,
                height,
                width,
                _SHAPES[int(rng.integers(len(_SHAPES)))],
                list(_COLOURS)[int(rng.integers(len(_COLOURS)))],
                _DIRECTIONS[int(rng.integers(len(_DIRECTIONS)))],
            )
        )
    return specs


def render(spec: ClipSpec) -> bytes:
    """The clip as VP9 in WebM."""
    import av  # FFmpeg is loaded where videos are made

    buf = io.BytesIO()
    # bitexact: no random segment id or date in the WebM header
    with av.open(buf, "w", format="webm", container_options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream("libvpx-vp9", rate=Fraction(spec.fps))
        stream.codec_context.options = dict(_OPTIONS)
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
        stream.codec_context.thread_count = 1
        for i in range(spec.frames):
            frame = av.VideoFrame.from_ndarray(_frame(spec, i), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def _frame(spec: ClipSpec, i: int) -> np.ndarray:
    h, w = spec.height, spec.width
    t = i / max(1, spec.frames - 1)
    y = np.linspace(0, 1, h)[:, None]
    x = np.linspace(0, 1, w)[None, :]
    rgb = np.empty((h, w, 3), dtype=np.float64)
    rgb[..., 0] = 90 + 60 * ((x + 0.3 * t) % 1.0)
    rgb[..., 1] = 90 + 60 * ((y + 0.2 * t) % 1.0)
    rgb[..., 2] = 120
    side = max(8, min(h, w) // 4)
    travel = {"left": (0.5, 1 - t), "right": (0.5, t), "up": (1 - t, 0.5), "down": (t, 0.5)}
    fy, fx = travel[spec.direction]
    cy, cx = int(fy * (h - side)), int(fx * (w - side))
    colour = np.array(_COLOURS[spec.colour], dtype=np.float64)
    if spec.shape == "square":
        rgb[cy : cy + side, cx : cx + side] = colour
    elif spec.shape == "bar":
        rgb[cy : cy + side // 3, :] = colour
    else:
        yy, xx = np.ogrid[:h, :w]
        disc = (yy - cy - side / 2) ** 2 + (xx - cx - side / 2) ** 2 <= (side / 2) ** 2
        rgb[disc] = colour
    return rgb.astype(np.uint8)


def write_video_sources(
    root: Path,
    seed: int = 0,
    videos: int = DEFAULT_VIDEOS,
    files_per_source: int = 2,
    on_file: OnFile | None = None,
) -> list[VideoSourceSummary]:
    """Write the two video sources under ``root``, ``videos`` clips each, telling ``on_file``
    of each file written: ``video-captions-wds/shard-NNNNN.tar`` (``<key>.webm``,
    ``<key>.txt``) and ``video-qa-parquet/part-NNNNN.parquet`` (``video`` as a ``{bytes,
    path}`` struct, ``text`` with a ``<video>`` marker); existing files are overwritten."""
    if videos < 1 or files_per_source < 1:
        raise ValueError("videos and files_per_source must be at least 1")
    root = Path(root)
    wrote = counting(on_file, 2 * len(_bounds(videos, files_per_source)))
    return [
        _write_wds(root / WDS_SOURCE, _specs(WDS_SOURCE, seed, videos), files_per_source, wrote),
        _write_parquet(
            root / PARQUET_SOURCE, _specs(PARQUET_SOURCE, seed, videos), files_per_source, wrote
        ),
    ]


def _specs(name: str, seed: int, n: int) -> list[ClipSpec]:
    return clip_specs(np.random.default_rng([seed, source_key(name)]), n)


def _bounds(n: int, parts: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, min(parts, n) + 1).astype(np.int64).tolist()
    return list(itertools.pairwise(edges))


def _write_wds(
    directory: Path, specs: list[ClipSpec], shards: int, wrote: Wrote
) -> VideoSourceSummary:
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for shard, (start, stop) in enumerate(_bounds(len(specs), shards)):
        path = directory / f"shard-{shard:05d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for index in range(start, stop):
                spec = specs[index]
                _add(tar, f"{index:06d}.webm", render(spec))
                _add(tar, f"{index:06d}.txt", spec.caption.encode())
        files.append(path)
        logger.debug("wrote %s", path)
        wrote(path)
    return _summary(WDS_SOURCE, files, specs)


def _write_parquet(
    directory: Path, specs: list[ClipSpec], files: int, wrote: Wrote
) -> VideoSourceSummary:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for part, (start, stop) in enumerate(_bounds(len(specs), files)):
        chosen = specs[start:stop]
        table = pa.table(
            {
                "id": pa.array(range(start, stop), pa.int64()),
                "video": pa.array(
                    [
                        {"bytes": render(s), "path": f"{start + i:06d}.webm"}
                        for i, s in enumerate(chosen)
                    ],
                    VIDEO_TYPE,
                ),
                "text": pa.array(
                    [f"{VIDEO_MARKER}\nWhat moves, and where? {s.caption}" for s in chosen]
                ),
            }
        )
        path = directory / f"part-{part:05d}.parquet"
        write_parquet(table, path, 4)
        paths.append(path)
        wrote(path)
    return _summary(PARQUET_SOURCE, paths, specs)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), TAR_MTIME, 0o644
    info.uid, info.gid, info.uname, info.gname = 0, 0, "", ""
    tar.addfile(info, io.BytesIO(data))


def _summary(name: str, files: list[Path], specs: list[ClipSpec]) -> VideoSourceSummary:
    size = sum(p.stat().st_size for p in files)
    seconds = sum(s.frames / s.fps for s in specs)
    return VideoSourceSummary(name, tuple(files), len(specs), len(specs), seconds, size)
