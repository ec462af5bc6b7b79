"""``Client(pixels="float")``: uint8 patches (channel-major) normalised per channel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from msd.client import device
from msd.client.device import normalised
from msd.client.numpy import normalised as numpy_normalised
from msd.wire import compact


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


def test_torch_and_numpy_normalise_to_the_same_bytes() -> None:
    """msd.Client and msd.NumpyClient hand out the same float pixels."""
    raw = np.random.default_rng(1).integers(0, 256, (64, 588), dtype=np.uint8)
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    got = normalised(torch.from_numpy(raw.copy()), mean, std).numpy()
    assert got.tobytes() == numpy_normalised(raw, mean, std).tobytes()


def pixel_batch() -> tuple[dict[str, np.ndarray], compact.Shapes]:
    rng = np.random.default_rng(2)
    batch = {
        "input_ids": rng.integers(0, 256, (2, 16), dtype=np.int64),
        "pixel_values": rng.integers(0, 256, (40, 588), dtype=np.uint8),
        "image_grid_thw": np.array([[1, 4, 10]], dtype=np.int64),
    }
    return batch, {n: (a.shape, str(a.dtype)) for n, a in batch.items()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("where", ["cpu", "cuda"])
def test_on_a_gpu_machine_pixels_are_normalised_off_the_trainers_thread(where: str) -> None:
    """Pinned CPU batches and GPU batches come with pixels already normalised, as numpy
    normalises them (pinned ones still pinned)."""
    batch, shapes = pixel_batch()
    mean, std = (0.1, 0.5, 0.9), (0.2, 0.3, 0.4)
    placed = device.placement(where, pin_memory=True)
    assert placed is not None
    got = placed.place(compact.encode(batch, list(batch)), shapes, (mean, std)).ready()
    pixels = got["pixel_values"]
    assert pixels.device.type == where and (where != "cpu" or pixels.is_pinned())
    expected = numpy_normalised(batch["pixel_values"], mean, std)
    assert pixels.cpu().numpy().tobytes() == expected.tobytes()
    assert got["input_ids"].cpu().numpy().tobytes() == batch["input_ids"].tobytes()
