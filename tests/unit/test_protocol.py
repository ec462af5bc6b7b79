import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msd.errors import ProtocolError
from msd.wire.protocol import (
    DISCARD,
    PLAN_COLUMNS,
    Batch,
    Get,
    Hello,
    Meta,
    Payload,
    Plan,
    Route,
    TensorSpec,
    decode,
    encode,
    frame_offsets,
)


def a_plan(step: int = 4, **columns: tuple[int, ...]) -> Plan:
    """Two pieces: all of sample (0, 9) in row 0 of DP rank 1, then the start of (2, 3)."""
    base = {
        "dp": (1, 1),
        "row": (0, 0),
        "source": (0, 2),
        "gpos": (9, 3),
        "sample_id": (90, 30),
        "length": (5, 3),
        "offset": (0, 0),
        "padded": (5, 3),
    }
    return Plan(step=step, **{**base, **columns})


def test_messages_round_trip():
    msg = Hello(role="loader", name="web/0", version=1, pid=5, sources=(2,))
    assert decode(encode(msg)) == (msg, [])


def test_buffers_travel_as_separate_frames():
    frames = encode(Payload(step=3, source=(1,), gpos=(9,), lengths=(1,)), [b"\x01\x00\x00\x00"])
    msg, buffers = decode(frames)
    assert (
        msg == Payload(step=3, source=(1,), gpos=(9,), lengths=(1,))
        and bytes(buffers[0]) == b"\x01\x00\x00\x00"
    )


X = TensorSpec("x", "int64", (2,))


def test_wrong_buffer_counts_and_sizes_are_refused():
    with pytest.raises(ProtocolError, match="expected 1"):
        decode(encode(Payload(step=3, source=(1,), gpos=(9,), lengths=(1,))))
    batch = Batch(step=0, tensors=(X,), frames=(X,))
    with pytest.raises(ProtocolError, match="expected 16"):
        decode(encode(batch, [b"\x00" * 8]))
    with pytest.raises(ProtocolError, match="expected 1"):
        decode(encode(batch, [b"\x00" * 16, b"\x00"]))
    two = Batch(step=0, tensors=(X,), frames=(X, X))
    with pytest.raises(ProtocolError, match="two frames of one name"):
        decode(encode(two, [b"\x00" * 32]))


def test_a_batch_carries_its_frames_in_one_aligned_buffer():
    odd = TensorSpec("a", "uint8", (3,))
    frames = (odd, TensorSpec("b", "int64", (2,)), TensorSpec("c", "uint16", (0,)))
    assert frame_offsets(frames) == [0, 8, 24, 24]
    msg, buffers = decode(encode(Batch(0, (X,), frames), [b"\x01" * 24]))
    assert msg.frames == frames and buffers[0].nbytes == 24
    with pytest.raises(ProtocolError, match="take 19 bytes, expected 24"):
        decode(encode(Batch(0, (X,), frames), [b"\x01" * 19]))


def test_payload_tokens_come_in_a_small_integer_type():
    one = Payload(step=3, source=(1,), gpos=(9,), lengths=(4,), token_dtype="uint8")
    assert bytes(decode(encode(one, [b"\x01" * 4]))[1][0]) == b"\x01" * 4
    with pytest.raises(ProtocolError, match="does not match its buffer"):
        decode(encode(one, [b"\x01" * 16]))
    for dtype in ("int64", "float32", "object"):
        bad = Payload(step=3, source=(1,), gpos=(9,), lengths=(1,), token_dtype=dtype)
        with pytest.raises(ProtocolError, match="tokens of type"):
            decode(encode(bad, [b"\x01" * 8]))


def test_garbage_is_a_protocol_error_not_an_unpickle():
    import pickle

    with pytest.raises(ProtocolError):
        decode([pickle.dumps({"kind": 8})])
    with pytest.raises(ProtocolError):
        decode([msgspec.msgpack.encode([999, 1])])
    assert decode(encode(Get(rank=1, step=2, consumed=2)))[0] == Get(rank=1, step=2, consumed=2)


def test_impossible_payloads_and_tensors_are_refused():
    with pytest.raises(ProtocolError, match="sources"):
        decode(encode(Payload(step=0, source=(1, 2), gpos=(9,), lengths=(1,)), [b"\x00" * 4]))
    with pytest.raises(ProtocolError, match="negative"):
        decode(encode(Payload(step=0, source=(1,), gpos=(9,), lengths=(-1,)), [b""]))
    with pytest.raises(ProtocolError, match="negative"):
        decode(encode(Payload(step=-1, source=(1,), gpos=(9,), lengths=(0,)), [b""]))
    for dtype in ("object", "V8", "(2,)i4", "float64,int8"):
        spec = TensorSpec("x", dtype, (1,))
        for batch in (Batch(0, (spec,), (X,)), Batch(0, (X,), (spec,))):
            with pytest.raises(ProtocolError, match="dtype"):
                decode(encode(batch, [b"\x00" * 16]))
    huge = TensorSpec("x", "int64", (1 << 40, 1 << 40))
    with pytest.raises(ProtocolError):
        decode(encode(Batch(step=0, tensors=(huge,), frames=(huge,)), [b"\x00" * 8]))
    assert frame_offsets((huge,))[-1] > 1 << 80  # counted in floats: no overflow to a small size


def test_a_plan_travels_as_named_columns():
    plan = a_plan()
    assert decode(encode(plan)) == (plan, [])
    assert plan.gpos == (9, 3) and plan.padded == (5, 3)
    assert tuple(f for f in Plan.__struct_fields__ if f != "step") == PLAN_COLUMNS
    empty = Plan(
        step=0, dp=(), row=(), source=(), gpos=(), sample_id=(), length=(), offset=(), padded=()
    )
    assert decode(encode(empty))[0] == empty


@pytest.mark.parametrize("column", PLAN_COLUMNS)
def test_a_plan_with_a_short_or_negative_column_is_refused(column):
    with pytest.raises(ProtocolError, match="different lengths"):
        decode(encode(a_plan(**{column: (1,)})))
    with pytest.raises(ProtocolError, match=column):
        decode(encode(a_plan(**{column: (1, -1)})))


def test_a_plan_or_route_for_a_negative_step_is_refused():
    with pytest.raises(ProtocolError, match="step -1"):
        decode(encode(a_plan(step=-1)))
    with pytest.raises(ProtocolError, match="step -1"):
        decode(encode(Route(step=-1, source=(0,), gpos=(1,), constructor=(0,))))


def test_a_route_is_checked_like_a_plan_but_may_discard():
    route = Route(step=2, source=(0, 1), gpos=(5, 6), constructor=(0, DISCARD))
    assert decode(encode(route))[0] == route
    with pytest.raises(ProtocolError, match="different lengths"):
        decode(encode(Route(step=2, source=(0, 1), gpos=(5,), constructor=(0, 0))))
    with pytest.raises(ProtocolError, match="constructor -2"):
        decode(encode(Route(step=2, source=(0,), gpos=(5,), constructor=(-2,))))


# Every kind, with fields of the right shape: the starting points that mutations break.
_VALID = [
    encode(Hello(role="loader", name="web/0", version=4, pid=5, sources=(0,))),
    encode(Get(rank=1, step=2, consumed=2)),
    encode(Payload(step=3, source=(1,), gpos=(9,), lengths=(2,)), [b"\x01" * 8]),
    encode(Batch(step=0, tensors=(X,), frames=(TensorSpec("x", "int32", (2,)),)), [b"\x00" * 8]),
    encode(a_plan()),
    encode(Route(step=1, source=(0, 1), gpos=(5, 6), constructor=(0, DISCARD))),
]


@settings(max_examples=400, deadline=None)
@given(
    base=st.sampled_from(_VALID),
    cut=st.integers(0, 64),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=4),
    extra=st.lists(st.binary(max_size=16), max_size=2),
)
def test_any_mutated_message_decodes_or_is_a_protocol_error(base, cut, flips, extra):
    """Truncated, bit-flipped, with frames added or lost: decoding either yields a message
    whose buffers match it, or raises ProtocolError, never anything else."""
    header = bytearray(bytes(base[0])[: max(1, len(base[0]) - cut)])
    for at, bits in flips:
        header[at % len(header)] ^= bits
    frames = [bytes(header), *base[1:], *extra]
    try:
        msg, buffers = decode(frames)
    except ProtocolError:
        return
    assert isinstance(msg, msgspec.Struct) and all(isinstance(b, memoryview) for b in buffers)


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.binary(max_size=64), max_size=4))
def test_random_frames_decode_or_are_a_protocol_error(frames):
    try:
        msg, _ = decode(frames)
    except ProtocolError:
        return
    assert isinstance(msg, msgspec.Struct)


def test_a_meta_whose_frame_counts_do_not_divide_its_patches_is_refused() -> None:
    video = Meta(
        source=0,
        gpos_start=0,
        lengths=(9,),
        sample_ids=(0,),
        images=(2,),
        patches=(16, 4),
        frames=(4, 1),
    )
    assert decode(encode(video))[0] == video
    for frames in ((3, 1), (4,), (0, 1)):
        bad = msgspec.structs.replace(video, frames=frames)
        with pytest.raises(ProtocolError, match="frame counts"):
            decode(encode(bad))
