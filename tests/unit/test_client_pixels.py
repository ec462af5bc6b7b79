"""``Client(pixels="float")``: uint8 patches (channel-major) normalised per channel."""

from __future__ import annotations

import numpy as np
import torch

from msd.client import normalised


def test_each_channel_is_scaled_then_normalised_with_its_own_mean_and_std() -> None:
    p = 2  # a patch of 3 channels × 2 × 2 values
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (5, 3 * p * p), dtype=np.uint8)
    mean, std = (0.1, 0.5, 0.9), (0.2, 0.3, 0.4)
    out = normalised(torch.from_numpy(raw.copy()), mean, std)
    assert out.dtype == torch.float32 and out.shape == raw.shape
    channels = raw.reshape(5, 3, p * p) / 255.0
    expected = (channels - np.array(mean)[None, :, None]) / np.array(std)[None, :, None]
    assert np.allclose(out.numpy(), expected.reshape(5, -1), atol=1e-6)


def test_no_images_stay_no_images() -> None:
    out = normalised(torch.zeros((0, 588), dtype=torch.uint8), (0.5,) * 3, (0.5,) * 3)
    assert out.shape == (0, 588) and out.dtype == torch.float32
