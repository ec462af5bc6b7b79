"""Cutting a relayed payload into one payload per next hop (no sockets).

A payload that names a destination per sample (``Payload.to``) is split by where each sample
goes next: each part keeps its samples' tokens (and images) back to back, in the order they
came, and the destinations of those samples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

from msd.wire.protocol import Payload, PayloadLayout, trained_spans

Part = tuple[Payload, list[Any]]  # a payload and its buffers


def split_payload(msg: Payload, buffers: list[Any], hop: Callable[[int], int]) -> dict[int, Part]:
    """The parts of ``msg`` by ``hop(destination)``; the message itself when all go one way."""
    hops = [hop(d) for d in msg.to]
    if len(set(hops)) <= 1:
        return {hops[0]: (msg, buffers)} if hops else {}
    picks: dict[int, list[int]] = {}
    for i, h in enumerate(hops):
        picks.setdefault(h, []).append(i)
    return {h: _subset(msg, buffers, idx) for h, idx in picks.items()}


def _subset(msg: Payload, buffers: list[Any], idx: list[int]) -> Part:
    tokens = np.frombuffer(buffers[0], dtype=msg.token_dtype)
    layout = PayloadLayout.of(msg)
    bounds, first, rows = layout.bounds, layout.first, layout.rows
    part = msgspec.structs.replace(
        msg,
        source=tuple(msg.source[i] for i in idx),
        gpos=tuple(msg.gpos[i] for i in idx),
        lengths=tuple(msg.lengths[i] for i in idx),
        to=tuple(msg.to[i] for i in idx),
    )
    spans = trained_spans(msg)
    if spans is not None:
        part = msgspec.structs.replace(
            part,
            trained=tuple(msg.trained[i] for i in idx),
            spans=tuple(int(b) for i in idx for b in spans[i].reshape(-1)),
        )
    kept = [tokens[bounds[i] : bounds[i + 1]] for i in idx]
    token_buffer = np.concatenate(kept) if kept else tokens[:0]
    if not msg.images:
        return part, [token_buffer]
    patches = np.frombuffer(buffers[1], dtype=np.uint8).reshape(-1, msg.patch_values)
    images = [range(first[i], first[i + 1]) for i in idx]
    part = msgspec.structs.replace(
        part,
        images=tuple(msg.images[i] for i in idx),
        grids=tuple(n for span in images for k in span for n in msg.grids[3 * k : 3 * k + 3]),
        videos=tuple(msg.videos[k] for span in images for k in span) if msg.videos else (),
    )
    kept_patches = [patches[rows[k] : rows[k + 1]] for span in images for k in span]
    pixels = np.concatenate(kept_patches) if kept_patches else patches[:0]
    return part, [token_buffer, pixels]
