"""One image-text sample as the trainer sees it: text tokens with a run of placeholder tokens
at each image's place, and the images' patches (pure: bytes in, arrays out, no sockets).

The text holds one ``marker`` per image, in order; without markers the images precede the
text. Image ``i`` takes ``patches_i / merge_size²`` tokens ``image_token_id`` where its marker
was. What cannot be used is left out and counted by reason (`Skips`), the same way on every
run: an image that does not decode, or has no bytes (its marker goes with it); markers and
images that do not pair up (the extra ones); a sample without text.

An image is never cut across rows, so its pixels stay with its tokens. With ``long_samples:
split`` (the Planner cuts a long sample at multiples of ``seq_len``) fillers move an image that
would cross a row boundary to the next row; an image longer than a row, or past the step's
rows, is left out. Otherwise a sample with images is fitted into one row: an image whose
tokens would end past ``seq_len`` is left out with every later one, then the text past it.
With ``max_patches``, no piece holds more patches: an image that would pass it goes to the
next row (``split``) or is left out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from msd.recipe.schema import Recipe, Vision
from msd.sample import FILLER, SampleImages
from msd.sources.transforms import Ids, Tokenize
from msd.sources.vision import DecodedImage, DecodeFailure, ImageGeometry, decode

Skips = Counter[str]
_EMPTY: Ids = np.zeros(0, dtype=np.int32)
# The reasons counted (what ``msd status`` shows per source).
UNDECODABLE = "images undecodable"
NO_BYTES = "images without bytes"
UNPAIRED_IMAGE = "images without a marker"
UNPAIRED_MARKER = "markers without an image"
PAST_ROW = "images past seq_len"
CUT_TOKENS = "text tokens cut after an image"
NO_TEXT = "samples without text"
OVER_PATCHES = "images over max_patches"


@dataclass(frozen=True)
class FuseSpec:
    """``long_samples`` as in the recipe's ``balance``: ``split`` puts fillers before an image
    that would cross a multiple of ``seq_len`` (where the Planner cuts), so that an image is
    never split; ``max_rows``: a step's rows, the most pieces a sample may be cut into."""

    geometry: ImageGeometry
    image_token_id: int
    marker: str
    seq_len: int
    long_samples: str = "truncate"
    max_rows: int = 1
    max_patches: int | None = None  # of one piece (a row's share of a micro-batch's budget)


def geometry_of(vision: Vision) -> ImageGeometry:
    """How a recipe's ``vision`` section cuts images into patches."""
    return ImageGeometry(
        patch_size=vision.patch_size,
        merge_size=vision.merge_size,
        min_pixels=vision.min_pixels,
        max_pixels=vision.max_pixels,
        temporal_patch_size=vision.temporal_patch_size,
    )


def fuse_spec(recipe: Recipe) -> FuseSpec:
    """How this recipe's image samples are made."""
    v = recipe.vision
    geometry = geometry_of(v)
    rows = recipe.global_batch_tokens // recipe.seq_len
    return FuseSpec(
        geometry,
        v.image_token_id,
        v.marker,
        recipe.seq_len,
        recipe.balance.long_samples,
        rows,
        recipe.balance.max_patches,
    )


def decode_all(
    images: Sequence[bytes | None], geometry: ImageGeometry, skips: Skips
) -> list[DecodedImage | None]:
    """Each image decoded, or None (counted) when it has no bytes or does not decode."""
    out: list[DecodedImage | None] = []
    for data in images:
        if data is None or not len(data):
            skips[NO_BYTES] += 1
            out.append(None)
            continue
        decoded = decode(bytes(data), geometry)
        if isinstance(decoded, DecodeFailure):
            skips[UNDECODABLE] += 1
            out.append(None)
        else:
            out.append(decoded)
    return out


def fuse(
    segments: Sequence[Ids],
    images: Sequence[DecodedImage | None],
    spec: FuseSpec,
    skips: Skips,
) -> tuple[Ids, SampleImages | None]:
    """The fused ids of a sample whose text tokenized to ``segments`` (one more than markers,
    or one: no markers) and its images (None: not decoded), and the images kept."""
    order, head = _pair(segments, images, skips)
    parts: list[Ids] = [] if head is None else [head]
    length = 0 if head is None else len(head)
    kept: list[DecodedImage] = []
    full = False  # no later image fits
    piece_patches: dict[int, int] = {}  # piece → its images' patches so far
    for image, text in order:
        if image is not None:
            fill = None if full else _fill(length, image.tokens, spec)
            if fill is not None and spec.max_patches is not None:
                fill = _within_patches(length, fill, image, spec, piece_patches, skips)
            elif fill is None:
                skips[PAST_ROW] += 1
                full = full or spec.long_samples != "split" or image.tokens <= spec.seq_len
            if fill is not None:
                if fill:
                    parts.append(np.full(fill, FILLER, dtype=np.int32))
                parts.append(np.full(image.tokens, spec.image_token_id, dtype=np.int32))
                length += fill + image.tokens
                kept.append(image)
        if text is not None:
            parts.append(text)
            length += len(text)
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    ids = ids.astype(np.int32, copy=False)
    if not kept:
        return ids, None
    limit = _limit(spec)
    if limit is not None and len(ids) > limit:
        skips[CUT_TOKENS] += len(ids) - limit
        ids = ids[:limit]
    patches = np.concatenate([im.patches for im in kept])
    return ids, SampleImages(patches, tuple(im.grid for im in kept))


def _pair(
    segments: Sequence[Ids], images: Sequence[DecodedImage | None], skips: Skips
) -> tuple[list[tuple[DecodedImage | None, Ids | None]], Ids | None]:
    """(image, the text after it) in order, and the text before the first image."""
    markers = len(segments) - 1
    if markers == 0:  # no markers: the images precede the text
        order: list[tuple[DecodedImage | None, Ids | None]] = [(im, None) for im in images]
        return [*order, (None, segments[0])], None
    pairs = min(markers, len(images))
    for reason, n in ((UNPAIRED_IMAGE, len(images) - pairs), (UNPAIRED_MARKER, markers - pairs)):
        if n:
            skips[reason] += n
    return [(images[k] if k < pairs else None, segments[k + 1]) for k in range(markers)], segments[
        0
    ]


def _within_patches(
    length: int,
    fill: int,
    image: DecodedImage,
    spec: FuseSpec,
    patches: dict[int, int],
    skips: Skips,
) -> int | None:
    """``fill``, or more fillers to move the image to the next row (``split``), so that no piece
    of the sample holds more than ``max_patches`` patches; None (counted): it cannot be."""
    assert spec.max_patches is not None
    own = len(image.patches)
    split = spec.long_samples == "split"
    piece = (length + fill) // spec.seq_len if split else 0
    if own <= spec.max_patches and patches.get(piece, 0) + own > spec.max_patches and split:
        piece += 1  # the next row: no image is there yet
        fill = piece * spec.seq_len - length
        limit = _limit(spec)
        if limit is not None and length + fill + image.tokens > limit:
            skips[PAST_ROW] += 1
            return None
    if patches.get(piece, 0) + own > spec.max_patches:
        skips[OVER_PATCHES] += 1
        return None
    patches[piece] = patches.get(piece, 0) + own
    return fill


def _fill(length: int, tokens: int, spec: FuseSpec) -> int | None:
    """Fillers to put before an image of ``tokens`` placeholders starting at ``length`` so it
    does not cross a row boundary (``split``: the sample is cut at multiples of ``seq_len``);
    None: it cannot be placed."""
    s = spec.seq_len
    if spec.long_samples == "drop":
        return 0  # a sample that does not fit one row is dropped whole by the Planner
    if spec.long_samples != "split":
        return 0 if length + tokens <= s else None
    if tokens > s:
        return None
    boundary = (length // s + 1) * s
    fill = boundary - length if length + tokens > boundary else 0
    limit = _limit(spec)
    return None if limit is not None and length + fill + tokens > limit else fill


def _limit(spec: FuseSpec) -> int | None:
    """The most tokens a sample with images keeps: one row (``truncate``), a step's rows
    (``split``: the Planner never cuts it further), any (``drop``: it is dropped if long)."""
    if spec.long_samples == "drop":
        return None
    if spec.long_samples == "split":
        return spec.seq_len * spec.max_rows
    return spec.seq_len


class Fuser:
    """Turns rows of an image source (``msd.sources.image_rows.ROW_TYPE``) into samples; counts
    what it leaves out in ``skips``. ``require_text``: a row without text is left out whole
    (a WebDataset key without its text member), else it is the images alone."""

    def __init__(self, tokenize: Tokenize, spec: FuseSpec, require_text: bool) -> None:
        self.tokenize, self.spec, self.require_text = tokenize, spec, require_text
        self.skips: Skips = Counter()
        self.images_read = 0
        self.skipped_per_sample: list[int] = []  # of the rows of the last call: images left out
        self._marker = spec.marker.encode("utf-8")

    def __call__(self, rows: pa.StructArray) -> tuple[list[Ids], list[SampleImages | None]]:
        texts: list[bytes | None] = rows.field("text").to_pylist()
        images: list[list[bytes | None] | None] = rows.field("images").to_pylist()
        segments: list[list[bytes]] = []
        for text in texts:
            if text is None and self.require_text:
                segments.append([])
            elif self._marker:
                segments.append((text or b"").split(self._marker))
            else:
                segments.append([text or b""])
        flat = [seg for row in segments for seg in row]
        tokens = self.tokenize(pa.array(flat, pa.large_binary())) if flat else []
        ids: list[Ids] = []
        kept: list[SampleImages | None] = []
        self.skipped_per_sample = []
        at = 0
        for row, own in zip(segments, images, strict=True):
            self.images_read += len(own or [])
            if not row:
                self.skips[NO_TEXT] += 1
                ids.append(_EMPTY)
                kept.append(None)
                self.skipped_per_sample.append(len(own or []))
                continue
            own = own or []
            paired = len(own) if len(row) == 1 else min(len(own), len(row) - 1)
            decoded = decode_all(own[:paired], self.spec.geometry, self.skips)
            decoded += [None] * (len(own) - paired)  # unpaired: counted by fuse, not decoded
            sample, pixels = fuse(tokens[at : at + len(row)], decoded, self.spec, self.skips)
            at += len(row)
            ids.append(sample)
            kept.append(pixels)
            self.skipped_per_sample.append(
                len(own or []) - (0 if pixels is None else len(pixels.grids))
            )
        return ids, kept
