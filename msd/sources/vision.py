"""Decoding images from bytes and cutting them into Qwen2-VL patches, as uint8, without torch.

A Source Loader calls `decode` on each image's bytes: Pillow opens it (a JPEG at full size, or
with `decode="fast"` at the smallest 1/2, 1/4 or 1/8 scale that covers the resized size), it is
turned upright and RGB, resized to `fit` (Qwen2-VL's "smart resize" rule) with a fixed bicubic
filter, and cut into patches by `patchify`. The bytes are untrusted: every failure, from an
unknown format to a decompression bomb, comes back as a `DecodeFailure` value so that the
sample is dropped and counted, never a crash. The same bytes always give the same pixels.
"""

from __future__ import annotations

import io
import logging
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageOps, UnidentifiedImageError

from msd.errors import SourceError

log = logging.getLogger(__name__)

MAX_ASPECT_RATIO = 200
RESAMPLE = Image.Resampling.BICUBIC
# Only formats whose Pillow decoders are self-contained: EPS, for one, would run Ghostscript.
# (Multi-picture camera JPEGs, MPO, open through "JPEG".)
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
_ORIENTATION_TAG = 0x0112
_SWAPPING_ORIENTATIONS = frozenset({5, 6, 7, 8})  # EXIF orientations that exchange height and width
_WHITE = (255, 255, 255, 255)

Pixels = npt.NDArray[np.uint8]
DecodeMode = Literal["exact", "fast"]
DECODE_MODES: tuple[DecodeMode, ...] = ("exact", "fast")


@dataclass(frozen=True)
class ImageGeometry:
    """How an image becomes patches; the defaults are Qwen2-VL's (14-pixel patches, 2×2 merge).

    ``min_pixels`` and ``max_pixels`` bound the area of the resized image. ``max_source_pixels``
    bounds the area a file may declare before anything is decoded (the decompression-bomb guard).
    ``temporal_patch_size`` is 1 for still images: a patch holds one frame. Qwen2-VL's own
    processor uses 2 and repeats the frame, which doubles the bytes; 2 here reproduces that.
    ``decode``: ``exact`` decodes a JPEG at its full size, as Hugging Face's Qwen2-VL processor
    does; ``fast`` lets Pillow's JPEG draft mode decode it at 1/2, 1/4 or 1/8 scale when that
    still covers the resized size (less work on large photos; slightly different pixels).
    """

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 14 * 14 * 4 * 1280
    temporal_patch_size: int = 1
    max_source_pixels: int = 1 << 26
    decode: DecodeMode = "exact"

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, int) and value < 1:
                raise ValueError(f"ImageGeometry.{name} must be at least 1, got {value}")
        if self.decode not in DECODE_MODES:
            raise ValueError(f"ImageGeometry.decode must be exact or fast, got {self.decode!r}")
        if not self.factor**2 <= self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"ImageGeometry needs {self.factor}² <= min_pixels <= max_pixels, "
                f"got min_pixels={self.min_pixels} and max_pixels={self.max_pixels}"
            )

    @property
    def factor(self) -> int:
        """The side of one merged group of patches: every resized side is a multiple of it."""
        return self.patch_size * self.merge_size

    @property
    def patch_values(self) -> int:
        """The length of one flattened patch: channels × frames × patch_size²."""
        return 3 * self.temporal_patch_size * self.patch_size**2


DEFAULT_GEOMETRY = ImageGeometry()


@dataclass(frozen=True, eq=False)
class DecodedImage:
    """An image as patches: ``grid`` is (t, gh, gw) in patches; ``original_hw`` the upright size."""

    patches: Pixels
    grid: tuple[int, int, int]
    tokens: int
    original_hw: tuple[int, int]


@dataclass(frozen=True)
class DecodeFailure:
    """Why an image could not be decoded: a short reason that is the same for the same bytes."""

    reason: str


def fit(height: int, width: int, geometry: ImageGeometry = DEFAULT_GEOMETRY) -> tuple[int, int]:
    """The resized (height, width): multiples of ``factor``, area within the pixel bounds.

    Qwen2-VL's rule: round each side to the nearest multiple of the factor; if the area is then
    too large (small), scale both sides by one factor down (up) to fit, rounding down (up).
    """
    _check_shape(height, width)
    f = geometry.factor
    h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if h * w > geometry.max_pixels:
        beta = math.sqrt(height * width / geometry.max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < geometry.min_pixels:
        beta = math.sqrt(geometry.min_pixels / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h, w


def grid_thw(
    height: int, width: int, geometry: ImageGeometry = DEFAULT_GEOMETRY
) -> tuple[int, int, int]:
    """(frames, patch rows, patch columns) of an image of this original size, once resized."""
    h, w = fit(height, width, geometry)
    return 1, h // geometry.patch_size, w // geometry.patch_size


def placeholder_tokens(height: int, width: int, geometry: ImageGeometry = DEFAULT_GEOMETRY) -> int:
    """How many placeholder tokens the image takes in the text: one per merged group of patches."""
    t, gh, gw = grid_thw(height, width, geometry)
    return t * gh * gw // geometry.merge_size**2


def patchify(
    rgb: Pixels, geometry: ImageGeometry = DEFAULT_GEOMETRY, out: Pixels | None = None
) -> Pixels:
    """Cut an [h, w, 3] uint8 image into [gh*gw, 3*t*p*p] uint8 patches, in Qwen2-VL's order
    (written into ``out`` if given: a C-contiguous array of that shape, in one pass).

    With p = patch_size, m = merge_size and t = temporal_patch_size, patch (r, c) covers pixels
    [r*p:(r+1)*p, c*p:(c+1)*p]. Rows are ordered by merge group, then within a group:
    row = ((r//m * gw//m + c//m) * m + r%m) * m + c%m, so the m×m patches a merger joins are
    contiguous. A row is channel-major: value (ch, frame, py, px) sits at
    ((ch*t + frame)*p + py)*p + px; a still image repeats its one frame t times.
    """
    h, w = _check_patchable(rgb, geometry)
    p, m, t = geometry.patch_size, geometry.merge_size, geometry.temporal_patch_size
    gh, gw = h // p, w // p
    blocks = rgb.reshape(gh // m, m, p, gw // m, m, p, 3)
    # (group row, row in group, py, group column, column in group, px, channel) → patch order.
    ordered = blocks.transpose(0, 3, 1, 4, 6, 2, 5)[:, :, :, :, :, None]
    frames = np.broadcast_to(ordered, (*ordered.shape[:5], t, p, p))
    if out is not None:
        np.copyto(out.reshape(frames.shape), frames)
        return out
    return np.ascontiguousarray(frames).reshape(gh * gw, geometry.patch_values)


def decode(data: bytes, geometry: ImageGeometry = DEFAULT_GEOMETRY) -> DecodedImage | DecodeFailure:
    """The image in ``data`` as patches (an animation's first frame), or why not; never raises."""
    if not data:
        return DecodeFailure("empty")
    try:
        return _decode(data, geometry)
    except Exception as exc:  # untrusted bytes: every failure is data, not a crash
        return _failure(exc)


@dataclass(frozen=True, eq=False)
class EncodedImage:
    """An image known from its header, not decoded yet: its bytes, and the patches and tokens
    its declared size (turned upright) gives. `decode_into` makes its patches."""

    data: bytes
    grid: tuple[int, int, int]
    tokens: int
    original_hw: tuple[int, int]

    @property
    def count(self) -> int:
        """Its patches."""
        t, h, w = self.grid
        return t * h * w


def probe(
    data: bytes, geometry: ImageGeometry = DEFAULT_GEOMETRY
) -> EncodedImage | DecodeFailure | None:
    """The image in ``data`` as its header declares it; or why `decode` refuses it by the
    header (format, size, aspect ratio: the same failure `decode` gives); or None where only
    decoding can tell: a JPEG, PNG or WebP whose bytes end before its framing says the image
    does. Never raises. `decode` gives every image `probe` accepts the grid and tokens `probe`
    says, unless its bytes are damaged past the header (`decode_into` says so)."""
    if not data:
        return DecodeFailure("empty")
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            if image.format == "PNG" and b"eXIf" in data:
                return None  # Pillow reads a PNG's EXIF by decoding it (it may follow the pixels)
            header = _header(image, geometry, exif=image.format != "PNG")
            if isinstance(header, DecodeFailure):
                return header
            if not _complete(data, image.format):
                return None
    except Exception as exc:  # untrusted bytes, as in decode
        return _failure(exc)
    height, width = header[0]
    return EncodedImage(
        data,
        grid_thw(height, width, geometry),
        placeholder_tokens(height, width, geometry),
        (height, width),
    )


def decode_into(
    image: EncodedImage, out: Pixels, geometry: ImageGeometry = DEFAULT_GEOMETRY
) -> bool:
    """Decode an image `probe` accepted into ``out`` (its patches' rows, C-contiguous); False
    where its bytes do not decode to the grid its header declared (``out`` is then left as it
    was: nothing of it can be used). Never raises."""
    if out.shape != (image.count, geometry.patch_values):
        return False
    try:
        return isinstance(_decode(image.data, geometry, out), DecodedImage)
    except Exception as exc:  # untrusted bytes, as in decode
        _failure(exc)
        return False


def _failure(exc: Exception) -> DecodeFailure:
    reason = _reason(exc)
    log.debug("image not decoded: %s (%s: %s)", reason, type(exc).__name__, exc)
    return DecodeFailure(reason)


def _header(
    image: Image.Image, geometry: ImageGeometry, exif: bool = True
) -> tuple[tuple[int, int], int | None] | DecodeFailure:
    """The upright (height, width) an opened image declares and its EXIF orientation, or why
    it is refused before decoding (``exif`` False: it has none)."""
    stored_w, stored_h = image.size
    rejected = _rejection(stored_h, stored_w, geometry)
    if rejected is not None:
        return DecodeFailure(rejected)
    orientation = image.getexif().get(_ORIENTATION_TAG) if exif else None
    swapped = orientation in _SWAPPING_ORIENTATIONS
    return ((stored_w, stored_h) if swapped else (stored_h, stored_w)), orientation


def _complete(data: bytes, fmt: str | None) -> bool:
    """Whether ``data`` holds the whole image as far as its framing tells, without decoding:
    a JPEG's end-of-image marker after its last scan, a PNG's IEND chunk, a WebP's RIFF size
    (what Pillow would find truncated when it decodes). Other formats: assumed whole."""
    if fmt == "JPEG":
        return data.rfind(b"\xff\xd9") > data.rfind(b"\xff\xda") >= 0
    if fmt == "PNG":
        return data.rfind(b"IEND") > 0
    if fmt == "WEBP":
        return len(data) >= 8 + int.from_bytes(data[4:8], "little")
    return True


def _decode(
    data: bytes, geometry: ImageGeometry, out: Pixels | None = None
) -> DecodedImage | DecodeFailure:
    with Image.open(io.BytesIO(data), formats=FORMATS) as image:
        header = _header(image, geometry)
        if isinstance(header, DecodeFailure):
            return header
        (height, width), orientation = header
        swapped = orientation in _SWAPPING_ORIENTATIONS
        h, w = fit(height, width, geometry)
        if out is not None and len(out) != (h // geometry.patch_size) * (w // geometry.patch_size):
            return DecodeFailure("another size than expected")
        if image.format == "JPEG" and geometry.decode == "fast":
            # Decode at 1/2, 1/4 or 1/8 scale where that still covers h×w (scaled in the DCT:
            # not the pixels a full-size decode and resize give).
            image.draft("RGB", (h, w) if swapped else (w, h))
        # Turning upright copies the whole image: only when its EXIF says it is not upright.
        upright = image if orientation in (None, 1) else ImageOps.exif_transpose(image)
        rgb = _to_rgb(upright).resize((w, h), RESAMPLE)
    patches = patchify(np.asarray(rgb, dtype=np.uint8), geometry, out)
    tokens = placeholder_tokens(height, width, geometry)
    return DecodedImage(patches, grid_thw(height, width, geometry), tokens, (height, width))


def _rejection(height: int, width: int, geometry: ImageGeometry) -> str | None:
    """Why an image of this declared size is refused before decoding, if it is."""
    if height < 1 or width < 1:
        return "no pixels"
    if height * width > geometry.max_source_pixels:
        return "too many pixels"
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        return f"aspect ratio over {MAX_ASPECT_RATIO}"
    return None


def _to_rgb(image: Image.Image) -> Image.Image:
    """The image as RGB: transparency composited onto white, 16-bit grey scaled to 8 bits."""
    if image.mode == "RGB":
        return image
    if image.mode == "I" or image.mode.startswith("I;16"):
        grey = np.clip(np.asarray(image), 0, 0xFFFF) >> 8
        return Image.fromarray(grey.astype(np.uint8)).convert("RGB")
    if image.has_transparency_data:
        canvas = Image.new("RGBA", image.size, _WHITE)
        canvas.alpha_composite(image.convert("RGBA"))
        return canvas.convert("RGB")
    return image.convert("RGB")


def _reason(exc: Exception) -> str:
    """A short reason for a decoding failure, the same for the same bytes."""
    if isinstance(exc, Image.DecompressionBombError):
        return "decompression bomb"
    if isinstance(exc, UnidentifiedImageError):
        return "cannot identify image"
    if "truncat" in str(exc).lower():
        return "truncated"
    return f"cannot decode ({type(exc).__name__})"


def _check_shape(height: int, width: int) -> None:
    if height < 1 or width < 1:
        raise SourceError(f"an image needs at least one pixel, got {height}×{width}")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise SourceError(
            f"an image of {height}×{width} pixels has aspect ratio {ratio:.1f}, over the limit "
            f"of {MAX_ASPECT_RATIO}; crop it or drop it from the source"
        )


def _check_patchable(rgb: Pixels, geometry: ImageGeometry) -> tuple[int, int]:
    f = geometry.factor
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"patchify needs an [h, w, 3] uint8 array, got {rgb.dtype} {rgb.shape}")
    h, w = rgb.shape[:2]
    if h % f or w % f:
        raise ValueError(f"patchify needs sides that are multiples of {f}, got {h}×{w}")
    return h, w
