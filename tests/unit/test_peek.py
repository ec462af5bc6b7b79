"""msd.peek: a packed batch back into rows, samples, text and pictures."""

from __future__ import annotations

import numpy as np
import pytest

from msd.batch.pack import Piece, pack_rows
from msd.peek import (
    Placeholders,
    as_json,
    bytes_text,
    rows_of,
    sheet_layout,
    spans_of,
    unpatchify,
    unpatchify_frames,
)
from msd.sources.video import VideoSpec, patchify_frames
from msd.sources.vision import ImageGeometry, patchify

IMAGE = 300


def _piece(source: int, sample_id: int, text: bytes, offset: int = 0, **kw: object) -> Piece:
    return Piece(
        source, sample_id, np.frombuffer(text, dtype=np.uint8).astype(np.int64), offset=offset, **kw
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("merge, temporal", [(2, 1), (2, 2), (1, 1), (3, 2)])
def test_unpatchify_is_the_exact_inverse_of_patchify(merge: int, temporal: int) -> None:
    p = 14
    geometry = ImageGeometry(
        patch_size=p, merge_size=merge, temporal_patch_size=temporal, min_pixels=(p * merge) ** 2
    )
    rng = np.random.default_rng(0)
    h, w = 3 * p * merge, 5 * p * merge  # not square: rows and columns cannot be swapped
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    patches = patchify(rgb, geometry)
    back = unpatchify(patches, (h // p, w // p), p, merge, temporal)
    assert back.dtype == np.uint8 and np.array_equal(back, rgb)


def test_unpatchify_frames_is_the_exact_inverse_of_patchify_frames() -> None:
    spec = VideoSpec(patch_size=14, merge_size=2, temporal_patch_size=2)
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, (4, 56, 84, 3), dtype=np.uint8)
    patches = patchify_frames(frames, spec)
    back = unpatchify_frames(patches, (2, 4, 6), 14, 2, 2)
    assert np.array_equal(back, frames)


def test_rows_of_finds_each_sample_where_it_was_packed() -> None:
    seq_len = 16
    rows = [
        [_piece(0, 7, b"hello"), _piece(1, 3, b"w\xc3\xa9rld!", offset=32)],
        [_piece(1, 9, b"0123456789abcdef")],  # fills its row: no padding
        [_piece(0, 0, b"ab")],
    ]
    batch = pack_rows(rows, seq_len)
    found = rows_of(batch, ["web", "code"], [bytes_text, bytes_text])
    listed = [
        (r.index, s.source_name, s.sample_id, s.offset, s.start, s.length)
        for r in found
        for s in r.samples
    ]
    assert listed == [
        (0, "web", 7, 0, 0, 5),
        (0, "code", 3, 32, 5, 7),
        (1, "code", 9, 0, 0, 16),
        (2, "web", 0, 0, 0, 2),
    ]
    assert [r.padding for r in found] == [4, 0, 14]
    texts = [span.text for r in found for s in r.samples for span in s.spans]
    assert "".join(texts) == "hellowérld!0123456789abcdefab"
    # every token but a sample's first is trained (its label before it predicts it)
    first = found[0].samples[0]
    assert first.trained.tolist() == [False, True, True, True, True]
    assert not first.spans[0].trained and first.spans[1].text == "ello"


def test_untrained_turns_and_placeholders_are_spans_of_their_own() -> None:
    tokens = np.array([ord("Q"), IMAGE, IMAGE, IMAGE, ord("a"), ord("b"), ord("c")])
    trained = np.array([False, False, False, False, False, True, True])
    spans = spans_of(tokens, trained, bytes_text, Placeholders(image=IMAGE))
    assert [(s.kind, s.start, s.stop, s.trained, s.text) for s in spans] == [
        ("text", 0, 1, False, "Q"),
        ("image", 1, 4, False, ""),
        ("text", 4, 5, False, "a"),
        ("text", 5, 7, True, "bc"),
    ]


def test_a_chat_samples_loss_mask_shows_in_its_trained_tokens() -> None:
    # the loss on tokens 3..6 only (an assistant's reply)
    piece = _piece(0, 1, b"Hi?Yes.", trained=np.array([[3, 7]]))
    batch = pack_rows([[piece]], 8, loss_mask=True)
    (row,) = rows_of(batch, ["chat"], [bytes_text])
    (sample,) = row.samples
    assert sample.trained.tolist() == [False, False, False, True, True, True, True]
    assert [(s.text, s.trained) for s in sample.spans] == [("Hi?", False), ("Yes.", True)]
    (data,) = as_json([row])
    assert data["samples"][0]["trained"] == 4 and data["samples"][0]["text"] == "Hi?Yes."


def test_bytes_text_replaces_bad_utf8_and_shows_large_ids() -> None:
    assert bytes_text([0xFF, ord("a"), 256, ord("b")]) == "\ufffda<256>b"


def test_sheet_layout_puts_tiles_in_lines_with_room_for_labels() -> None:
    size, corners = sheet_layout([(10, 20), (30, 5), (7, 7)], columns=2, gap=4)
    assert corners == [(4, 4), (28, 4), (4, 4 + 30 + 12 + 4)]
    assert size == (4 + 20 + 4 + 5 + 4, 4 + 30 + 16 + 7 + 16 + 4)
