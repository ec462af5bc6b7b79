"""``msd.integrations.megatron``: msd's packed batches as megatron-core expects them.

Batches are made as the Constructor makes them (``msd.batch.pack.pack_rows``), cross the wire format
(``msd.wire.compact``) and come back as the Client's CPU tensors
(``msd.client.device.cpu_tensors``).
The references are megatron-core's own: its GPT dataset's masks and positions for documents
that end where msd's samples end, its ``PackedSeqParams``, and a real ``GPTModel``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from msd.batch.cp_slice import cp_slice
from msd.batch.pack import Piece, pack_rows
from msd.client import device
from msd.integrations.megatron import IGNORE_INDEX, get_batch, megatron_batch
from msd.wire import compact

pytest.importorskip("megatron.core")
from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids
from megatron.core.packed_seq_params import PackedSeqParams

SEQ_LEN = 64
TEXT = (
    b"Packed rows hold whole samples back to back; a sample attends only to itself, and the "
    b"loss is taken where its labels say. "
)


def sample(rng: np.random.Generator, n: int, padded: int = 0, trained: bool = False) -> Piece:
    at = int(rng.integers(0, len(TEXT) - n))
    tokens = np.frombuffer(TEXT[at : at + n], dtype=np.uint8).astype(np.int64)
    spans = np.array([[n // 2, n]]) if trained else None  # a reply after its prompt
    return Piece(source=0, sample_id=at, tokens=tokens, padded=padded, trained=spans)


def layouts(seed: int = 0) -> list[list[Piece]]:
    """Three rows: samples with a padding tail, a full row, a half-trained reply and a sample
    padded within its own span (context parallelism's padding)."""
    rng = np.random.default_rng(seed)
    return [
        [sample(rng, 13), sample(rng, 20), sample(rng, 9)],
        [sample(rng, 40), sample(rng, 24)],
        [sample(rng, 30, trained=True), sample(rng, 11, padded=16), sample(rng, 7)],
    ]


def client_batch(rows: list[list[Piece]], names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What ``msd.Client`` hands out for ``rows``: packed, encoded, decoded to CPU tensors."""
    arrays = pack_rows(rows, SEQ_LEN, loss_mask=True)
    names = names or tuple(arrays)
    shapes = {n: (arrays[n].shape, str(arrays[n].dtype)) for n in names}
    return device.cpu_tensors(compact.encode(arrays, names), shapes, None)


def megatron_reference(row: list[Piece]) -> tuple[torch.Tensor, torch.Tensor]:
    """megatron-core's mask [1, s, s] and positions for a row whose documents end where the
    row's samples (and its padding) end: an EOD token on each one's last position."""
    eod, data = -1, torch.zeros(SEQ_LEN, dtype=torch.int64)
    at = 0
    for piece in row:
        at += max(len(piece.tokens), piece.padded)
        data[at - 1] = eod
    mask, _, positions = _get_ltor_masks_and_position_ids(data, eod, True, True, False, True)
    return mask, positions


def test_a_dense_batch_is_megatrons_with_msds_samples_as_its_documents() -> None:
    rows = layouts()
    batch = client_batch(rows)
    out = megatron_batch(batch)
    b = len(rows)
    assert out["tokens"].shape == (b, SEQ_LEN) and out["tokens"].dtype == torch.int64
    assert out["labels"].shape == (b, SEQ_LEN) and out["labels"].dtype == torch.int64
    assert out["loss_mask"].dtype == torch.float32
    assert out["attention_mask"].shape == (b, 1, SEQ_LEN, SEQ_LEN)
    assert out["attention_mask"].dtype == torch.bool and out["packed_seq_params"] is None
    assert torch.equal(out["loss_mask"], batch["loss_mask"].float())
    trained = out["loss_mask"].bool()
    # the half-trained reply: its prompt carries no loss
    assert not trained[2, :14].any() and trained[2, 15:29].all()
    for r, row in enumerate(rows):
        mask, positions = megatron_reference(row)
        assert torch.equal(out["attention_mask"][r], mask), r
        assert torch.equal(out["position_ids"][r], positions), r
        at = 0
        for piece in row:
            n = len(piece.tokens)
            tokens = torch.from_numpy(piece.tokens)
            assert torch.equal(out["tokens"][r, at : at + n], tokens)
            # where trained, the label is the sample's next token; nowhere is it -100
            predicted = trained[r, at : at + n - 1]
            assert torch.equal(out["labels"][r, at : at + n - 1][predicted], tokens[1:][predicted])
            at += max(n, piece.padded)
    assert (out["labels"][~trained] == 0).all() and (out["labels"] >= 0).all()


def test_packed_batches_carry_megatrons_thd_params_instead_of_a_mask() -> None:
    rows = layouts(1)
    batch = client_batch(rows)
    out = get_batch(iter([batch]), packed=True)
    total = len(rows) * SEQ_LEN
    assert out["attention_mask"] is None
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        assert out[key].shape == (1, total), key
    assert torch.equal(out["tokens"][0], batch["input_ids"].reshape(-1))
    params = out["packed_seq_params"]
    assert isinstance(params, PackedSeqParams) and params.qkv_format == "thd"
    spans = [max(len(p.tokens), p.padded) for p in rows[0]]
    spans.append(SEQ_LEN - sum(spans))  # the first row's padding tail is a sequence of its own
    expected = [0, *np.cumsum(spans).tolist()]
    cu = params.cu_seqlens_q
    assert cu.dtype == torch.int32 and cu[: len(expected)].tolist() == expected
    assert int(cu[0]) == 0 and int(cu[-1]) == total and bool((torch.diff(cu) > 0).all())
    for name in ("cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
        assert torch.equal(getattr(params, name), cu), name
    assert params.max_seqlen_q == params.max_seqlen_kv == 40  # the 40-token sample
    # every sequence's positions count from 0 (Megatron's rope reads them per sequence)
    for a, z in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        assert out["position_ids"][0, a:z].tolist() == list(range(z - a))


def test_context_parallel_slices_get_the_whole_sequences_offsets() -> None:
    rows = [[sample(np.random.default_rng(2), 20, padded=24), sample(np.random.default_rng(3), 40)]]
    arrays = pack_rows(rows, SEQ_LEN, loss_mask=True)
    slices = [cp_slice(arrays, 2, rank) for rank in (0, 1)]
    outs = [megatron_batch(s, packed=True, cp_size=2) for s in slices]
    for out in outs:
        assert out["tokens"].shape == (1, SEQ_LEN // 2)
        assert out["packed_seq_params"].cu_seqlens_q.tolist() == arrays["cu_seqlens"].tolist()
        assert out["packed_seq_params"].max_seqlen_q == 40
    # rank 0 holds the first and last quarter of every sequence, rank 1 the middle ones
    assert outs[0]["tokens"][0, :6].tolist() == arrays["input_ids"][0, :6].tolist()
    assert outs[1]["tokens"][0, :6].tolist() == arrays["input_ids"][0, 6:12].tolist()
    with pytest.raises(ValueError, match="needs packed=True"):
        megatron_batch(slices[0], cp_size=2)


def test_a_middle_pipeline_stage_gets_its_mask_from_the_metadata_alone() -> None:
    rows = layouts(3)
    middle = client_batch(rows, ("cu_seqlens", "sample_ids", "source_ids", "sample_offsets"))
    full = megatron_batch(client_batch(rows))
    with pytest.raises(ValueError, match="pass seq_length"):
        megatron_batch(middle)
    out = megatron_batch(middle, seq_length=SEQ_LEN)
    assert all(out[k] is None for k in ("tokens", "labels", "loss_mask", "position_ids"))
    assert torch.equal(out["attention_mask"], full["attention_mask"])
    packed = megatron_batch(middle, packed=True)
    assert packed["packed_seq_params"].cu_seqlens_q.tolist() == middle["cu_seqlens"].tolist()


def test_a_batch_without_offsets_is_refused_in_a_sentence() -> None:
    batch = client_batch(layouts(), ("input_ids", "labels", "position_ids"))
    with pytest.raises(ValueError, match="holds 'cu_seqlens'; this one has only"):
        megatron_batch(batch)
    assert IGNORE_INDEX in batch["labels"]  # msd's labels, before the adapter
    batch = client_batch(layouts())
    batch["cu_seqlens"] = batch["cu_seqlens"][:-1]  # offsets of another batch
    for packed in (False, True):
        with pytest.raises(ValueError, match=r"the batch's 3 × 64 tokens, not over \[0, 1"):
            megatron_batch(batch, packed=packed)


# -- a real megatron-core GPTModel on the CPU ---------------------------------------------------


class _NoCudaRng:
    """megatron-core forks a CUDA RNG around dropout even at probability 0; there is none here."""

    def fork(self, name: str = "") -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


@pytest.fixture(scope="module")
def gpt() -> Iterator[Any]:
    """A two-layer GPTModel (megatron-core's local layers) in a one-process gloo group."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_config import TransformerConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    # CPU stand-ins for two CUDA-only pieces of the local attention: its RNG fork and its
    # score buffer (megatron-core allocates it with torch.cuda.current_device()).
    saved = mrandom._CUDA_RNG_STATE_TRACKER, mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED
    mrandom._CUDA_RNG_STATE_TRACKER, mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = (
        _NoCudaRng(),
        True,
    )
    heads = 4
    scores = torch.empty(len(layouts()) * heads * SEQ_LEN * SEQ_LEN)
    parallel_state.get_global_memory_buffer().buffer[("mpu", torch.float32)] = scores
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=heads,
        use_cpu_initialization=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=256,
        max_sequence_length=SEQ_LEN,
    )
    try:
        yield model
    finally:
        mrandom._CUDA_RNG_STATE_TRACKER, mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = saved
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def test_gpt_models_packed_samples_see_only_themselves(gpt: Any) -> None:
    """A sample's logits in a packed row are its logits alone: the mask keeps them apart."""
    rows = layouts(4)
    out = megatron_batch(client_batch(rows))
    gpt.eval()
    with torch.no_grad():
        packed = gpt(out["tokens"], out["position_ids"], out["attention_mask"])
        at = 0
        for piece in rows[0]:
            n = len(piece.tokens)
            alone = megatron_batch(client_batch([[piece]]))
            logits = gpt(alone["tokens"], alone["position_ids"], alone["attention_mask"])
            torch.testing.assert_close(packed[0, at : at + n], logits[0, :n], rtol=0, atol=1e-4)
            at += n


def test_gpt_model_trains_on_msd_batches(gpt: Any) -> None:
    """Megatron's loss (per-token cross-entropy times loss_mask, over its sum) is finite and
    falls over a few steps of Adam on msd's batches."""
    batches = [client_batch(layouts(seed)) for seed in range(5, 8)]
    gpt.train()
    optimizer = torch.optim.Adam(gpt.parameters(), lr=3e-3)
    losses = []
    for step in range(10):
        out = get_batch(iter(batches[step % 3 :]))
        per_token = gpt(
            out["tokens"], out["position_ids"], out["attention_mask"], labels=out["labels"]
        )
        loss = (per_token.float() * out["loss_mask"]).sum() / out["loss_mask"].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses)), losses
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
