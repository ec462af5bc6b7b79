"""Decoding and patchifying images: real images made in memory with Pillow."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from msd.errors import SourceError
from msd.sources.vision import (
    DEFAULT_GEOMETRY,
    MAX_ASPECT_RATIO,
    RESAMPLE,
    DecodedImage,
    DecodeFailure,
    ImageGeometry,
    decode,
    fit,
    grid_thw,
    patchify,
    placeholder_tokens,
)

GEOMETRIES = (
    DEFAULT_GEOMETRY,
    ImageGeometry(min_pixels=4 * 28 * 28, max_pixels=16384 * 28 * 28),  # Qwen2.5-VL's range
    ImageGeometry(min_pixels=256 * 28 * 28, max_pixels=1280 * 28 * 28),
    ImageGeometry(patch_size=16, merge_size=2, min_pixels=64 * 64, max_pixels=1024 * 1024),
)


def _noise(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)


def _encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _decoded(data: bytes, geometry: ImageGeometry = DEFAULT_GEOMETRY) -> DecodedImage:
    result = decode(data, geometry)
    assert isinstance(result, DecodedImage), result
    return result


def _unpatchify(patches: np.ndarray, grid: tuple[int, int, int], g: ImageGeometry) -> np.ndarray:
    """The image back from its patches, patch by patch, following patchify's documented layout."""
    _, gh, gw = grid
    p, m, t = g.patch_size, g.merge_size, g.temporal_patch_size
    image = np.zeros((gh * p, gw * p, 3), dtype=np.uint8)
    for r in range(gh):
        for c in range(gw):
            row = ((r // m * (gw // m) + c // m) * m + r % m) * m + c % m
            values = patches[row].reshape(3, t, p, p)
            for frame in range(t):  # a still image repeats its one frame
                assert np.array_equal(values[:, frame], values[:, 0])
            image[r * p : (r + 1) * p, c * p : (c + 1) * p] = values[:, 0].transpose(1, 2, 0)
    return image


def _qwen_reference(rgb: np.ndarray, g: ImageGeometry) -> np.ndarray:
    """Qwen2-VL's processor order: frames tiled, then one reshape and one transpose."""
    p, m, t = g.patch_size, g.merge_size, g.temporal_patch_size
    chw = np.repeat(rgb.transpose(2, 0, 1)[None], t, axis=0)  # [t, c, h, w]
    gh, gw = rgb.shape[0] // p, rgb.shape[1] // p
    x = chw.reshape(1, t, 3, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gh * gw, 3 * t * p * p)


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares a size and holds no pixels (a decompression bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


# fit ---------------------------------------------------------------------------------------------

sides = st.integers(min_value=1, max_value=20_000)


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, int]:
    h = draw(sides)
    w = draw(st.integers(min_value=max(1, -(-h // MAX_ASPECT_RATIO)), max_value=h * 200))
    return h, min(w, 4_000_000)


@settings(max_examples=400)
@given(shapes(), st.sampled_from(GEOMETRIES))
def test_fit_gives_multiples_of_the_factor_within_the_pixel_bounds(
    shape: tuple[int, int], g: ImageGeometry
) -> None:
    h, w = fit(*shape, g)
    assert h % g.factor == 0 and w % g.factor == 0
    assert g.min_pixels <= h * w <= g.max_pixels


@settings(max_examples=400)
@given(shapes(), st.sampled_from(GEOMETRIES))
def test_fit_keeps_the_aspect_ratio_within_one_factor_step(
    shape: tuple[int, int], g: ImageGeometry
) -> None:
    height, width = shape
    h, w = fit(height, width, g)
    # One scale s brings both sides within a factor of the result.
    low = max((h - g.factor) / height, (w - g.factor) / width)
    high = min((h + g.factor) / height, (w + g.factor) / width)
    assert low <= high * (1 + 1e-9)


@given(shapes(), st.sampled_from(GEOMETRIES))
def test_fit_leaves_a_fitted_size_unchanged(shape: tuple[int, int], g: ImageGeometry) -> None:
    fitted = fit(*shape, g)
    assume(max(fitted) / min(fitted) <= MAX_ASPECT_RATIO)  # rounding can push a strip past it
    assert fit(*fitted, g) == fitted


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ((1, 1), (56, 56)),
        ((32, 32), (56, 56)),
        ((480, 640), (476, 644)),
        ((1536, 2048), (840, 1148)),
    ],
)
def test_fit_of_known_sizes(shape: tuple[int, int], expected: tuple[int, int]) -> None:
    assert fit(*shape) == expected


@pytest.mark.parametrize("shape", [(1, 300), (300, 1), (0, 10)])
def test_fit_rejects_an_absurd_shape(shape: tuple[int, int]) -> None:
    with pytest.raises(SourceError):
        fit(*shape)


@given(shapes(), st.sampled_from(GEOMETRIES))
def test_tokens_are_the_grid_over_the_merge_area(shape: tuple[int, int], g: ImageGeometry) -> None:
    t, gh, gw = grid_thw(*shape, g)
    h, w = fit(*shape, g)
    assert (t, gh * g.patch_size, gw * g.patch_size) == (1, h, w)
    assert placeholder_tokens(*shape, g) * g.merge_size**2 == gh * gw


def test_a_geometry_out_of_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="min_pixels"):
        ImageGeometry(min_pixels=10)
    with pytest.raises(ValueError, match="patch_size"):
        ImageGeometry(patch_size=0)


# patchify ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("temporal", [1, 2])
def test_patchify_follows_the_qwen2_vl_order(temporal: int) -> None:
    g = ImageGeometry(temporal_patch_size=temporal)
    rgb = _noise(56, 112)
    patches = patchify(rgb, g)
    assert patches.dtype == np.uint8 and patches.shape == (4 * 8, 3 * temporal * 14 * 14)
    assert np.array_equal(patches, _qwen_reference(rgb, g))


@pytest.mark.parametrize("temporal", [1, 2])
def test_unpatchify_gives_the_image_back(temporal: int) -> None:
    g = ImageGeometry(temporal_patch_size=temporal)
    rgb = _noise(84, 140, seed=3)
    assert np.array_equal(_unpatchify(patchify(rgb, g), (1, 6, 10), g), rgb)


def test_patchify_refuses_what_is_not_a_fitted_rgb_image() -> None:
    with pytest.raises(ValueError, match="multiples of 28"):
        patchify(_noise(30, 28))
    with pytest.raises(ValueError, match="uint8"):
        patchify(np.zeros((28, 28, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="uint8"):
        patchify(_noise(28, 28, channels=4))


# decode ------------------------------------------------------------------------------------------

SIZES = [(1, 1), (32, 32), (480, 640), (1536, 2048)]


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
@pytest.mark.parametrize("shape", SIZES)
def test_decode_gives_the_fitted_grid(fmt: str, shape: tuple[int, int]) -> None:
    height, width = shape
    decoded = _decoded(_encode(Image.fromarray(_noise(height, width)), fmt))
    t, gh, gw = decoded.grid
    assert (t, gh, gw) == grid_thw(height, width)
    assert decoded.original_hw == shape
    assert decoded.patches.dtype == np.uint8
    assert decoded.patches.shape == (gh * gw, 3 * 14 * 14)
    assert decoded.tokens == decoded.patches.shape[0] // 4 == placeholder_tokens(height, width)


@pytest.mark.parametrize("shape", SIZES)
def test_patches_are_exactly_the_resized_image(shape: tuple[int, int]) -> None:
    height, width = shape
    image = Image.fromarray(_noise(height, width, seed=7))
    decoded = _decoded(_encode(image, "PNG"))
    h, w = fit(height, width)
    expected = np.asarray(image.resize((w, h), RESAMPLE))
    assert np.array_equal(_unpatchify(decoded.patches, decoded.grid, DEFAULT_GEOMETRY), expected)


def test_a_large_jpeg_decoded_at_reduced_scale_stays_close_to_the_full_decode() -> None:
    y, x = np.mgrid[0:1536, 0:2048]
    smooth = np.stack([x * 255 // 2047, y * 255 // 1535, (x + y) * 255 // 3582], axis=-1)
    data = _encode(Image.fromarray(smooth.astype(np.uint8)), "JPEG", quality=95)
    fast = ImageGeometry(max_pixels=14 * 14 * 4 * 256, decode="fast")  # 504×364: a quarter scale
    decoded = _decoded(data, fast)
    h, w = fit(1536, 2048, fast)
    full = Image.open(io.BytesIO(data)).convert("RGB").resize((w, h), RESAMPLE)
    got = _unpatchify(decoded.patches, decoded.grid, fast).astype(int)
    assert np.abs(got - np.asarray(full).astype(int)).mean() < 2.0


@pytest.mark.parametrize(
    ("image", "fmt", "expected"),
    [
        (Image.new("L", (40, 30), 100), "PNG", (100, 100, 100)),
        (Image.new("RGBA", (40, 30), (10, 20, 30, 0)), "PNG", (255, 255, 255)),  # onto white
        (Image.new("RGBA", (40, 30), (10, 20, 30, 255)), "WEBP", (10, 20, 30)),
        (Image.new("RGB", (40, 30), (200, 0, 0)).quantize(4), "PNG", (200, 0, 0)),
        (Image.new("CMYK", (40, 30), (0, 0, 0, 0)), "JPEG", (255, 255, 255)),
        (Image.fromarray(np.full((30, 40), 0x6400, dtype=np.uint16)), "PNG", (100, 100, 100)),
    ],
    ids=["L", "RGBA-transparent", "RGBA-opaque", "P", "CMYK", "I16"],
)
def test_every_mode_becomes_rgb(image: Image.Image, fmt: str, expected: tuple[int, ...]) -> None:
    options = {"lossless": True} if fmt == "WEBP" else {}
    patches = _decoded(_encode(image, fmt, **options)).patches.reshape(-1, 3, 14 * 14)
    assert np.abs(patches.astype(int) - np.array(expected)[None, :, None]).max() <= 1


def test_a_transparent_palette_entry_becomes_white() -> None:
    image = Image.new("P", (40, 30), 1)
    image.putpalette([0, 0, 0, 50, 60, 70] + [0] * 762)
    patches = _decoded(_encode(image, "PNG", transparency=1)).patches
    assert (patches == 255).all()


def test_exif_orientation_turns_the_image_upright() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90° clockwise: stored 64 wide and 32 high, shown 32 wide
    data = _encode(Image.fromarray(_noise(32, 64)), "JPEG", exif=exif)
    decoded = _decoded(data)
    assert decoded.original_hw == (64, 32)
    assert decoded.grid == grid_thw(64, 32)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    expected = np.asarray(upright.resize(fit(64, 32)[::-1], RESAMPLE))
    assert np.array_equal(_unpatchify(decoded.patches, decoded.grid, DEFAULT_GEOMETRY), expected)


def test_decoding_twice_gives_identical_bytes() -> None:
    data = _encode(Image.fromarray(_noise(480, 640, seed=5)), "JPEG")
    assert _decoded(data).patches.tobytes() == _decoded(data).patches.tobytes()


# failures ----------------------------------------------------------------------------------------

_JPEG = _encode(Image.fromarray(_noise(480, 640, seed=9)), "JPEG")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"this is not an image", "cannot identify image"),
        (_JPEG[: len(_JPEG) // 2], "truncated"),
        (_encode(Image.fromarray(_noise(1, 300)), "PNG"), "aspect ratio over 200"),
        (_png_header(100_000, 100_000), "decompression bomb"),  # Pillow's own limit
        (_png_header(9_000, 9_000), "too many pixels"),  # under Pillow's limit, over ours
        (_encode(Image.new("RGB", (8, 8)), "PPM"), "cannot identify image"),  # not allowed
    ],
    ids=["empty", "garbage", "truncated-jpeg", "strip", "bomb", "too-large", "ppm"],
)
def test_a_bad_image_is_a_failure_value(data: bytes, reason: str) -> None:
    assert decode(data) == DecodeFailure(reason)


def test_a_truncated_png_is_a_failure_value() -> None:
    data = _encode(Image.fromarray(_noise(200, 200)), "PNG")
    assert isinstance(decode(data[: len(data) // 2]), DecodeFailure)


def test_the_pixel_limit_follows_the_geometry() -> None:
    data = _encode(Image.fromarray(_noise(100, 100)), "PNG")
    assert decode(data, ImageGeometry(max_source_pixels=100 * 99)) == DecodeFailure(
        "too many pixels"
    )
    assert isinstance(decode(data, ImageGeometry(max_source_pixels=100 * 100)), DecodedImage)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    assert isinstance(decode(data), DecodedImage | DecodeFailure)


_SMALL = {fmt: _encode(Image.fromarray(_noise(24, 40, seed=2)), fmt) for fmt in ("JPEG", "PNG")}


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(_SMALL)),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, 10_000),
)
def test_damaged_images_never_raise(fmt: str, edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(_SMALL[fmt])
    for position, value in edits:
        data[position % len(data)] = value
    result = decode(bytes(data[: max(1, len(data) - cut)]))
    assert isinstance(result, DecodedImage | DecodeFailure)
    if isinstance(result, DecodeFailure):
        assert result.reason and len(result.reason) < 60
