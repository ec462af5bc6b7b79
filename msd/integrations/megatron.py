"""msd batches as Megatron's ``get_batch`` returns them.

Megatron-LM's ``pretrain_gpt.py`` asks ``get_batch(data_iterator)`` for ``tokens``,
``labels``, ``loss_mask``, ``attention_mask`` and ``position_ids`` (and, for packed sequences,
megatron-core's ``PackedSeqParams``). An msd batch already holds most of it; what differs:

* ``labels`` are already the next tokens in both, but msd marks untrained positions with
  ``IGNORE_INDEX`` (-100), while Megatron takes the cross-entropy at every position and then
  multiplies by ``loss_mask``: such positions get ``loss_mask`` 0 and label 0 (a valid id).
* ``loss_mask`` is float32: the batch's own ``loss_mask`` (a job with conversations) or
  ``labels != IGNORE_INDEX``.
* ``attention_mask`` is [b, 1, s, s] bool, True where attention is blocked: causal, and blocked
  across the packed samples of a row (msd's ``cu_seqlens``: every sample and every padding run
  is its own sequence). With ``packed=True`` it is None and ``packed_seq_params`` carries the
  same boundaries in the ``thd`` format instead: the row tensors are flattened to
  [1, rows · seq_len], as Megatron's packed path reads them, and ``cu_seqlens`` are int32
  offsets over those tokens.

With context parallelism (``cp_size`` > 1) msd has already given each CP rank its
load-balanced slice of every sequence (``msd.batch.cp_slice``), the slice Megatron's
``get_thd_batch_on_this_cp_rank`` would cut; the sequences' offsets are then the whole
sequences', ``cp_size`` times msd's local ones. A pipeline stage gets only the tensors it uses:
the ones a batch lacks come back as None (a middle stage: all but ``packed_seq_params`` and,
given ``seq_length``, ``attention_mask``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Union

import numpy as np
import torch

IGNORE_INDEX = -100  # msd's label where no loss is taken
ArrayLike = Union[torch.Tensor, np.ndarray]  # noqa: UP007 (a runtime alias on Python 3.10)
KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids", "packed_seq_params")


def get_batch(
    data_iterator: Iterator[Mapping[str, ArrayLike]],
    packed: bool = False,
    cp_size: int = 1,
    seq_length: int | None = None,
) -> dict[str, Any]:
    """The next msd batch of ``data_iterator`` (``iter(msd.Client())``) as Megatron's
    ``get_batch`` returns it: ``KEYS`` in that order (``megatron_batch``)."""
    return megatron_batch(next(data_iterator), packed, cp_size, seq_length)


def megatron_batch(
    batch: Mapping[str, ArrayLike],
    packed: bool = False,
    cp_size: int = 1,
    seq_length: int | None = None,
) -> dict[str, Any]:
    """One msd batch (torch tensors or numpy arrays) as Megatron's batch. ``packed``:
    ``packed_seq_params`` instead of a dense ``attention_mask``; ``cp_size``: the context-
    parallel size the job was planned with; ``seq_length``: the sequence length of this rank's
    rows, needed only for a dense mask on a stage that receives no token tensors."""
    if cp_size < 1:
        raise ValueError(f"cp_size must be at least 1, got {cp_size}")
    if cp_size > 1 and not packed:
        raise ValueError("context parallelism needs packed=True: a dense mask cannot be sliced")
    if "cu_seqlens" not in batch:
        raise ValueError(f"an msd batch holds 'cu_seqlens'; this one has only {sorted(batch)}")
    cu_seqlens = torch.as_tensor(batch["cu_seqlens"]).to(torch.int32)
    rows = _row_tensors(batch)
    out: dict[str, Any] = dict.fromkeys(KEYS)
    out["tokens"] = rows.get("input_ids")
    out["position_ids"] = rows.get("position_ids")
    if "labels" in rows:
        out["labels"], out["loss_mask"] = labels_and_loss_mask(
            rows["labels"], rows.get("loss_mask")
        )
    if rows:
        _check_offsets(cu_seqlens, *next(iter(rows.values())).shape)
    if packed:
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            if out[key] is not None:
                out[key] = out[key].reshape(1, -1)
        out["packed_seq_params"] = packed_seq_params(cu_seqlens * cp_size)
    else:
        shape = _rows_shape(rows, cu_seqlens, seq_length)
        out["attention_mask"] = document_attention_mask(cu_seqlens, *shape)
    return out


def labels_and_loss_mask(
    labels: torch.Tensor, loss_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron's ``labels`` (0 where msd's are ``IGNORE_INDEX``) and float32 ``loss_mask``
    (msd's ``loss_mask`` where the batch has one, and never on an ignored label)."""
    trained = labels != IGNORE_INDEX
    if loss_mask is not None:
        trained &= loss_mask.to(torch.bool)
    return labels.masked_fill(~trained, 0), trained.to(torch.float32)


def document_attention_mask(cu_seqlens: torch.Tensor, rows: int, seq_len: int) -> torch.Tensor:
    """[rows, 1, seq_len, seq_len] bool, True where blocked: a token sees the earlier tokens of
    its own sequence only (``cu_seqlens``: offsets over the flattened rows)."""
    _check_offsets(cu_seqlens, rows, seq_len)
    flat = torch.arange(rows * seq_len, device=cu_seqlens.device, dtype=torch.int32)
    sequence = torch.searchsorted(cu_seqlens, flat, right=True).reshape(rows, seq_len)
    same = sequence[:, :, None] == sequence[:, None, :]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=cu_seqlens.device).tril()
    return (~(same & causal)).unsqueeze(1)


def packed_seq_params(cu_seqlens: torch.Tensor) -> Any:
    """megatron-core's ``PackedSeqParams`` in the ``thd`` format for int32 ``cu_seqlens``
    (every sequence, padding runs included, is its own: padded offsets are the same)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    longest = int(torch.diff(cu_seqlens).max()) if len(cu_seqlens) > 1 else 0
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        cu_seqlens_q_padded=cu_seqlens,
        cu_seqlens_kv_padded=cu_seqlens,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )


def _row_tensors(batch: Mapping[str, ArrayLike]) -> dict[str, torch.Tensor]:
    """The batch's [rows, seq_len] tensors it has, as torch tensors (numpy ones shared)."""
    names = ("input_ids", "labels", "loss_mask", "position_ids")
    return {name: torch.as_tensor(batch[name]) for name in names if name in batch}


def _rows_shape(
    rows: Mapping[str, torch.Tensor], cu_seqlens: torch.Tensor, seq_length: int | None
) -> tuple[int, int]:
    """(rows, seq_len) of the batch: from a row tensor, else from ``seq_length``."""
    for tensor in rows.values():
        return int(tensor.shape[0]), int(tensor.shape[1])
    if seq_length is None:
        raise ValueError("this batch has no token tensors: pass seq_length for its attention mask")
    return int(cu_seqlens[-1]) // seq_length, seq_length


def _check_offsets(cu_seqlens: torch.Tensor, rows: int, seq_len: int) -> None:
    """The offsets cover exactly the batch's tokens (they come from the same batch)."""
    ends = cu_seqlens[[0, -1]].tolist() if len(cu_seqlens) else []
    if len(cu_seqlens) < 2 or ends != [0, rows * seq_len]:
        raise ValueError(
            f"cu_seqlens must run from 0 to the batch's {rows} × {seq_len} tokens, not over {ends}"
        )
