"""The Client's device side: torch rebuilds the compact frames as numpy does, byte for byte,
and a device this machine lacks is refused in one sentence."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from msd.batch.cp_slice import cp_slice
from msd.batch.pack import pack_rows
from msd.client import Client, device
from msd.errors import LaunchError
from msd.wire import compact
from tests.unit.test_compact import ALL_TENSORS, packed_rows


def built_with_torch(batch: dict[str, np.ndarray], names) -> dict[str, torch.Tensor]:
    frames = compact.encode(batch, names)
    shapes = {n: (batch[n].shape, str(batch[n].dtype)) for n in names}
    compact.check(frames, shapes)
    return device.build({n: device.host_frame(f, pin=False) for n, f in frames.items()}, shapes)


@given(st.integers(1, 3).flatmap(lambda cp: st.tuples(st.just(cp), packed_rows(cp))))
@settings(max_examples=100, deadline=None)
def test_torch_builds_what_numpy_decodes(case):
    cp, (rows, seq_len) = case
    full = pack_rows(rows, seq_len)
    for cp_rank in range(cp):
        part = cp_slice(full, cp, cp_rank)
        got = built_with_torch(part, ALL_TENSORS)
        for name in ALL_TENSORS:
            assert got[name].numpy().dtype == part[name].dtype, name
            assert got[name].numpy().tobytes() == part[name].tobytes(), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@given(st.integers(1, 3).flatmap(lambda cp: st.tuples(st.just(cp), packed_rows(cp))))
@settings(max_examples=30, deadline=None)
def test_on_a_gpu_the_side_stream_hands_out_what_numpy_decodes(case):
    cp, (rows, seq_len) = case
    placed = device.placement("cuda", pin_memory=False)
    assert placed is not None
    full = pack_rows(rows, seq_len)
    for cp_rank in range(cp):
        part = cp_slice(full, cp, cp_rank)
        frames = compact.encode(part, ALL_TENSORS)
        shapes = {n: (part[n].shape, str(part[n].dtype)) for n in ALL_TENSORS}
        got = placed.place(frames, shapes).ready()
        for name in ALL_TENSORS:
            assert got[name].device.type == "cuda", name
            assert got[name].cpu().numpy().dtype == part[name].dtype, name
            assert got[name].cpu().numpy().tobytes() == part[name].tobytes(), name


def test_a_machine_without_cuda_refuses_a_cuda_device_in_one_sentence():
    if torch.cuda.is_available():
        placed = device.placement("cuda", pin_memory=False)
        assert placed is not None and placed.device.type == "cuda"
        return
    with pytest.raises(LaunchError, match=r"needs CUDA, but torch.cuda.is_available\(\) is False"):
        device.placement("cuda", pin_memory=True)
    # before it looks for a job: the mistake is named first
    with pytest.raises(LaunchError, match="needs CUDA"):
        Client(job="/nonexistent", device="cuda:0")


def test_pinning_without_cuda_changes_nothing_and_cpu_is_plain():
    if not torch.cuda.is_available():
        assert device.placement(None, pin_memory=True) is None
    assert device.placement("cpu", pin_memory=False) is None
    assert device.placement(torch.device("cpu"), pin_memory=False) is None


@pytest.mark.parametrize(
    ("given", "message"), [("meta", "only 'cuda' devices"), ("gpu!", "not a torch device")]
)
def test_other_devices_are_refused(given, message):
    with pytest.raises(LaunchError, match=message):
        device.placement(given, pin_memory=False)
