"""Where a Client hands its batches out: as CPU tensors, pinned CPU tensors, or on a GPU.

On a GPU (``Client(device="cuda")``) the Client's background thread copies each batch's compact
frames (``msd.wire.compact``: a byte or two a token) into pinned host buffers, sends them to
the device with ``non_blocking=True`` on a side CUDA stream, and widens them there into the
tensors the model needs (token ids as int64, labels and position ids rebuilt): so the
host-to-device copy moves the compact bytes, and it overlaps the trainer's compute. The batch is
handed out once the trainer's stream has waited for that copy (an event recorded on the side
stream), and its tensors are marked as used on the trainer's stream, so the allocator does not
reuse their memory early. `build` does on any torch device what ``compact.decode`` does with
numpy, byte for byte. ``pixel_values`` cross as uint8; with ``pixels="float"`` they are
normalised on that thread too, on the side stream after the copy (a quarter of float32's bytes
cross to the GPU), so the trainer's thread and stream do none of it.

``pin_memory=True`` without a device hands out pinned CPU tensors (for the trainer's own
``.to(device, non_blocking=True)``), normalised pixels included; on a machine without CUDA it
changes nothing, as in ``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from msd.batch.sample import PIXEL_KEYS
from msd.errors import LaunchError
from msd.wire import compact

IGNORE_INDEX = compact.IGNORE_INDEX
# Unsigned frames torch has few kernels for travel as the signed type of their size and are
# masked back after widening to int64.
_SIGNED_VIEW = {np.dtype(np.uint16): np.int16, np.dtype(np.uint32): np.int32}
Normalise = tuple[tuple[float, ...], tuple[float, ...]]  # per-channel mean, std
_BITS = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0], dtype=torch.uint8)  # numpy.packbits' order


def placement(device: str | torch.device | None, pin_memory: bool) -> Placement | None:
    """How batches are handed out; None: plain CPU tensors. Raises `LaunchError` (one sentence)
    for a device this machine does not have."""
    if device is None:
        pinned = pin_memory and torch.cuda.is_available()  # no CUDA: nothing to pin for
        return Placement(torch.device("cpu"), pinned=True) if pinned else None
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError):
        raise LaunchError(
            f"msd.Client(device={device!r}) is not a torch device; use 'cuda', 'cuda:N' or 'cpu'"
        ) from None
    if where.type == "cpu":
        return placement(None, pin_memory)
    if where.type != "cuda":
        raise LaunchError(f"msd.Client(device={device!r}): only 'cuda' devices or 'cpu'")
    if not torch.cuda.is_available():
        raise LaunchError(
            f"msd.Client(device={device!r}) needs CUDA, but torch.cuda.is_available() is False "
            "here; leave device unset for CPU tensors"
        )
    if where.index is None:
        where = torch.device("cuda", torch.cuda.current_device())
    if where.index is not None and where.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise LaunchError(f"msd.Client(device={device!r}): this machine has {count} GPU(s)")
    return Placement(where, pinned=True)


@dataclass
class Pending:
    """A batch on its way to the device: handed out once the trainer's stream waited for it."""

    tensors: dict[str, torch.Tensor]
    event: Any = None  # torch.cuda.Event: the copy and widening are done
    host: list[torch.Tensor] = field(default_factory=list)  # pinned buffers, kept until then
    device: torch.device | None = None

    def ready(self) -> dict[str, torch.Tensor]:
        """The tensors, usable on the calling thread's current stream."""
        if self.event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(self.event)
            for tensor in self.tensors.values():
                tensor.record_stream(stream)
        self.host.clear()
        return self.tensors


@dataclass
class Placement:
    """Where batches go: pinned CPU memory, or a CUDA device through pinned memory."""

    device: torch.device
    pinned: bool
    stream: Any = None  # the side CUDA stream (created in the thread that copies)

    def place(
        self, frames: compact.Arrays, shapes: compact.Shapes, normalise: Normalise | None = None
    ) -> Pending:
        """``frames`` (checked) as the batch on this placement, ``pixel_values`` normalised
        there (``normalise``: per-channel mean and std) or left uint8; called from the
        Client's background thread."""
        if self.device.type == "cpu":
            tensors = cpu_tensors(frames, shapes, normalise)
            return Pending({n: t.pin_memory() for n, t in tensors.items()})
        compact.check(frames, shapes)
        host = {name: host_frame(frame, pin=True) for name, frame in frames.items()}
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            on_device = {
                name: (t.to(self.device, non_blocking=True), bits)
                for name, (t, bits) in host.items()
            }
            tensors = with_normalised_pixels(build(on_device, shapes), normalise)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self.stream)
        return Pending(tensors, event, [t for t, _ in host.values()], self.device)


def normalised(
    pixels: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    """uint8 patches [n, 3·t·p²] (channel-major) as float32, (x / 255 − mean) / std per channel.

    Every divisor is a tensor on the pixels' device: PyTorch's CUDA kernels multiply by the
    reciprocal of a Python-number divisor, a bit off the true quotient that numpy and the CPU
    compute, and a GPU's pixels would not be the CPU's bytes."""
    scale = torch.tensor(255.0, dtype=torch.float32, device=pixels.device)
    channels = pixels.reshape(pixels.shape[0], 3, pixels.shape[1] // 3).to(torch.float32)
    channels = channels.div_(scale)
    m = torch.tensor(mean, dtype=torch.float32, device=pixels.device).view(1, 3, 1)
    s = torch.tensor(std, dtype=torch.float32, device=pixels.device).view(1, 3, 1)
    return channels.sub_(m).div_(s).reshape(pixels.shape)


def cpu_tensors(
    frames: compact.Arrays, shapes: compact.Shapes, normalise: Normalise | None
) -> dict[str, torch.Tensor]:
    """The batch ``frames`` carry as CPU tensors (``compact.decode``), ``pixel_values``
    normalised when ``normalise`` is given."""
    tensors = {n: torch.from_numpy(a) for n, a in compact.decode(frames, shapes).items()}
    return with_normalised_pixels(tensors, normalise)


def with_normalised_pixels(
    tensors: dict[str, torch.Tensor], normalise: Normalise | None
) -> dict[str, torch.Tensor]:
    """``tensors`` with ``pixel_values`` (and ``pixel_values_videos``) normalised when
    ``normalise`` is given."""
    if normalise is not None:
        for key in PIXEL_KEYS:
            if key in tensors:
                tensors[key] = normalised(tensors[key], *normalise)
    return tensors


def host_frame(frame: np.ndarray, pin: bool) -> tuple[torch.Tensor, int]:
    """A host copy of ``frame`` (pinned: for a non-blocking copy to a GPU) and, for an unsigned
    frame of 16 or 32 bits, its width (it travels as the signed type of its size)."""
    signed = _SIGNED_VIEW.get(frame.dtype)
    view = frame.view(signed) if signed is not None else frame
    host = torch.empty(view.shape, dtype=_torch_dtype(str(view.dtype)), pin_memory=pin)
    host.numpy()[...] = view
    return host, (8 * frame.dtype.itemsize if signed is not None else 0)


Frames = Mapping[str, tuple[torch.Tensor, int]]  # name → (tensor, unsigned width or 0)


def build(frames: Frames, shapes: compact.Shapes) -> dict[str, torch.Tensor]:
    """The tensors ``shapes`` names from (checked) ``frames`` with torch, on the frames'
    device: what ``compact.decode`` gives, byte for byte."""
    out: dict[str, torch.Tensor] = {}
    for name, (shape, dtype) in shapes.items():
        target = _torch_dtype(dtype)
        if name in frames:
            tensor = _widened(*frames[name], target)
        elif name == "labels":
            tensor = _labels(frames, target)
        elif name == compact.LOSS_MASK:
            tensor = ~_ignored(frames, int(np.prod(shape, dtype=np.int64)))
        else:
            tensor = _positions(frames, target, int(np.prod(shape, dtype=np.int64)))
        out[name] = tensor.reshape(shape)
    return out


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise LaunchError(f"no torch dtype {name!r}")
    return dtype


def _widened(tensor: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    if bits:  # an unsigned frame sent as signed: its value is the low bits of the int64
        return (tensor.to(torch.int64) & ((1 << bits) - 1)).to(dtype)
    return tensor.to(dtype, copy=True)


def _labels(frames: Frames, dtype: torch.dtype) -> torch.Tensor:
    ids = _widened(*frames["input_ids"], torch.int64).reshape(-1)
    labels = torch.zeros_like(ids)
    labels[:-1] = ids[1:]
    at = _widened(*frames["labels/at"], torch.int64)
    labels[at] = _widened(*frames["labels/values"], torch.int64)
    return labels.masked_fill_(_ignored(frames, ids.numel()), IGNORE_INDEX).to(dtype)


def _ignored(frames: Frames, n: int) -> torch.Tensor:
    """The labels' ignored bits, one bool a token."""
    packed = frames["labels/ignored"][0]
    bits = (packed.unsqueeze(1) >> _BITS.to(packed.device)) & 1
    return bits.reshape(-1)[:n].bool()


def _positions(frames: Frames, dtype: torch.dtype, n: int) -> torch.Tensor:
    starts = _widened(*frames["position_ids/at"], torch.int64)
    values = _widened(*frames["position_ids/values"], torch.int64)
    ends = torch.cat([starts[1:], torch.tensor([n], dtype=torch.int64, device=starts.device)])
    offsets = torch.repeat_interleave(values - starts, ends - starts, output_size=n)
    return (torch.arange(n, dtype=torch.int64, device=starts.device) + offsets).to(dtype)
