"""``vision.decode``: ``exact`` decodes a JPEG at full size, as Hugging Face's Qwen2-VL image
processor does; ``fast`` lets Pillow's draft mode decode it at a reduced scale. Real JPEGs and
PNGs encoded here with Pillow."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import msgspec
import numpy as np
import pytest
from PIL import Image

from msd.errors import RecipeError
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe, stream_fingerprint
from msd.sources.fuse import geometry_of
from msd.sources.vision import RESAMPLE, DecodedImage, ImageGeometry, decode, fit, patchify

# 256 tokens at most: a 2000×1500 photo is resized to 504×364, a quarter of its sides or less,
# so draft mode decodes it at half scale.
EXACT = ImageGeometry(max_pixels=14 * 14 * 4 * 256)
FAST = ImageGeometry(max_pixels=14 * 14 * 4 * 256, decode="fast")
HEIGHT, WIDTH = 1500, 2000


def _detailed(height: int, width: int) -> Image.Image:
    """Gradients, a fine XOR pattern and noise: detail that a reduced-scale decode loses."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), (x ^ y) & 255], axis=-1)
    noise = np.random.default_rng(0).integers(-40, 41, base.shape)
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def _encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def photo() -> bytes:
    return _encode(_detailed(HEIGHT, WIDTH), "JPEG")


def _patches(data: bytes, geometry: ImageGeometry) -> np.ndarray:
    decoded = decode(data, geometry)
    assert isinstance(decoded, DecodedImage), decoded
    return decoded.patches


def _pillow(data: bytes, geometry: ImageGeometry, draft: bool) -> np.ndarray:
    """Pillow's own decode (full size, or in draft mode for the resized size), then the resize."""
    h, w = fit(HEIGHT, WIDTH, geometry)
    with Image.open(io.BytesIO(data)) as image:
        if draft:
            image.draft("RGB", (w, h))
        rgb = image.convert("RGB").resize((w, h), RESAMPLE)
    return patchify(np.asarray(rgb), geometry)


def test_exact_is_pillows_full_size_decode_then_the_resize(photo: bytes) -> None:
    assert np.array_equal(_patches(photo, EXACT), _pillow(photo, EXACT, draft=False))


def test_fast_is_pillows_draft_decode_then_the_resize(photo: bytes) -> None:
    with Image.open(io.BytesIO(photo)) as image:
        h, w = fit(HEIGHT, WIDTH, FAST)
        image.draft("RGB", (w, h))
        assert image.size == (WIDTH // 2, HEIGHT // 2)  # draft mode does take effect here
    assert np.array_equal(_patches(photo, FAST), _pillow(photo, FAST, draft=True))


def test_the_two_modes_give_other_pixels_of_a_large_jpeg(photo: bytes) -> None:
    exact, fast = _patches(photo, EXACT), _patches(photo, FAST)
    assert exact.shape == fast.shape
    difference = np.abs(exact.astype(np.int16) - fast.astype(np.int16))
    assert np.count_nonzero(difference) / difference.size > 0.1
    assert 0.1 < difference.mean() < 5.0  # other rounding of the same picture, not another one


@pytest.mark.parametrize(
    ("fmt", "height", "width"),
    [("PNG", 1000, 750), ("WEBP", 1000, 750), ("JPEG", 700, 990)],
    ids=["png", "webp", "jpeg-under-2x"],
)
def test_other_formats_and_jpegs_under_twice_the_resized_size_are_the_same_in_both_modes(
    fmt: str, height: int, width: int
) -> None:
    data = _encode(_detailed(height, width), fmt)
    h, w = fit(height, width, EXACT)
    assert fmt != "JPEG" or min(width // w, height // h) < 2  # draft would keep the full size
    assert np.array_equal(_patches(data, EXACT), _patches(data, FAST))


def test_exact_is_hugging_faces_qwen2_vl_image_processor(photo: bytes) -> None:
    """The processor's pixels before its rescale and normalise: the same values exactly."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    geometry = ImageGeometry(max_pixels=EXACT.max_pixels, temporal_patch_size=2)
    processor = Qwen2VLImageProcessorPil(
        min_pixels=geometry.min_pixels,
        max_pixels=geometry.max_pixels,
        patch_size=geometry.patch_size,
        merge_size=geometry.merge_size,
        temporal_patch_size=2,
        do_rescale=False,
        do_normalize=False,
    )
    with Image.open(io.BytesIO(photo)) as image:
        out = processor(images=[image], return_tensors="np")
    decoded = decode(photo, geometry)
    assert isinstance(decoded, DecodedImage), decoded
    assert out["image_grid_thw"].tolist() == [list(decoded.grid)]
    assert np.array_equal(out["pixel_values"], decoded.patches.astype(np.float32))
    fast = decode(photo, dataclasses.replace(geometry, decode="fast"))
    assert isinstance(fast, DecodedImage)
    assert not np.array_equal(out["pixel_values"], fast.patches.astype(np.float32))


# The recipe key ----------------------------------------------------------------------------------

IMAGES = {"name": "captions", "path": "/d/*.tar", "weight": 1.0}  # a WebDataset image source


def _recipe(source: dict[str, object], **vision: object) -> Recipe:
    doc = {"seq_len": 4096, "global_batch_tokens": 8192, "steps": 10, "sources": [source]}
    return msgspec.convert({**doc, "vision": vision}, Recipe)


def test_the_loaders_geometry_carries_the_recipes_decode() -> None:
    assert _recipe(IMAGES).vision.decode == "exact"
    assert geometry_of(_recipe(IMAGES).vision).decode == "exact"
    assert geometry_of(_recipe(IMAGES, decode="fast").vision).decode == "fast"


def test_only_fast_changes_the_stream_fingerprint() -> None:
    implicit = stream_fingerprint(_recipe(IMAGES))
    # An image recipe's hash before the key existed: its checkpoints restore.
    assert implicit == "8f140274a607af43"
    assert stream_fingerprint(_recipe(IMAGES, decode="exact")) == implicit
    assert stream_fingerprint(_recipe(IMAGES, decode="fast")) != implicit
    text = {"name": "web", "path": "/d/*.parquet", "weight": 1.0, "text_column": "text"}
    assert stream_fingerprint(_recipe(text, decode="fast")) == stream_fingerprint(_recipe(text))


def test_an_unknown_decode_is_a_one_sentence_recipe_error(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        "seq_len: 4096\nglobal_batch_tokens: 8192\nsteps: 10\nvision:\n  decode: slow\n"
        "sources:\n  - {name: captions, path: /d/*.tar, weight: 1.0}\n"
    )
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    message = str(caught.value)
    assert "\n" not in message and "vision.decode" in message and ":5:" in message
    assert "'slow'" in message and "exact, fast" in message


def test_a_geometry_with_an_unknown_decode_is_refused() -> None:
    with pytest.raises(ValueError, match=r"ImageGeometry\.decode must be exact or fast"):
        ImageGeometry(decode="slow")  # type: ignore[arg-type]
