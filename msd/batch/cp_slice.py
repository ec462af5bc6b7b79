"""What each rank of a hybrid-parallel trainer receives from its DP rank's packed batch.

Context parallelism uses the load-balanced causal split: every sequence (each is padded to a
multiple of ``2·cp``) is cut into ``2·cp`` chunks and CP rank ``i`` gets chunks ``i`` and
``2·cp − 1 − i``, so every CP rank does the same attention work. Tensors are sliced after
labels and positions are computed, so both stay exact. Pipeline stages keep only the tensors
they use (``msd.plan.topology.Topology.tensors``); TP peers share one copy.
"""

from __future__ import annotations

import numpy as np

ROW_TENSORS = ("input_ids", "labels", "position_ids", "loss_mask")


def zigzag_index(cu_seqlens: np.ndarray, cp: int, cp_rank: int) -> np.ndarray:
    """Flat token indices CP rank ``cp_rank`` keeps, sequence by sequence."""
    parts = []
    for a, b in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True):
        chunk = (b - a) // (2 * cp)
        first = a + cp_rank * chunk
        second = a + (2 * cp - 1 - cp_rank) * chunk
        parts += [np.arange(first, first + chunk), np.arange(second, second + chunk)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def cp_slice(arrays: dict[str, np.ndarray], cp: int, cp_rank: int) -> dict[str, np.ndarray]:
    """The part of a packed batch that CP rank ``cp_rank`` of ``cp`` receives."""
    if cp == 1:
        return arrays
    index = zigzag_index(arrays["cu_seqlens"], cp, cp_rank)
    rows = arrays["input_ids"].shape[0]
    out = dict(arrays)
    for name in ROW_TENSORS:
        if name in arrays:
            out[name] = arrays[name].reshape(-1)[index].reshape(rows, -1)
    out["cu_seqlens"] = (arrays["cu_seqlens"] // cp).astype(np.int32)
    return out


def unzigzag(slices: list[np.ndarray], cu_seqlens: np.ndarray, cp: int) -> np.ndarray:
    """Reassemble a flattened tensor from the flattened slices of all CP ranks (for checks)."""
    total = int(cu_seqlens[-1])
    out = np.empty(total, dtype=slices[0].dtype)
    for rank, part in enumerate(slices):
        out[zigzag_index(cu_seqlens, cp, rank)] = part
    return out
