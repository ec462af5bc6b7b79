"""The compact wire gives back every batch byte for byte, and refuses frames that do not fit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msd.batch.cp_slice import cp_slice
from msd.batch.pack import Piece, pack_rows
from msd.batch.sample import FILLER, SampleImages
from msd.errors import ProtocolError
from msd.wire.compact import decode, encode, narrowed

IMAGE_TOKEN = 7

ALL_TENSORS = (
    "input_ids",
    "labels",
    "position_ids",
    "cu_seqlens",
    "sample_ids",
    "source_ids",
    "sample_offsets",
)


def roundtrip(batch: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, np.ndarray]:
    frames = encode(batch, names)
    shapes = {n: (batch[n].shape, str(batch[n].dtype)) for n in names}
    return decode(frames, shapes)


def assert_same(got: dict[str, np.ndarray], batch: dict[str, np.ndarray], names) -> None:
    assert list(got) == list(names)
    for name in names:
        assert got[name].dtype == batch[name].dtype, name
        assert got[name].shape == batch[name].shape, name
        assert got[name].tobytes() == batch[name].tobytes(), name


@st.composite
def packed_rows(draw, cp: int = 1):
    """Rows of pieces (some padded, some empty, tokens anywhere in the vocabulary, token 0 and
    the values that look like padding included), as the Planner could place them."""
    m = 2 * cp
    seq_len = m * draw(st.integers(2, 12))
    vocab = draw(st.sampled_from([256, 50_000, 70_000, 200_000, 2**31 - 1]))
    rows, row, used = [], [], 0
    for n in range(draw(st.integers(1, 10))):
        length = draw(st.integers(0, seq_len))
        # what the Planner gives: a multiple of 2·cp, at least the length; 0 for no tokens
        padded = -(-length // m) * m if cp > 1 else draw(st.integers(0, seq_len))
        padded = padded if length else 0
        if max(length, padded) > seq_len - used:
            rows.append(row)
            row, used = [], 0
        if max(length, padded) > seq_len:
            continue
        tokens = np.array(
            draw(st.lists(st.integers(0, vocab - 1), min_size=length, max_size=length)), np.int32
        )
        offset = draw(st.integers(0, 1000))
        row.append(Piece(draw(st.integers(0, 5)), n, tokens, padded, offset))
        used += max(length, padded)
    rows.append(row)
    rows += [[] for _ in range(draw(st.integers(0, 2)))]  # rows left empty: padding only
    return rows, seq_len


@given(packed_rows())
@settings(max_examples=150, deadline=None)
def test_a_packed_batch_comes_back_byte_for_byte(case):
    rows, seq_len = case
    batch = pack_rows(rows, seq_len)
    assert_same(roundtrip(batch, ALL_TENSORS), batch, ALL_TENSORS)


@given(st.integers(2, 4).flatmap(lambda cp: st.tuples(st.just(cp), packed_rows(cp))))
@settings(max_examples=80, deadline=None)
def test_every_context_parallel_slice_comes_back_byte_for_byte(case):
    cp, (rows, seq_len) = case
    full = pack_rows(rows, seq_len)
    for cp_rank in range(cp):
        part = cp_slice(full, cp, cp_rank)
        assert_same(roundtrip(part, ALL_TENSORS), part, ALL_TENSORS)


def test_images_and_fillers_come_back_byte_for_byte():
    a = SampleImages(np.arange(48, dtype=np.uint8).reshape(8, 6), ((1, 2, 4),))
    tokens = np.array([3, IMAGE_TOKEN, IMAGE_TOKEN, 9, FILLER, FILLER, 0, 4], np.int32)
    rows = [[Piece(0, 0, tokens, 0, 0, a), Piece(1, 1, np.array([0, 0, 5], np.int32))], []]
    batch = pack_rows(rows, 16, IMAGE_TOKEN, 6)
    names = (*ALL_TENSORS, "pixel_values", "image_grid_thw", "vision_cu_seqlens")
    assert_same(roundtrip(batch, names), batch, names)


def test_a_pipeline_stage_gets_only_its_tensors():
    batch = pack_rows([[Piece(0, 0, np.arange(1, 9, dtype=np.int32))]], 12)
    last_stage = ("labels", "position_ids", "cu_seqlens", "sample_ids")
    got = roundtrip(batch, last_stage)
    assert_same(got, batch, last_stage)
    assert "input_ids" not in got  # carried for the labels, not handed out


def test_the_wire_carries_about_two_bytes_a_token_for_a_16_bit_vocabulary():
    rng = np.random.default_rng(0)
    rows = [[Piece(0, i, rng.integers(0, 50_000, 500).astype(np.int32)) for i in range(8)]] * 2
    batch = pack_rows(rows, 4096)
    frames = encode(batch, ALL_TENSORS)
    tokens = batch["input_ids"].size
    before = sum(batch[n].nbytes for n in ALL_TENSORS)
    after = sum(f.nbytes for f in frames.values())
    assert frames["input_ids"].dtype == np.uint16
    assert before / tokens > 24 and after / tokens < 2.2


def test_narrowed_picks_the_smallest_type_that_holds_the_values():
    assert narrowed(np.array([0, 255], np.int64)).dtype == np.uint8
    assert narrowed(np.array([0, 65_535], np.int64)).dtype == np.uint16
    assert narrowed(np.array([0, 2**32 - 1], np.int64)).dtype == np.uint32
    assert narrowed(np.array([-100, 5], np.int64)).dtype == np.int32
    assert narrowed(np.array([-(2**40)], np.int64)).dtype == np.int64
    assert narrowed(np.array([3, 2**31 - 1], np.int32)).dtype == np.int32  # not wider than given
    assert narrowed(np.array([0.5], np.float32)).dtype == np.float32


def _frames() -> tuple[dict[str, np.ndarray], dict[str, tuple[tuple[int, ...], str]]]:
    batch = pack_rows([[Piece(0, 0, np.arange(1, 9, dtype=np.int32))]], 12)
    shapes = {n: (batch[n].shape, str(batch[n].dtype)) for n in ALL_TENSORS}
    return encode(batch, ALL_TENSORS), shapes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.pop("labels/at"), "no frame 'labels/at'"),
        (lambda f: f.update({"labels/ignored": np.zeros(1, np.uint8)}), "bytes for 12 tokens"),
        (
            lambda f: f.update({"labels/at": np.array([99]), "labels/values": np.array([1])}),
            "outside",
        ),
        (lambda f: f.update({"position_ids/at": np.array([3, 1])}), "not increasing from 0"),
        (lambda f: f.update({"position_ids/at": np.array([0, 40])}), "outside"),
        (lambda f: f.pop("input_ids"), "no frame for it"),
        (lambda f: f.update({"input_ids": np.zeros(5, np.uint8)}), "values, its shape"),
        (lambda f: f.update({"cu_seqlens": np.zeros(2, np.float32)}), "arrived as float32"),
        (lambda f: f.update({"sample_ids": np.zeros(1, np.uint64)}), "arrived as uint64"),
    ],
)
def test_frames_that_do_not_fit_are_refused(change, message):
    frames, shapes = _frames()
    change(frames)
    with pytest.raises(ProtocolError, match=message):
        decode(frames, shapes)
