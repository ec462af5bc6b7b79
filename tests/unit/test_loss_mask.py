"""Tokens a loss is taken on, from a payload's trained spans to a batch's labels and loss_mask:
spans checked as they arrive, kept when a relay splits a payload, cut with a split sample's
pieces, and the loss_mask crossing the socket as the labels' ignored bits (no extra bytes)."""

from __future__ import annotations

import numpy as np
import pytest

from msd.batch.cp_slice import cp_slice
from msd.batch.pack import IGNORE_INDEX, Piece, pack_rows
from msd.client import device
from msd.errors import ProtocolError
from msd.wire import compact
from msd.wire.protocol import Payload, decode, encode, trained_spans
from msd.wire.relay import split_payload


def _payload(**fields: object) -> Payload:
    base: dict[str, object] = {
        "step": 1,
        "source": (0, 1),
        "gpos": (5, 6),
        "lengths": (6, 3),
        "trained": (2, 1),
        "spans": (1, 2, 4, 6, 0, 3),
    }
    return Payload(**{**base, **fields})  # type: ignore[arg-type]


def _tokens(n: int) -> bytes:
    return np.arange(1, n + 1, dtype=np.int32).tobytes()


def test_trained_spans_travel_with_their_samples_and_are_checked() -> None:
    msg, _ = decode(encode(_payload(), [_tokens(9)]))
    spans = trained_spans(msg)
    assert spans is not None
    assert [s.tolist() for s in spans] == [[[1, 2], [4, 6]], [[0, 3]]]
    assert trained_spans(Payload(step=1, source=(0,), gpos=(1,), lengths=(2,))) is None
    for bad in (
        {"spans": (1, 2, 4, 7, 0, 3)},  # past the sample's end
        {"spans": (4, 6, 1, 2, 0, 3)},  # out of order
        {"spans": (2, 1, 4, 6, 0, 3)},  # ends before it starts
        {"trained": (2,)},  # one count for two samples
        {"trained": (1, 1)},  # counts and bounds disagree
        {"trained": (), "spans": (0, 1)},
    ):
        with pytest.raises(ProtocolError, match="trained spans"):
            decode(encode(_payload(**bad), [_tokens(9)]))


def test_a_relay_keeps_each_samples_spans() -> None:
    msg = _payload(to=(7, 8))
    parts = split_payload(msg, [np.frombuffer(_tokens(9), dtype=np.int32)], hop=lambda d: d)
    first, second = parts[7][0], parts[8][0]
    assert (first.trained, first.spans) == ((2,), (1, 2, 4, 6))
    assert (second.trained, second.spans) == ((1,), (0, 3))


def test_labels_are_ignored_where_the_predicted_token_is_not_trained() -> None:
    tokens = np.arange(10, 16)  # 6 tokens
    trained = np.array([[2, 4]])  # tokens 2 and 3 are trained: predicted from 1 and 2
    packed = pack_rows([[Piece(0, 0, tokens, trained=trained)]], 8, loss_mask=True)
    labels = packed["labels"][0]
    assert labels.tolist() == [IGNORE_INDEX, 12, 13] + [IGNORE_INDEX] * 5
    assert packed["loss_mask"][0].tolist() == [False, True, True] + [False] * 5
    plain = pack_rows([[Piece(0, 0, tokens)]], 8)
    assert "loss_mask" not in plain
    assert plain["labels"][0].tolist() == [11, 12, 13, 14, 15] + [IGNORE_INDEX] * 3


def test_a_split_samples_pieces_keep_their_own_part_of_the_spans() -> None:
    tokens = np.arange(20, 30)  # one sample of 10, split 6 + 4
    trained = np.array([[3, 8]])
    first = Piece(0, 0, tokens[:6], offset=0, trained=trained - 0)
    second = Piece(0, 0, tokens[6:], offset=6, trained=trained - 6)
    packed = pack_rows([[first], [second]], 6, loss_mask=True)
    # Whole: labels at 2..6 predict tokens 3..7; a piece's last label is ignored (no next token).
    assert packed["loss_mask"].tolist() == [
        [False, False, True, True, True, False],
        [True, False, False, False, False, False],
    ]


def test_loss_mask_crosses_the_socket_as_the_labels_ignored_bits() -> None:
    tokens = np.arange(300, 340)
    packed = pack_rows(
        [[Piece(0, 0, tokens, trained=np.array([[5, 9], [20, 31]]))]], 48, loss_mask=True
    )
    with_mask = compact.encode(packed, packed)
    without = compact.encode({k: v for k, v in packed.items() if k != "loss_mask"}, packed)
    assert sum(f.nbytes for f in with_mask.values()) == sum(f.nbytes for f in without.values())
    names = ("labels", "loss_mask")
    carried = {f: with_mask[f] for f in compact.carried_by(names, with_mask)}
    shapes = {n: (packed[n].shape, str(packed[n].dtype)) for n in names}
    got = compact.decode(carried, shapes)
    assert np.array_equal(got["loss_mask"], packed["loss_mask"])
    assert np.array_equal(got["labels"], packed["labels"])
    only = compact.carried_by(("loss_mask",), with_mask)
    assert only == ["labels/ignored"]
    with pytest.raises(ProtocolError, match="not bool"):
        compact.decode(carried, {"loss_mask": (packed["loss_mask"].shape, "int64")})


def test_context_parallel_ranks_get_their_slices_of_the_mask() -> None:
    tokens = np.arange(1, 9)
    packed = pack_rows([[Piece(0, 0, tokens, trained=np.array([[4, 8]]))]], 8, loss_mask=True)
    for rank in range(2):
        part = cp_slice(packed, 2, rank)
        assert np.array_equal(part["loss_mask"], part["labels"] != IGNORE_INDEX)


def test_torch_builds_the_loss_mask_numpy_decodes() -> None:
    tokens = np.arange(300, 330)
    packed = pack_rows(
        [[Piece(0, 0, tokens, trained=np.array([[2, 9], [15, 29]]))]], 37, loss_mask=True
    )
    names = ("labels", "loss_mask")
    frames = compact.encode(packed, names)
    shapes = {n: (packed[n].shape, str(packed[n].dtype)) for n in names}
    built = device.build({n: device.host_frame(f, pin=False) for n, f in frames.items()}, shapes)
    assert built["loss_mask"].numpy().tobytes() == packed["loss_mask"].tobytes()
    assert built["labels"].numpy().tobytes() == packed["labels"].tobytes()


def test_a_meta_carries_trained_spans_checked_as_a_payloads_are() -> None:
    from msd.wire.protocol import Meta

    meta = Meta(
        source=0,
        gpos_start=3,
        lengths=(6, 3),
        sample_ids=(1, 2),
        trained=(2, 1),
        spans=(1, 2, 4, 6, 0, 3),
    )
    got, _ = decode(encode(meta))
    spans = trained_spans(got)
    assert spans is not None and [s.tolist() for s in spans] == [[[1, 2], [4, 6]], [[0, 3]]]
    with pytest.raises(ProtocolError, match="trained spans"):
        decode(encode(msgspec_replace(meta, spans=(1, 2, 4, 7, 0, 3))))


def msgspec_replace(msg: object, **fields: object) -> object:
    import msgspec

    return msgspec.structs.replace(msg, **fields)  # type: ignore[type-var]


def test_trained_tokens_are_counted_per_source_and_survive_a_checkpoint_round_trip() -> None:
    from msd.checkpoint.snapshot import Counters
    from msd.roles.planner.routing import _within

    spans = np.array([[2, 5], [8, 12]])
    assert [_within(spans, a, b) for a, b in ((0, 20), (0, 4), (4, 9), (12, 30))] == [7, 2, 2, 0]
    total = Counters(trained=((1, 7),)) + Counters(trained=((0, 3), (1, 2)))
    assert total.trained == ((0, 3), (1, 9))
    assert Counters.from_json(total.as_json()) == total
    assert "trained" not in Counters().as_json()  # jobs without conversations: files unchanged
    assert total.trained_per_source(3) == (3, 9, 0)
