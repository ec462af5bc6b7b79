"""Deterministic image-text demo data: WebDataset captions, Parquet captions, interleaved documents.

Image mixtures differ mostly in image sizes (thumbnails to scans, square to 4:1 panoramas),
encodings and images per sample, which is what makes decoding and packing cost uneven, so that
is what the demo models. Long sides are log-logistic and drawn stratified, so every source of
16 or more images holds one with a long side under 64 px and one over 1024 px. Photo-like images
(JPEG, WebP) carry sensor noise; graphic-like ones (PNG) are flat and banded, as in real data.
Every encoder option is pinned and no metadata (EXIF, timestamps) is written, so the same
arguments give byte-identical files.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from msd.sources.index import source_key
from msd.synth.text import OnFile, Wrote, counting, write_parquet

if TYPE_CHECKING:  # Pillow is imported where images are made: `msd` starts without it
    from PIL import Image

logger = logging.getLogger(__name__)

IMAGE_MARKER = "<image>"
MIN_SIDE = 32
MAX_SIDE = 2048
MEDIAN_LONG_SIDE = 256
LONG_SIDE_SCALE = 0.55  # of log(long side): about 7% of images under 64 px, 7% over 1024 px
MAX_IMAGES_PER_DOCUMENT = 5
DEFAULT_SAMPLES = 192
JPEG_QUALITY = 85
WEBP_QUALITY = 80
PNG_COMPRESS_LEVEL = 6
TAR_MTIME = 1_700_000_000  # fixed, so shards do not depend on when they were written

WDS_SOURCE = "captions-wds"
PARQUET_SOURCE = "captions-parquet"
INTERLEAVED_SOURCE = "interleaved-parquet"

# The Hugging Face `datasets` Image feature as Arrow stores it.
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])

# Width / height ratios and how common they are: mostly square or 4:3, a tail up to 4:1.
_ASPECTS = np.array([1.0, 4 / 3, 3 / 4, 3 / 2, 2 / 3, 16 / 9, 9 / 16, 2.0, 1 / 2, 4.0, 1 / 4])
_ASPECT_WEIGHTS = np.array([6, 4, 3, 3, 2, 3, 2, 1, 1, 0.5, 0.5])
_GRADIENT_SIDE = 256
_FORMATS = ("jpg", "png", "webp")
_FORMAT_WEIGHTS = np.array([0.6, 0.25, 0.15])
_COLOURS = {
    "red": (200, 40, 40),
    "orange": (240, 140, 30),
    "yellow": (240, 220, 60),
    "green": (50, 160, 70),
    "teal": (30, 150, 150),
    "blue": (40, 80, 200),
    "purple": (130, 60, 170),
    "pink": (240, 140, 180),
    "brown": (120, 80, 40),
    "grey": (128, 128, 128),
    "black": (15, 15, 15),
    "white": (245, 245, 245),
}
_SHAPES = ("circle", "square", "triangle", "bar")
_WORDS = (
    *("the", "a", "image", "shows", "scene", "with", "light", "and", "colour", "in", "where"),
    *("shapes", "meet", "along", "soft", "edges", "of", "frame", "while", "some", "parts"),
    *("are", "bright", "others", "dark", "as", "seen", "from", "above", "or", "below"),
)


def _nothing(path: Path) -> None:
    """Where no one is told of the files written."""


@dataclass(frozen=True)
class ImageSpec:
    """What one image will be: its size and its encoding (``jpg``, ``png`` or ``webp``)."""

    width: int
    height: int
    fmt: str


@dataclass(frozen=True)
class VlmSourceSummary:
    """What was written for one source: its files, samples (rows), images and bytes on disk."""

    name: str
    files: tuple[Path, ...]
    samples: int
    images: int
    bytes: int


def write_vlm_sources(
    root: Path,
    seed: int = 0,
    samples: int = DEFAULT_SAMPLES,
    files_per_source: int = 4,
    rows_per_row_group: int = 16,
    on_file: OnFile | None = None,
) -> list[VlmSourceSummary]:
    """Write the three image-text sources under ``root``, ``samples`` samples each, telling
    ``on_file`` of each file written.

    ``captions-wds/shard-NNNNN.tar``, ``captions-parquet/part-NNNNN.parquet`` and
    ``interleaved-parquet/part-NNNNN.parquet``; existing files are overwritten.
    """
    if samples < 1 or files_per_source < 1 or rows_per_row_group < 1:
        raise ValueError("samples, files_per_source and rows_per_row_group must be at least 1")
    root = Path(root)
    wrote = counting(on_file, 3 * len(_bounds(samples, files_per_source)))
    return [
        write_captions_wds(root / WDS_SOURCE, seed, samples, files_per_source, wrote),
        write_captions_parquet(
            root / PARQUET_SOURCE, seed, samples, files_per_source, rows_per_row_group, wrote
        ),
        write_interleaved_parquet(
            root / INTERLEAVED_SOURCE, seed, samples, files_per_source, rows_per_row_group, wrote
        ),
    ]


def long_sides(rng: np.random.Generator, n: int) -> npt.NDArray[np.int64]:
    """``n`` long sides, log-logistic around MEDIAN_LONG_SIDE, one per stratum of the CDF."""
    u = (rng.permutation(n) + rng.uniform(0.0, 1.0, n)) / n
    u = np.clip(u, 1e-9, 1 - 1e-9)
    log_side = np.log(MEDIAN_LONG_SIDE) + LONG_SIDE_SCALE * np.log(u / (1 - u))
    sides: npt.NDArray[np.int64] = np.clip(np.rint(np.exp(log_side)), MIN_SIDE, MAX_SIDE)
    return sides.astype(np.int64)


def image_specs(rng: np.random.Generator, n: int) -> list[ImageSpec]:
    """Sizes and encodings of ``n`` images; neither side is under MIN_SIDE."""
    sides = long_sides(rng, n)
    aspects = rng.choice(_ASPECTS, n, p=_ASPECT_WEIGHTS / _ASPECT_WEIGHTS.sum())
    formats = rng.choice(len(_FORMATS), n, p=_FORMAT_WEIGHTS)
    specs = []
    for side, aspect, fmt in zip(sides.tolist(), aspects.tolist(), formats.tolist(), strict=True):
        short = max(MIN_SIDE, round(side / max(aspect, 1 / aspect)))
        width, height = (side, short) if aspect >= 1 else (short, side)
        specs.append(ImageSpec(width, height, _FORMATS[fmt]))
    return specs


def render(spec: ImageSpec, rng: np.random.Generator) -> tuple[bytes, str]:
    """The encoded bytes of one image drawn after ``spec``, and a caption that describes it."""
    from PIL import Image

    names = list(_COLOURS)
    start, stop = (names[i] for i in rng.choice(len(names), 2, replace=False))
    photo = spec.fmt != "png"
    image = _gradient(rng, spec, _COLOURS[start], _COLOURS[stop], levels=0 if photo else 6)
    shapes = _draw_shapes(rng, image, names)
    if photo:  # sensor-like luminance noise, so photos compress like photos
        noise = rng.integers(-8, 9, (spec.height, spec.width, 1), np.int16)
        noisy = np.asarray(image, dtype=np.int16) + noise
        image = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")
    kind = "photo" if photo else "drawing"
    caption = f"a {kind} of {', '.join(shapes)} on a {start} to {stop} gradient"
    return encode(image, spec.fmt), caption


def encode(image: Image.Image, fmt: str) -> bytes:
    """``image`` in ``fmt`` with every encoder option pinned and no metadata."""
    out = io.BytesIO()
    if fmt == "jpg":
        image.save(out, "JPEG", quality=JPEG_QUALITY, subsampling=2, optimize=False)
    elif fmt == "png":
        image.save(out, "PNG", compress_level=PNG_COMPRESS_LEVEL, optimize=False)
    elif fmt == "webp":
        image.save(out, "WEBP", quality=WEBP_QUALITY, method=2, lossless=False)
    else:
        raise ValueError(f"unknown image format '{fmt}'")
    return out.getvalue()


def interleave(rng: np.random.Generator, captions: Sequence[str]) -> str:
    """A document: paragraphs with one IMAGE_MARKER per caption, each between two paragraphs."""
    n = len(captions)
    paragraphs = n + 1 + int(rng.integers(0, 3))
    gaps = sorted(rng.choice(paragraphs - 1, n, replace=False).tolist())
    blocks: list[str] = []
    pending = iter(captions)
    for i in range(paragraphs):
        blocks.append(_paragraph(rng))
        if gaps and gaps[0] == i:
            gaps.pop(0)
            blocks.extend([IMAGE_MARKER, f"Above: {next(pending)}."])
    return "\n\n".join(blocks)


def write_captions_wds(
    directory: Path, seed: int, samples: int, shards: int, wrote: Wrote = _nothing
) -> VlmSourceSummary:
    """WebDataset shards: ``<key>.<jpg|png|webp>``, ``<key>.txt``, ``<key>.json`` per sample."""
    directory.mkdir(parents=True, exist_ok=True)
    images = _images(WDS_SOURCE, seed, samples)
    files = []
    for shard, (start, stop) in enumerate(_bounds(samples, shards)):
        path = directory / f"shard-{shard:05d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for index in range(start, stop):
                spec, data, caption = next(images)
                meta = {"id": index, "width": spec.width, "height": spec.height}
                key = f"{index:06d}"
                _add(tar, f"{key}.{spec.fmt}", data)
                _add(tar, f"{key}.txt", caption.encode())
                _add(tar, f"{key}.json", json.dumps(meta).encode())
        files.append(path)
        logger.debug("wrote %s", path)
        wrote(path)
    return _summary(WDS_SOURCE, files, samples, samples)


def write_captions_parquet(
    directory: Path,
    seed: int,
    samples: int,
    files: int,
    rows_per_group: int,
    wrote: Wrote = _nothing,
) -> VlmSourceSummary:
    """Parquet with ``id``, ``image`` (the HF Image struct) and ``text`` (its caption)."""
    images = _images(PARQUET_SOURCE, seed, samples)
    schema = _schema("image", IMAGE_TYPE, {"_type": "Image"})
    paths = []
    for part, (start, stop) in enumerate(_bounds(samples, files)):
        rows = [next(images) for _ in range(start, stop)]
        columns = {
            "id": pa.array(range(start, stop), pa.int64()),
            "image": pa.array([_struct(start + i, s, d) for i, (s, d, _) in enumerate(rows)]),
            "text": pa.array([caption for _, _, caption in rows], pa.string()),
        }
        paths.append(_write(pa.table(columns, schema=schema), directory, part, rows_per_group))
        wrote(paths[-1])
    return _summary(PARQUET_SOURCE, paths, samples, samples)


def write_interleaved_parquet(
    directory: Path,
    seed: int,
    documents: int,
    files: int,
    rows_per_group: int,
    wrote: Wrote = _nothing,
) -> VlmSourceSummary:
    """Parquet documents: ``id``, ``images`` (1-5 HF Image structs) and marked-up ``text``."""
    rng = _rng(INTERLEAVED_SOURCE, seed, stream=2)
    counts = rng.integers(1, MAX_IMAGES_PER_DOCUMENT + 1, documents).tolist()
    images = _images(INTERLEAVED_SOURCE, seed, sum(counts))
    schema = _schema("images", pa.list_(IMAGE_TYPE), [{"_type": "Image"}])
    paths, first_image = [], 0
    for part, (start, stop) in enumerate(_bounds(documents, files)):
        docs: list[list[dict[str, object]]] = []
        texts = []
        for count in counts[start:stop]:
            rows = [next(images) for _ in range(count)]
            docs.append([_struct(first_image + i, s, d) for i, (s, d, _) in enumerate(rows)])
            texts.append(interleave(rng, [caption for _, _, caption in rows]))
            first_image += count
        columns = {
            "id": pa.array(range(start, stop), pa.int64()),
            "images": pa.array(docs, pa.list_(IMAGE_TYPE)),
            "text": pa.array(texts, pa.string()),
        }
        paths.append(_write(pa.table(columns, schema=schema), directory, part, rows_per_group))
        wrote(paths[-1])
    return _summary(INTERLEAVED_SOURCE, paths, documents, sum(counts))


def _rng(name: str, seed: int, stream: int, *index: int) -> np.random.Generator:
    # Specs and each image draw from their own streams, so one image can be redrawn alone.
    return np.random.default_rng([seed, source_key(name), stream, *index])


def _images(name: str, seed: int, n: int) -> Iterator[tuple[ImageSpec, bytes, str]]:
    for index, spec in enumerate(image_specs(_rng(name, seed, 0), n)):
        data, caption = render(spec, _rng(name, seed, 1, index))
        yield spec, data, caption


def _gradient(
    rng: np.random.Generator,
    spec: ImageSpec,
    start: tuple[int, int, int],
    stop: tuple[int, int, int],
    levels: int,
) -> Image.Image:
    from PIL import Image, ImageOps

    # Drawn at most _GRADIENT_SIDE px a side and scaled up: a linear ramp survives bilinear scaling.
    angle = rng.uniform(0, 2 * np.pi)
    width, height = min(spec.width, _GRADIENT_SIDE), min(spec.height, _GRADIENT_SIDE)
    y, x = np.ogrid[0:height, 0:width]
    t = x * (np.cos(angle) / width) + y * (np.sin(angle) / height)
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-9)
    ramp = Image.fromarray(np.rint(t * 255).astype(np.uint8), "L")
    ramp = ramp.resize((spec.width, spec.height), Image.Resampling.BILINEAR)
    if levels:  # banded, as in flat graphics
        ramp = ramp.point(
            [min(v * levels // 256, levels - 1) * 255 // (levels - 1) for v in range(256)]
        )
    return ImageOps.colorize(ramp, start, stop)


def _draw_shapes(rng: np.random.Generator, image: Image.Image, names: list[str]) -> list[str]:
    from PIL import ImageDraw

    draw = ImageDraw.Draw(image)
    width, height = image.size
    described = []
    for _ in range(int(rng.integers(1, 5))):
        shape, colour = _SHAPES[rng.integers(len(_SHAPES))], names[rng.integers(len(names))]
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        r = rng.uniform(0.08, 0.35) * min(width, height)
        box = (cx - r, cy - r, cx + r, cy + r)
        fill = _COLOURS[colour]
        if shape == "circle":
            draw.ellipse(box, fill=fill)
        elif shape == "square":
            draw.rectangle(box, fill=fill)
        elif shape == "triangle":
            draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill)
        else:
            draw.rectangle((0, cy - r / 4, width, cy + r / 4), fill=fill)
        described.append(f"{'an' if colour[0] in 'aeiou' else 'a'} {colour} {shape}")
    return described


def _paragraph(rng: np.random.Generator) -> str:
    sentences = []
    for _ in range(int(rng.integers(1, 5))):
        words = [_WORDS[i] for i in rng.integers(0, len(_WORDS), int(rng.integers(5, 16)))]
        sentences.append(" ".join(words).capitalize() + ".")
    return " ".join(sentences)


def _struct(index: int, spec: ImageSpec, data: bytes) -> dict[str, object]:
    return {"bytes": data, "path": f"{index:06d}.{spec.fmt}"}


def _schema(column: str, kind: pa.DataType, feature: object) -> pa.Schema:
    # The `huggingface` metadata makes `datasets` decode the column as images.
    features = {
        "id": {"dtype": "int64", "_type": "Value"},
        column: feature,
        "text": {"dtype": "string", "_type": "Value"},
    }
    metadata = {"huggingface": json.dumps({"info": {"features": features}})}
    return pa.schema([("id", pa.int64()), (column, kind), ("text", pa.string())], metadata)


def _bounds(n: int, parts: int) -> list[tuple[int, int]]:
    bounds = np.linspace(0, n, min(parts, n) + 1).astype(np.int64).tolist()
    return list(itertools.pairwise(bounds))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), TAR_MTIME, 0o644
    info.uid, info.gid, info.uname, info.gname = 0, 0, "", ""
    tar.addfile(info, io.BytesIO(data))


def _write(table: pa.Table, directory: Path, part: int, rows_per_group: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"part-{part:05d}.parquet"
    write_parquet(table, path, rows_per_group)
    logger.debug("wrote %s", path)
    return path


def _summary(name: str, files: list[Path], samples: int, images: int) -> VlmSourceSummary:
    size = sum(p.stat().st_size for p in files)
    return VlmSourceSummary(name, tuple(files), samples, images, size)
