"""A built batch is held once, and each rank is sent the bytes a joined copy of its frames was."""

from __future__ import annotations

import numpy as np
import pytest

from msd.batch.pack import Piece, pack_rows
from msd.batch.sample import SampleImages
from msd.plan.topology import Coords, Topology
from msd.roles.constructor.ready import Names, Ready
from msd.wire import compact
from msd.wire.protocol import TensorSpec, frame_offsets

IMAGE = 9000
VALUES = 12  # patch values


def image_batch(seed: int, loss_mask: bool = False) -> dict[str, np.ndarray]:
    """Two rows of 256 tokens: text, images (4 patches a placeholder) and padding."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(2):
        pieces = []
        for k in range(3):
            text = rng.integers(1, 70_000, size=int(rng.integers(20, 60)))
            tokens = np.concatenate([text[:10], [IMAGE] * 3, text[10:]]).astype(np.int32)
            patches = rng.integers(0, 256, size=(12, VALUES), dtype=np.uint8)
            images = SampleImages(patches, ((1, 2, 6),))
            pieces.append(Piece(source=k, sample_id=10 * r + k, tokens=tokens, images=images))
        rows.append(pieces)
    return pack_rows(rows, 256, IMAGE, VALUES, loss_mask=loss_mask)


def joined_copy(
    arrays: dict[str, np.ndarray], names: Names
) -> tuple[tuple[TensorSpec, ...], bytes]:
    """What a Batch of ``names`` carried when every rank was sent a joined copy of its frames."""
    frames = compact.encode(arrays, arrays)
    carried = {f: frames[f] for f in compact.carried_by(names, frames)}
    specs = tuple(TensorSpec(f, str(a.dtype), a.shape) for f, a in carried.items())
    offsets = frame_offsets(specs)
    buffer = np.zeros(offsets[-1], dtype=np.uint8)
    for at, frame in zip(offsets, carried.values(), strict=False):
        buffer[at : at + frame.nbytes] = frame.reshape(-1).view(np.uint8)
    return specs, buffer.tobytes()


@pytest.mark.parametrize(("pp", "masks"), [(1, False), (3, False), (2, True)])
def test_each_rank_is_sent_the_joined_copys_bytes(pp: int, masks: bool) -> None:
    topology = Topology(pp=pp, vision=True, masks=masks)
    readers = tuple(topology.tensors(Coords(dp=0, pp=stage, cp=0, tp=0)) for stage in range(pp))
    arrays = image_batch(seed=pp, loss_mask=masks)
    ready = Ready.of(arrays, readers)
    for names in readers:
        specs, sent = ready.joined(names)
        assert (specs, bytes(sent)) == joined_copy(arrays, names)
        assert ready.joined(names)[1] is sent  # one copy for a rank's TP peers


def test_a_batch_every_rank_reads_whole_is_held_once() -> None:
    arrays = image_batch(seed=0)
    names = Topology(vision=True).tensors(Coords(0, 0, 0, 0))
    ready = Ready.of(arrays, (names,))
    frames = compact.encode(arrays, arrays)
    frame_bytes = sum(frames[f].nbytes for f in compact.carried_by(names, frames))
    before = ready.nbytes
    _, sent = ready.joined(names)
    assert sent.base is ready.buffer  # the buffer itself, no copy
    assert ready.nbytes == before == len(sent)
    assert frame_bytes <= ready.nbytes < frame_bytes + 8 * len(frames)  # alignment only


def test_a_later_pipeline_stage_costs_one_copy_of_its_frames_only() -> None:
    topology = Topology(pp=2, vision=True)
    first, last = (topology.tensors(Coords(0, stage, 0, 0)) for stage in (0, 1))
    ready = Ready.of(image_batch(seed=1), (first, last))
    held = ready.nbytes
    ready.joined(first)
    assert ready.nbytes == held  # a prefix of the buffer
    specs, sent_last = ready.joined(last)
    assert sent_last.base is not ready.buffer
    assert ready.nbytes == held + sent_last.nbytes
    assert "pixel_values" not in {s.name for s in specs}  # tokens and labels only
