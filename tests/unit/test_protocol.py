import msgspec
import pytest

from msd.errors import ProtocolError
from msd.wire.protocol import Batch, Get, Hello, Payload, TensorSpec, decode, encode


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


def test_wrong_buffer_counts_and_sizes_are_refused():
    with pytest.raises(ProtocolError, match="expected 1"):
        decode(encode(Payload(step=3, source=(1,), gpos=(9,), lengths=(1,))))
    batch = Batch(step=0, tensors=(TensorSpec("x", "int64", (2,)),))
    with pytest.raises(ProtocolError, match="expected 16"):
        decode(encode(batch, [b"\x00" * 8]))


def test_garbage_is_a_protocol_error_not_an_unpickle():
    import pickle

    with pytest.raises(ProtocolError):
        decode([pickle.dumps({"kind": 8})])
    with pytest.raises(ProtocolError):
        decode([msgspec.msgpack.encode([999, 1])])
    assert decode(encode(Get(rank=1, step=2, consumed=2)))[0] == Get(rank=1, step=2, consumed=2)
