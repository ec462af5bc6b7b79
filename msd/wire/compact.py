"""A batch's tensors as they cross the socket to a trainer: fewer bytes, the same tensors.

A packed batch has three tensors of one int64 per token (``input_ids``, ``labels``,
``position_ids``: 24 bytes a token), but most of it follows from the rest:

* token ids travel in the smallest integer type that holds the batch's values (uint8 for the
  ``bytes`` transform, uint16 for most vocabularies, uint32 above that); so does every other
  integer tensor (``narrowed``);
* ``labels`` are the next token wherever they are not ignored: they travel as one bit a token
  (ignored or not) and the few labels that are not the next token on the wire (at the end of a
  context-parallel chunk) as positions and values;
* ``position_ids`` count up by one within a sequence: they travel as where each run starts and
  its first value;
* ``loss_mask`` (a conversation job's: ``labels != -100``) travels as nothing: it is the labels'
  ignored bit, negated.

`encode` turns a batch into frames and `decode` turns them back; ``decode(encode(batch))`` is the
batch, byte for byte, whatever the batch holds (nothing here assumes how it was packed: a value
a rule does not predict is sent as an exception to it). Both are pure numpy. `decode` checks
every frame it reads, as it comes from a socket: a frame that does not fit raises
`ProtocolError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from msd.errors import ProtocolError

IGNORE_INDEX = -100  # msd.batch.pack's; kept here so the wire does not depend on packing

# Frame names: a tensor travels as itself (perhaps narrowed), or as parts named NAME/PART.
LABEL_PARTS = ("labels/ignored", "labels/at", "labels/values")
LOSS_MASK = "loss_mask"  # carried by LABEL_PARTS[0], the labels' ignored bits
POSITION_PARTS = ("position_ids/at", "position_ids/values")
NARROW_TYPES = (np.uint8, np.uint16, np.uint32, np.int32)
_RANGES = tuple((np.dtype(t), int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in NARROW_TYPES)
SMALL = 64  # a tensor of fewer values travels as it is: narrowing it would save next to nothing

Arrays = Mapping[str, np.ndarray]


def narrowed(values: np.ndarray) -> np.ndarray:
    """``values`` in the smallest type of `NARROW_TYPES` that holds them all (an integer array
    that fits none, or anything else, as it is)."""
    if values.dtype.kind not in "iu" or values.dtype.itemsize == 1 or values.size == 0:
        return values
    low, high = int(values.min()), int(values.max())
    for dtype, lowest, highest in _RANGES:
        if lowest <= low and high <= highest:
            return values.astype(dtype) if dtype.itemsize < values.dtype.itemsize else values
    return values


def encode(batch: Arrays, names: Iterable[str]) -> dict[str, np.ndarray]:
    """The frames that carry ``names`` of ``batch`` (each tensor's frames once, in order)."""
    frames: dict[str, np.ndarray] = {}
    for name in names:
        if name == "labels" and "input_ids" in batch:
            frames.setdefault("input_ids", narrowed(batch["input_ids"]))
            frames.update(_labels(batch["labels"], batch["input_ids"]))
        elif name == LOSS_MASK and "labels" in batch and "input_ids" in batch:
            if LABEL_PARTS[0] not in frames:
                frames.update(_labels(batch["labels"], batch["input_ids"]))
        elif name == "position_ids":
            frames.update(_positions(batch["position_ids"]))
        elif name not in frames:
            tensor = batch[name]
            frames[name] = narrowed(tensor) if tensor.size >= SMALL else tensor
    return frames


def carried_by(names: Iterable[str], frames: Arrays) -> list[str]:
    """The frames of ``frames`` (an `encode` of a superset of ``names``) that carry ``names``,
    in order, each once."""
    wanted: dict[str, None] = {}
    for name in names:
        if name == "labels" and "labels" not in frames:
            wanted |= dict.fromkeys(("input_ids", *LABEL_PARTS))
        elif name == LOSS_MASK and LOSS_MASK not in frames:
            wanted[LABEL_PARTS[0]] = None
        elif name == "position_ids" and "position_ids" not in frames:
            wanted |= dict.fromkeys(POSITION_PARTS)
        else:
            wanted[name] = None
    return list(wanted)


def _labels(labels: np.ndarray, input_ids: np.ndarray) -> dict[str, np.ndarray]:
    """``labels`` as: ignored or not (a bit a token), and where a kept label is not the next
    input token, its position and value."""
    flat, ids = labels.reshape(-1), input_ids.reshape(-1)
    ignored = flat == IGNORE_INDEX
    following = _following(ids)
    other = np.flatnonzero(~ignored & (flat != following))
    return {
        "labels/ignored": np.packbits(ignored),
        "labels/at": narrowed(other),
        "labels/values": narrowed(flat[other]),
    }


def _following(ids: np.ndarray) -> np.ndarray:
    """Each flat token's next one (0 after the last), as int64."""
    following = np.zeros(ids.size, dtype=np.int64)
    following[:-1] = ids[1:]
    return following


def _positions(positions: np.ndarray) -> dict[str, np.ndarray]:
    """``position_ids`` as runs counting up by one: where each starts and its first value."""
    flat = positions.reshape(-1)
    breaks = np.flatnonzero(flat[1:] - flat[:-1] != 1)
    starts = np.zeros(len(breaks) + (flat.size > 0), dtype=np.int64)
    starts[1:] = breaks + 1
    return {"position_ids/at": narrowed(starts), "position_ids/values": narrowed(flat[starts])}


Shapes = Mapping[str, tuple[tuple[int, ...], str]]  # tensor name → (shape, dtype)


def decode(frames: Arrays, shapes: Shapes) -> dict[str, np.ndarray]:
    """The tensors ``shapes`` names from ``frames`` (`check`-ed first); each a fresh array
    (frames may be views on a socket's buffers)."""
    check(frames, shapes)
    out: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in shapes.items():
        if name in frames:
            tensor = frames[name].astype(dtype)  # a copy: the frame goes back to the socket
        elif name == "labels":
            tensor = _decode_labels(frames, dtype)
        elif name == LOSS_MASK:
            ignored = np.unpackbits(frames[LABEL_PARTS[0]], count=math.prod(shape)).view(bool)
            tensor = (~ignored).astype(dtype)
        else:
            tensor = _decode_positions(frames, dtype, math.prod(shape))
        out[name] = tensor.reshape(shape)
    return out


def check(frames: Arrays, shapes: Shapes) -> None:
    """Raise `ProtocolError` unless ``frames`` carry exactly what ``shapes`` names: every
    frame of the right type and size, every position inside the batch."""
    for name, (shape, dtype) in shapes.items():
        size = math.prod(shape)  # shapes were checked not negative on decode
        if name in frames:
            _check_widening(frames[name], dtype, name, size)
        elif name == "labels":
            _check_labels(frames, size)
        elif name == LOSS_MASK:
            _check_loss_mask(frames, dtype, size)
        elif name == "position_ids":
            _check_positions(frames, size)
        else:
            raise ProtocolError(f"a batch lists tensor {name!r} but carries no frame for it")


def _check_widening(frame: np.ndarray, dtype: str, name: str, size: int) -> None:
    """A frame that becomes ``dtype``: the same type, or an integer type that holds it."""
    target = np.dtype(dtype)
    if frame.dtype != target and not (
        frame.dtype.kind in "iu" and target.kind in "iu" and np.can_cast(frame.dtype, target)
    ):
        raise ProtocolError(f"tensor {name!r} arrived as {frame.dtype}, not as {dtype}")
    if frame.size != size:
        raise ProtocolError(f"tensor {name!r} has {frame.size} values, its shape {size}")


def _part(frames: Arrays, name: str) -> np.ndarray:
    part = frames.get(name)
    if part is None:
        raise ProtocolError(f"a batch carries no frame {name!r}")
    if part.ndim != 1 or part.dtype.kind not in "iu":
        raise ProtocolError(f"frame {name!r} is {part.dtype} of shape {part.shape}")
    return part


def _check_labels(frames: Arrays, n: int) -> None:
    ids = frames.get("input_ids")
    if ids is None:
        raise ProtocolError("a batch carries labels without the token ids they follow")
    if ids.size != n or ids.dtype.kind not in "iu":
        raise ProtocolError(f"labels of {n} tokens follow {ids.size} token ids")
    bits, at, values = (_part(frames, p) for p in LABEL_PARTS)
    if bits.dtype != np.uint8 or bits.size != (n + 7) // 8:
        raise ProtocolError(f"frame 'labels/ignored' has {bits.size} bytes for {n} tokens")
    if at.size != values.size:
        raise ProtocolError("frames 'labels/at' and 'labels/values' do not match")
    if at.size and (int(at.min()) < 0 or int(at.max()) >= n):
        raise ProtocolError("frame 'labels/at' names a token outside the batch")


def _check_loss_mask(frames: Arrays, dtype: str, n: int) -> None:
    bits = _part(frames, LABEL_PARTS[0])
    if bits.dtype != np.uint8 or bits.size != (n + 7) // 8:
        raise ProtocolError(f"frame 'labels/ignored' has {bits.size} bytes for a mask of {n}")
    if dtype != "bool":
        raise ProtocolError(f"tensor 'loss_mask' is listed as {dtype}, not bool")


def _check_positions(frames: Arrays, n: int) -> None:
    starts, values = (_part(frames, p) for p in POSITION_PARTS)
    if starts.size != values.size:
        raise ProtocolError("frames 'position_ids/at' and 'position_ids/values' do not match")
    wide = starts.astype(np.int64)
    if n and (wide.size == 0 or wide[0] != 0 or np.any(np.diff(wide) <= 0)):
        raise ProtocolError("frame 'position_ids/at' is not increasing from 0")
    if wide.size and int(wide[-1]) >= n:
        raise ProtocolError("frame 'position_ids/at' names a token outside the batch")


def _decode_labels(frames: Arrays, dtype: str) -> np.ndarray:
    ids = frames["input_ids"].reshape(-1)
    at, values = frames["labels/at"], frames["labels/values"]
    labels = _following(ids).astype(dtype, copy=False)
    labels[at] = values
    ignored = np.unpackbits(frames["labels/ignored"], count=ids.size).view(bool)
    np.putmask(labels, ignored, IGNORE_INDEX)
    return labels


def _decode_positions(frames: Arrays, dtype: str, n: int) -> np.ndarray:
    starts = frames["position_ids/at"].astype(np.int64)
    values = frames["position_ids/values"].astype(np.int64)
    lengths = np.empty_like(starts)
    lengths[:-1] = starts[1:] - starts[:-1]
    lengths[-1:] = n - starts[-1:]
    positions: np.ndarray = np.arange(n, dtype=np.int64) + np.repeat(values - starts, lengths)
    return positions.astype(dtype, copy=False)
