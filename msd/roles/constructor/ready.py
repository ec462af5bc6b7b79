"""A built batch as a Data Constructor holds it until every rank that reads it has it (no sockets).

Its frames (``msd.wire.compact``) are laid out once, in one buffer, as a ``Batch`` carries them
(``frame_offsets``): the frames of the rank that reads the most bytes first, then those only
other ranks read; a frame no rank of the group reads is not kept. A rank whose frames lie back
to back in that buffer, in the order it reads them, is sent that part of it, not a copy: every
rank of a job without pipeline stages is sent the whole buffer, and the batch is held once. A
rank whose frames do not (a later pipeline stage's) is sent one copy of them, made at its first
request and shared by its TP peers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from msd.wire import compact
from msd.wire.protocol import TensorSpec, frame_offsets

Names = tuple[str, ...]  # the tensors one rank reads, in the order it reads them
Sent = tuple[tuple[TensorSpec, ...], np.ndarray]  # a Batch's frames and the bytes carrying them


@dataclass(frozen=True)
class Ready:
    """One built batch: what a trainer gets (``tensors``), the frames that carry them (``views``
    on ``buffer``) and what each set of names was sent (``sent``)."""

    tensors: dict[str, TensorSpec]
    frames: tuple[TensorSpec, ...]  # the frames ``buffer`` holds, in its order
    buffer: np.ndarray  # uint8: the frames at ``frame_offsets(frames)``
    sent: dict[Names, Sent]

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray], readers: Sequence[Names]) -> Ready:
        """``arrays`` for ranks that read ``readers`` (the tensor names each reads)."""
        specs = {n: TensorSpec(n, str(a.dtype), a.shape) for n, a in arrays.items()}
        encoded = compact.encode(arrays, arrays)
        carried = [compact.carried_by(names, encoded) for names in readers]
        carried.sort(key=lambda names: -sum(encoded[f].nbytes for f in names))
        kept = {f: encoded[f] for names in carried for f in names}
        frames = tuple(TensorSpec(f, str(a.dtype), a.shape) for f, a in kept.items())
        return cls(specs, frames, laid_out(frames, kept.values()), {})

    @property
    def offsets(self) -> list[int]:
        return frame_offsets(self.frames)

    @property
    def views(self) -> dict[str, np.ndarray]:
        """Each frame, a view on the buffer."""
        return {
            spec.name: np.frombuffer(
                self.buffer, spec.dtype, int(np.prod(spec.shape, dtype=np.int64)), at
            ).reshape(spec.shape)
            for spec, at in zip(self.frames, self.offsets, strict=False)
        }

    def joined(self, names: Names) -> Sent:
        """The specs of the frames that carry ``names`` and the bytes a Batch of them carries:
        a slice of the buffer where those frames lie in it back to back and in order, else a
        copy (made once for each set of names: the TP peers of a rank share it)."""
        if names not in self.sent:
            self.sent[names] = self._cut(names)
        return self.sent[names]

    def _cut(self, names: Names) -> Sent:
        views = self.views
        index = {spec.name: i for i, spec in enumerate(self.frames)}
        picked = [index[f] for f in compact.carried_by(names, views)]
        specs = tuple(self.frames[i] for i in picked)
        first = picked[0] if picked else 0
        if picked == list(range(first, first + len(picked))):  # back to back, in order
            offsets = self.offsets
            return specs, self.buffer[offsets[first] : offsets[first + len(picked)]]
        return specs, laid_out(specs, (views[s.name] for s in specs))

    @property
    def nbytes(self) -> int:
        """The bytes it holds: its buffer, and the copies made for ranks whose frames do not
        lie back to back in it."""
        copies = sum(b.nbytes for _, b in self.sent.values() if b.base is not self.buffer)
        return self.buffer.nbytes + copies


def laid_out(frames: Sequence[TensorSpec], arrays: Iterable[np.ndarray]) -> np.ndarray:
    """One buffer holding ``arrays`` (described by ``frames``) at ``frame_offsets(frames)``,
    zeros between them."""
    offsets = frame_offsets(frames)
    buffer = np.zeros(offsets[-1], dtype=np.uint8)
    for at, array in zip(offsets, arrays, strict=False):
        buffer[at : at + array.nbytes] = array.reshape(-1).view(np.uint8)
    return buffer
