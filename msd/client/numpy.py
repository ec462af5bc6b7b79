"""The trainer-side reader without torch: ``for batch in msd.NumpyClient(): ...`` hands out
numpy arrays (for JAX or numpy trainers, and msd's demo trainer, which then never imports torch).
The socket thread and the step are ``msd.client.base``'s, shared with ``msd.Client``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from msd.batch.sample import PIXEL_KEYS
from msd.client.base import Reader
from msd.wire import compact


@dataclass
class _Arrays:
    arrays: dict[str, np.ndarray]

    def ready(self) -> dict[str, np.ndarray]:
        return self.arrays


class NumpyClient(Reader[np.ndarray]):
    """Batches for one trainer rank as numpy arrays (what ``msd.Client`` hands out as torch
    tensors, the same bytes); torch is never imported. State keys: ``version``, ``step``,
    ``fingerprint`` (the same state as ``msd.Client``'s)."""

    def _convert(self, frames: compact.Arrays, shapes: compact.Shapes) -> _Arrays:
        arrays = compact.decode(frames, shapes)
        if self.normalise is not None:
            for key in PIXEL_KEYS:
                if key in arrays:
                    arrays[key] = normalised(arrays[key], *self.normalise)
        return _Arrays(arrays)


def normalised(pixels: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """uint8 patches [n, 3·t·p²] (channel-major) as float32, (x / 255 − mean) / std per channel
    (``msd.client.device.normalised`` with numpy)."""
    channels = pixels.reshape(pixels.shape[0], 3, pixels.shape[1] // 3)
    scaled = channels.astype(np.float32) / np.float32(255.0)
    m = np.asarray(mean, dtype=np.float32).reshape(1, 3, 1)
    s = np.asarray(std, dtype=np.float32).reshape(1, 3, 1)
    out: np.ndarray = ((scaled - m) / s).reshape(pixels.shape)
    return out
