"""``vision.decode: exact`` against ``fast`` on the same images: images per CPU-second of
``msd.sources.vision.decode`` in each mode, and how far apart their pixels are. Part of
``python -m benchmarks.decode``.

``exact`` decodes a JPEG at full size and resizes; ``fast`` lets Pillow's draft mode decode it
at 1/2, 1/4 or 1/8 scale where that still covers the resized size (``draft_scale``), so the two
differ only for JPEGs at least twice the resized size on each side. The modes take turns image
by image, so both see the same load on a shared machine; CPU seconds are
``time.process_time()``.
"""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from msd.sources.vision import DecodedImage, DecodeMode, ImageGeometry, decode, fit

MODES: tuple[DecodeMode, ...] = ("exact", "fast")
# (height, width): VGA, 1080p, a 12-megapixel phone photo, a 24-megapixel camera photo.
SIZES = ((480, 640), (1080, 1920), (3024, 4032), (4000, 6000))
# Besides the benchmark's own: 256 tokens at most an image (recipes/examples-vlm.yaml).
SMALL_MAX_PIXELS = 14 * 14 * 4 * 256
MIN_CPU_S = 0.5  # per mode, size and geometry: small images are decoded several times over


def draft_scale(height: int, width: int, geometry: ImageGeometry) -> int:
    """The reduced scale (8, 4, 2; 1: full size) ``fast`` decodes an upright JPEG of this size
    at: Pillow's draft rule, the largest that still covers the resized size."""
    h, w = fit(height, width, geometry)
    scale = min(width // w, height // h)
    return next((s for s in (8, 4, 2) if scale >= s), 1)


def photo(height: int, width: int, seed: int = 0) -> bytes:
    """A JPEG (quality 90) with detail at every scale: gradients, a fine pattern and noise."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), (x ^ y) & 255], axis=-1)
    noise = np.random.default_rng(seed).integers(-40, 41, base.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@dataclasses.dataclass
class Tally:
    """CPU seconds and images decoded per mode; where the modes' pixels differ."""

    cpu_s: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(MODES, 0.0))
    images: int = 0
    different: int = 0
    abs_difference: float = 0.0  # summed over images: the mean |exact − fast| of each
    values: int = 0

    def add(self, data: bytes, geometry: ImageGeometry) -> None:
        """Decode ``data`` once in each mode, in turn."""
        decoded = {}
        for mode in MODES:
            started = time.process_time()
            decoded[mode] = decode(data, dataclasses.replace(geometry, decode=mode))
            self.cpu_s[mode] += time.process_time() - started
        self.images += 1
        exact, fast = decoded["exact"], decoded["fast"]
        if isinstance(exact, DecodedImage) and isinstance(fast, DecodedImage):
            diff = np.abs(exact.patches.astype(np.int16) - fast.patches.astype(np.int16))
            self.different += bool(diff.any())
            self.abs_difference += float(diff.sum())
            self.values += diff.size

    def result(self) -> dict[str, Any]:
        rates = {m: self.images / s if s > 0 else 0.0 for m, s in self.cpu_s.items()}
        return {
            "decodes": self.images,
            "cpu_s": {m: round(s, 4) for m, s in self.cpu_s.items()},
            "images_per_cpu_s": {m: round(r, 2) for m, r in rates.items()},
            "fast_over_exact": round(rates["fast"] / rates["exact"], 3) if rates["exact"] else 0,
            "decodes_with_other_pixels": self.different,
            "mean_abs_difference": round(self.abs_difference / max(self.values, 1), 4),
        }


def on_images(blobs: Sequence[bytes | None], geometry: ImageGeometry) -> dict[str, Any]:
    """Both modes over the same images (the demo sources'), each decoded once in each."""
    tally = Tally()
    jpegs = drafted = 0
    for data in blobs:
        if not data:
            continue
        tally.add(data, geometry)
        with Image.open(io.BytesIO(data)) as image:
            if image.format == "JPEG":
                jpegs += 1
                drafted += draft_scale(image.height, image.width, geometry) > 1
    return {"jpegs": jpegs, "jpegs_decoded_reduced_by_fast": drafted, **tally.result()}


def on_sizes(
    geometries: Sequence[ImageGeometry],
    sizes: Sequence[tuple[int, int]] = SIZES,
    min_cpu_s: float = MIN_CPU_S,
    max_rounds: int = 200,
) -> list[dict[str, Any]]:
    """Both modes on one JPEG of each size, under each geometry, decoded once and then until
    each mode has used ``min_cpu_s``."""
    found = []
    for height, width in sizes:
        data = photo(height, width)
        for geometry in geometries:
            tally = Tally()
            tally.add(data, geometry)
            while min(tally.cpu_s.values()) < min_cpu_s and tally.images < max_rounds:
                tally.add(data, geometry)
            found.append(
                {
                    "height": height,
                    "width": width,
                    "megapixels": round(height * width / 1e6, 1),
                    "jpeg_bytes": len(data),
                    "max_pixels": geometry.max_pixels,
                    "resized": list(fit(height, width, geometry)),
                    "draft_scale": draft_scale(height, width, geometry),
                    **tally.result(),
                }
            )
    return found


def print_table(modes: dict[str, Any], max_pixels: int) -> None:
    print(
        "| images | max_pixels | fast decodes at | exact, images / CPU s | fast | fast / exact "
        "| mean abs diff |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    demo = modes["demo"]
    r = demo["images_per_cpu_s"]
    print(
        f"| demo sources ({demo['decodes']}) | {max_pixels:,} | 1/2–1/8 for "
        f"{demo['jpegs_decoded_reduced_by_fast']} of {demo['jpegs']} JPEGs | {r['exact']:.1f} | "
        f"{r['fast']:.1f} | {demo['fast_over_exact']:.2f} | {demo['mean_abs_difference']:.3f} |"
    )
    for s in modes["sizes"]:
        r = s["images_per_cpu_s"]
        print(
            f"| {s['width']}×{s['height']} JPEG → {s['resized'][1]}×{s['resized'][0]} | "
            f"{s['max_pixels']:,} | 1/{s['draft_scale']} | {r['exact']:.1f} | {r['fast']:.1f} | "
            f"{s['fast_over_exact']:.2f} | {s['mean_abs_difference']:.3f} |"
        )
