"""Images planned from their headers and decoded when routed: `vision.probe` declares what
`vision.decode` gives, a loader's Fuser holds a sample's images as their bytes (where that is
smaller), and a header that lies is handled the same way every time."""

from __future__ import annotations

import io
import struct
import zlib
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from msd.batch.sample import EncodedImages, SampleImages
from msd.sources.fuse import DAMAGED, UNDECODABLE, Fuser, FuseSpec
from msd.sources.image_rows import ROW_TYPE, rows_of
from msd.sources.transforms import text_bytes
from msd.sources.vision import (
    DecodedImage,
    DecodeFailure,
    EncodedImage,
    ImageGeometry,
    decode,
    probe,
)

GEOMETRY = ImageGeometry(max_pixels=64 * 28 * 28)
IMG = 151655
MARKER = "<image>"
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")


def _smooth(height: int, width: int, fmt: str, seed: int = 0) -> bytes:
    """A photo-like image (smooth, so it compresses as photos do)."""
    y, x = np.mgrid[0:height, 0:width]
    phase = seed * 0.7
    pixels = np.stack(
        [
            127 + 120 * np.sin(x / 23 + phase),
            127 + 120 * np.cos(y / 31 - phase),
            127 + 120 * np.sin((x + y) / 41),
        ],
        axis=-1,
    ).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, fmt)
    return out.getvalue()


def _noise(height: int, width: int, fmt: str = "PNG") -> bytes:
    """An image whose bytes are more than its patches (noise does not compress)."""
    pixels = np.random.default_rng(1).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, fmt)
    return out.getvalue()


def _rotated_jpeg(height: int, width: int) -> bytes:
    """A JPEG stored ``height × width`` whose EXIF says to turn it a quarter (orientation 6)."""
    image = Image.open(io.BytesIO(_smooth(height, width, "JPEG")))
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif.tobytes())
    return out.getvalue()


def _lying_png(height: int, width: int, declared_height: int) -> bytes:
    """A whole PNG (IEND and all) whose header declares more rows than its data holds."""
    data = bytearray(_smooth(height, width, "PNG"))
    at = data.index(b"IHDR")
    body = bytearray(data[at : at + 17])
    body[8:12] = struct.pack(">I", declared_height)
    data[at : at + 17] = body
    data[at + 17 : at + 21] = struct.pack(">I", zlib.crc32(bytes(body)))
    return bytes(data)


def _rows(texts: list[bytes], images: list[list[bytes]]) -> pa.StructArray:
    return rows_of(
        pa.array(texts, pa.large_binary()),
        pa.array(images, ROW_TYPE[1].type),
        pa.array([[] for _ in texts], ROW_TYPE[2].type),
    )


def _fuser(defer: bool) -> Fuser:
    spec = FuseSpec(GEOMETRY, image_token_id=IMG, marker=MARKER, seq_len=1 << 20)
    return Fuser(text_bytes, spec, require_text=False, defer=defer)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("size", [(60, 90), (333, 201), (1000, 700)])
def test_probe_declares_the_grid_and_tokens_decode_gives(fmt: str, size: tuple[int, int]) -> None:
    data = _smooth(*size, fmt)
    found, decoded = probe(data, GEOMETRY), decode(data, GEOMETRY)
    assert isinstance(found, EncodedImage) and isinstance(decoded, DecodedImage)
    assert (found.grid, found.tokens, found.original_hw) == (
        decoded.grid,
        decoded.tokens,
        decoded.original_hw,
    )
    assert found.count == len(decoded.patches) and found.data == data


def test_probe_turns_the_declared_size_upright_as_decode_does() -> None:
    data = _rotated_jpeg(120, 400)
    found, decoded = probe(data, GEOMETRY), decode(data, GEOMETRY)
    assert isinstance(found, EncodedImage) and isinstance(decoded, DecodedImage)
    assert found.original_hw == decoded.original_hw == (400, 120)
    assert found.grid == decoded.grid


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_bytes_that_end_before_their_image_are_left_to_decode(fmt: str) -> None:
    data = _smooth(300, 300, fmt)
    cut = data[: len(data) // 2]
    failure = decode(cut, GEOMETRY)
    assert isinstance(failure, DecodeFailure)
    # Only decoding can tell (the Fuser decodes it now), or reading the header already fails
    # as decoding does.
    assert probe(cut, GEOMETRY) in (None, failure)


@pytest.mark.parametrize(
    ("data", "geometry"),
    [
        (b"not an image at all", GEOMETRY),
        (b"", GEOMETRY),
        (_smooth(400, 400, "PNG"), ImageGeometry(max_pixels=64 * 28 * 28, max_source_pixels=1000)),
        (_smooth(2, 500, "PNG"), GEOMETRY),  # aspect ratio over the limit
    ],
    ids=["garbage", "empty", "too-many-pixels", "aspect-ratio"],
)
def test_what_the_header_refuses_is_refused_as_decode_refuses_it(
    data: bytes, geometry: ImageGeometry
) -> None:
    found = probe(data, geometry)
    assert isinstance(found, DecodeFailure)
    assert found == decode(data, geometry)


def test_a_deferred_fuser_plans_the_same_samples_and_decodes_the_same_patches() -> None:
    images = [_smooth(200, 300, "JPEG", seed=1), _smooth(150, 150, "PNG", seed=2)]
    webp = _smooth(260, 180, "WEBP", seed=3)
    noise = _noise(84, 84)
    cut = _smooth(300, 300, "JPEG")[:900]
    rows = _rows(
        [b"a<image>b<image>c", b"<image>x", b"plain", b"n<image>", b"<image>y<image>"],
        [images, [webp], [], [noise], [cut, images[0]]],
    )
    eager, deferred = _fuser(defer=False), _fuser(defer=True)
    ids_e, held_e = eager(rows)
    ids_d, held_d = deferred(rows)
    assert [i.tolist() for i in ids_d] == [i.tolist() for i in ids_e]
    # Held as bytes where those are smaller; the noise image (bytes > patches) and the sample
    # with an image whose end is missing are decoded as they are read.
    assert isinstance(held_d[0], EncodedImages) and isinstance(held_d[1], EncodedImages)
    assert held_d[2] is None
    assert isinstance(held_d[3], SampleImages) and isinstance(held_d[4], SampleImages)
    for e, d in zip(held_e, held_d, strict=True):
        if e is None:
            assert d is None
            continue
        assert d is not None and d.grids == e.grids
        assert d.nbytes <= e.nbytes
        patches = deferred.decoded(d).patches
        assert patches.dtype == np.uint8 and np.array_equal(patches, e.patches)
    assert deferred.skips == eager.skips == Counter({UNDECODABLE: 1})
    held = sum(h.nbytes for h in held_d[:2] if h is not None)
    assert held * 5 < sum(h.nbytes for h in held_e[:2] if h is not None)


def test_a_header_that_declares_more_rows_than_its_data_holds_is_planned_as_declared() -> None:
    liar = _lying_png(56, 84, declared_height=112)
    found = probe(liar, GEOMETRY)
    assert isinstance(found, EncodedImage) and found.original_hw == (112, 84)
    rows = _rows([b"a<image>b"], [[liar]])
    eager, deferred = _fuser(defer=False), _fuser(defer=True)
    (ids_e,), (held_e,) = eager(rows)
    (ids_d,), (held_d,) = deferred(rows)
    # The header wins, as when decoding as the image is read: the declared grid, the rows the
    # data lacks as the decoder fills them; the same samples and pixels either way.
    assert ids_d.tolist() == ids_e.tolist() == list(b"a") + [IMG] * found.tokens + list(b"b")
    assert isinstance(held_d, EncodedImages) and isinstance(held_e, SampleImages)
    assert held_d.grids == held_e.grids == (found.grid,)
    assert np.array_equal(deferred.decoded(held_d).patches, held_e.patches)
    assert not deferred.skips and not eager.skips


def _damaged_png(height: int, width: int) -> bytes:
    """A PNG whose header and framing are whole (IEND, checksums) but whose pixel data is not."""
    data = bytearray(_smooth(height, width, "PNG"))
    at = data.index(b"IDAT")
    size = struct.unpack(">I", data[at - 4 : at])[0]
    for k in range(16):
        data[at + 4 + size // 2 + k] ^= 0x5A
    data[at + 4 + size : at + 8 + size] = struct.pack(
        ">I", zlib.crc32(bytes(data[at : at + 4 + size]))
    )
    return bytes(data)


def test_an_image_damaged_past_its_header_keeps_its_planned_place_is_sent_black_and_counted() -> (
    None
):
    damaged = _damaged_png(150, 150)
    found = probe(damaged, GEOMETRY)
    assert isinstance(found, EncodedImage)
    assert isinstance(decode(damaged, GEOMETRY), DecodeFailure)
    rows = _rows([b"a<image>b"], [[damaged]])

    def run() -> tuple[list[int], bytes, Counter[str]]:
        fuser = _fuser(defer=True)
        ids, held = fuser(rows)
        assert isinstance(held[0], EncodedImages) and held[0].grids == (found.grid,)
        patches = fuser.decoded(held[0]).patches
        return ids[0].tolist(), patches.tobytes(), fuser.skips

    ids, pixels, skips = run()
    # What was planned is what is sent: the placeholders its header declared, patches black.
    assert ids == list(b"a") + [IMG] * found.tokens + list(b"b")
    assert pixels == bytes(found.count * GEOMETRY.patch_values)
    assert skips == Counter({DAMAGED: 1})
    assert run() == (ids, pixels, skips)  # the same every time


def test_a_png_with_exif_is_left_to_decode() -> None:
    """Pillow finds a PNG's EXIF (its orientation) only by decoding it."""
    image = Image.open(io.BytesIO(_smooth(120, 80, "PNG")))
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.save(out, "PNG", exif=exif.tobytes())
    decoded = decode(out.getvalue(), GEOMETRY)
    assert probe(out.getvalue(), GEOMETRY) is None
    assert isinstance(decoded, DecodedImage) and decoded.original_hw == (80, 120)
