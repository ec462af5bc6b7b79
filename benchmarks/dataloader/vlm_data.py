"""The VLM benchmark's sources: S synthetic image-text Parquet sources ``v0000, v0001, ...``.

Even sources are image captions (``image``: the Hugging Face Image struct ``{bytes, path}``, one
per row; ``text``: its caption), odd ones interleaved documents (``images``: a list of 1-5 Image
structs; ``text`` with one ``<image>`` marker per image), both as ``msd.synth.vlm`` writes them
(its ``render``/``encode``/``interleave``), each source with its own seed. Images are the demo's
sizes and aspect ratios scaled down (long side median ``median_side``, at most ``max_side``) so
that decoding stays cheap on a small machine; a source holds about ``images`` images in one file
(a few MB), in row groups of about ``rg_images`` images.

With ``real_images`` (a folder), the images are files found under it instead (JPEG, PNG or WebP
that ``msd.sources.vision.probe`` accepts, both sides at least ``MIN_SIDE``), their bytes as they
are: each source draws its images from that pool with its own seed (a file may appear in several
sources), captioned by the file's name. Photographs from Debian's packages serve, e.g.::

    apt-get download opencv-doc mate-backgrounds
    for f in *.deb; do dpkg -x "$f" real-images; done
    python -m benchmarks.dataloader --vlm --real-images real-images --point 64,8,2

Beside the files, the manifest records each sample's text bytes (markers excluded: with the
``bytes`` transform, its text tokens) and its images' (height, width): what calibrating the
simulated cost needs without decoding anything. The folder
(``benchmarks/runs/dataloader-data/vlm-S{S}-...``) is reused when its manifest matches.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks.dataloader.data import DATA_ROOT
from msd.sources.index import source_key
from msd.sources.vision import EncodedImage, probe
from msd.synth.text import write_parquet
from msd.synth.vlm import (
    IMAGE_MARKER,
    IMAGE_TYPE,
    MAX_IMAGES_PER_DOCUMENT,
    MEDIAN_LONG_SIDE,
    MIN_SIDE,
    ImageSpec,
    image_specs,
    interleave,
    render,
)

MANIFEST = "manifest.json"
CAPTIONS, INTERLEAVED = "captions", "interleaved"
COLUMN = {CAPTIONS: "image", INTERLEAVED: "images"}


@dataclass(frozen=True)
class VlmDataSpec:
    """What decides the files: source count, images per source, row-group size, image sizes."""

    num_sources: int
    images: int = 320
    rg_images: int = 80
    median_side: int = 192
    max_side: int = 512
    seed: int = 0
    real_images: str = ""  # a folder of image files to draw from, instead of rendering

    @property
    def folder_name(self) -> str:
        if self.real_images:
            where = hashlib.sha256(str(Path(self.real_images).resolve()).encode()).hexdigest()
            return (
                f"vlm-S{self.num_sources}-i{self.images}-rg{self.rg_images}"
                f"-real{where[:12]}-seed{self.seed}"
            )
        return (
            f"vlm-S{self.num_sources}-i{self.images}-rg{self.rg_images}"
            f"-side{self.median_side}-{self.max_side}-seed{self.seed}"
        )


@dataclass(frozen=True)
class RealImage:
    """An image file of the pool: its bytes, format suffix, caption and upright (height, width)."""

    data: bytes
    suffix: str
    caption: str
    hw: tuple[int, int]


REAL_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def real_pool(folder: Path) -> list[RealImage]:
    """Every image file under ``folder`` that msd would decode, both sides ≥ MIN_SIDE, in path
    order (files that differ only by path count once)."""
    pool, seen = [], set()
    for path in sorted(p for p in folder.rglob("*") if p.suffix.lower() in REAL_SUFFIXES):
        if not path.is_file():
            continue
        data = path.read_bytes()
        digest = hashlib.sha256(data).digest()
        image = probe(data)
        if digest in seen or not isinstance(image, EncodedImage):
            continue
        if min(image.original_hw) < MIN_SIDE:
            continue
        seen.add(digest)
        caption = "a picture of " + path.stem.replace("_", " ").replace("-", " ")
        pool.append(RealImage(data, path.suffix.lower().lstrip("."), caption, image.original_hw))
    if not pool:
        raise SystemExit(f"no image msd decodes under {folder}")
    return pool


@dataclass(frozen=True)
class VlmSource:
    """One written source: its file, kind, image column, and per sample its text tokens and its
    images' (height, width)."""

    name: str
    path: str
    kind: str
    image_column: str
    rows_per_row_group: int
    text_tokens: tuple[int, ...]
    image_sizes: tuple[tuple[tuple[int, int], ...], ...]
    weight: float = 1.0

    @property
    def samples(self) -> int:
        return len(self.text_tokens)


@dataclass(frozen=True)
class VlmDataset:
    spec: VlmDataSpec
    folder: Path
    sources: tuple[VlmSource, ...]

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(s.weight for s in self.sources)

    @property
    def bytes_on_disk(self) -> int:
        return sum(Path(s.path).stat().st_size for s in self.sources)


def kind_of(index: int) -> str:
    return CAPTIONS if index % 2 == 0 else INTERLEAVED


def scaled_specs(rng: np.random.Generator, n: int, spec: VlmDataSpec) -> list[ImageSpec]:
    """The demo's image sizes and encodings, scaled so the long side's median is
    ``median_side`` and no side passes ``max_side`` (nor falls under MIN_SIDE)."""
    out = []
    for s in image_specs(rng, n):
        scale = spec.median_side / MEDIAN_LONG_SIDE
        scale = min(scale, spec.max_side / max(s.width, s.height))
        width = max(MIN_SIDE, round(s.width * scale))
        height = max(MIN_SIDE, round(s.height * scale))
        out.append(ImageSpec(width, height, s.fmt))
    return out


def rendered_images(
    rng: np.random.Generator, n: int, spec: VlmDataSpec, index: int
) -> list[RealImage]:
    """``n`` synthetic images (``msd.synth.vlm.render``) in the scaled demo sizes."""
    out = []
    for k, image in enumerate(scaled_specs(rng, n, spec)):
        data, caption = render(image, np.random.default_rng([spec.seed, index, 1, k]))
        out.append(RealImage(data, image.fmt, caption, (image.height, image.width)))
    return out


def drawn_images(rng: np.random.Generator, n: int, pool: Sequence[RealImage]) -> list[RealImage]:
    """``n`` images drawn from ``pool``: a shuffled pass over it, again as often as needed."""
    out: list[RealImage] = []
    while len(out) < n:
        out.extend(pool[int(i)] for i in rng.permutation(len(pool)))
    return out[:n]


def write_source(
    index: int, spec: VlmDataSpec, folder: Path, pool: Sequence[RealImage] = ()
) -> VlmSource:
    """Source ``index``: captions or documents holding about ``spec.images`` images."""
    kind, name = kind_of(index), f"v{index:04d}"
    rng = np.random.default_rng([spec.seed, source_key(name), 0])
    if kind == CAPTIONS:
        counts = [1] * spec.images
    else:  # documents of 1-5 images until about spec.images images
        counts = []
        while sum(counts) < spec.images:
            counts.append(int(rng.integers(1, MAX_IMAGES_PER_DOCUMENT + 1)))
    n = sum(counts)
    images = drawn_images(rng, n, pool) if pool else rendered_images(rng, n, spec, index)
    cells: list[object] = []
    texts: list[str] = []
    tokens: list[int] = []
    sizes: list[tuple[tuple[int, int], ...]] = []
    at = 0
    for count in counts:
        own = images[at : at + count]
        rendered = [
            ({"bytes": image.data, "path": f"{at + k:06d}.{image.suffix}"}, image.caption)
            for k, image in enumerate(own)
        ]
        at += count
        if kind == CAPTIONS:
            cells.append(rendered[0][0])
            texts.append(rendered[0][1])
        else:
            cells.append([struct for struct, _ in rendered])
            texts.append(interleave(rng, [caption for _, caption in rendered]))
        marker_bytes = texts[-1].count(IMAGE_MARKER) * len(IMAGE_MARKER.encode())
        tokens.append(len(texts[-1].encode()) - (marker_bytes if kind == INTERLEAVED else 0))
        sizes.append(tuple(image.hw for image in own))
    image_type = IMAGE_TYPE if kind == CAPTIONS else pa.list_(IMAGE_TYPE)
    column = COLUMN[kind]
    table = pa.table(
        {
            "id": pa.array(range(len(counts)), pa.int64()),
            column: pa.array(cells, image_type),
            "text": pa.array(texts, pa.string()),
        }
    )
    rows = max(1, round(spec.rg_images * len(counts) / sum(counts)))
    path = folder / name / "part-00000.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(table, path, rows)
    return VlmSource(name, str(path), kind, column, rows, tuple(tokens), tuple(sizes))


def ensure_vlm_data(spec: VlmDataSpec, root: Path = DATA_ROOT) -> VlmDataset:
    """The sources of ``spec`` under ``root``, written unless a matching manifest is there."""
    folder = root / spec.folder_name
    manifest = folder / MANIFEST
    if manifest.exists():
        saved = json.loads(manifest.read_text())
        if saved.get("spec") == asdict(spec):
            return VlmDataset(spec, folder, tuple(_source_of(s) for s in saved["sources"]))
    if folder.exists():
        shutil.rmtree(folder)
    pool = real_pool(Path(spec.real_images)) if spec.real_images else []
    sources = tuple(write_source(i, spec, folder, pool) for i in range(spec.num_sources))
    dataset = VlmDataset(spec, folder, sources)
    record = {
        "spec": asdict(spec),
        "bytes_on_disk": dataset.bytes_on_disk,
        "sources": [asdict(s) for s in sources],
    }
    manifest.write_text(json.dumps(record))
    return dataset


def _source_of(raw: dict[str, object]) -> VlmSource:
    sizes = raw["image_sizes"]
    assert isinstance(sizes, list)
    return VlmSource(
        **{
            **raw,
            "text_tokens": tuple(raw["text_tokens"]),  # type: ignore[arg-type]
            "image_sizes": tuple(tuple((h, w) for h, w in row) for row in sizes),
        }  # type: ignore[arg-type]
    )
