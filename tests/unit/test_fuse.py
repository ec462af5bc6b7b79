"""Fusing text tokens and images into one sample: real PNG/JPEG images made with Pillow."""

from __future__ import annotations

import dataclasses
import io
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from msd.batch.sample import FILLER, SampleImages
from msd.sources.fuse import (
    CUT_TOKENS,
    NO_BYTES,
    NO_TEXT,
    OVER_PATCHES,
    PAST_ROW,
    UNDECODABLE,
    UNPAIRED_IMAGE,
    UNPAIRED_MARKER,
    Fuser,
    FuseSpec,
    decode_all,
    fuse,
)
from msd.sources.image_rows import ROW_TYPE, rows_of
from msd.sources.transforms import text_bytes
from msd.sources.vision import DecodedImage, ImageGeometry, decode, placeholder_tokens

GEOMETRY = ImageGeometry()  # 14-pixel patches, 2×2 merge
MERGE = GEOMETRY.merge_size
IMG = 151655  # outside the byte range, so a placeholder is never a text id
MARKER = "<image>"
BIG = 1 << 20  # a seq_len nothing reaches


def _spec(seq_len: int = BIG, marker: str = MARKER) -> FuseSpec:
    return FuseSpec(GEOMETRY, image_token_id=IMG, marker=marker, seq_len=seq_len)


def _image_bytes(height: int, width: int, fmt: str = "PNG", seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, fmt)
    return out.getvalue()


def _decoded(data: bytes) -> DecodedImage:
    image = decode(data, GEOMETRY)
    assert isinstance(image, DecodedImage), image
    return image


# Decoded once: (height, width) → tokens 4 (56×56), 8 (56×112), 16 (112×112), 12 (84×112).
SIZES = ((56, 56), (56, 112), (112, 112), (84, 112))
PNGS = [_image_bytes(h, w, "PNG", seed=i) for i, (h, w) in enumerate(SIZES)]
JPEGS = [_image_bytes(h, w, "JPEG", seed=10 + i) for i, (h, w) in enumerate(SIZES)]
DECODED = [_decoded(b) for b in PNGS]


def _segments(text: bytes, marker: str = MARKER) -> list[np.ndarray]:
    parts = text.split(marker.encode()) if marker else [text]
    return text_bytes(pa.array(parts, pa.large_binary()))


def _ids(text: bytes) -> list[int]:
    return list(text)


def _runs(ids: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of IMG in ids."""
    runs: list[tuple[int, int]] = []
    at = np.flatnonzero(ids == IMG)
    for i in at.tolist():
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _rows(
    texts: list[bytes | None],
    images: list[list[bytes | None] | None],
    videos: list[list[bytes | None] | None] | None = None,
) -> pa.StructArray:
    return rows_of(
        pa.array(texts, pa.large_binary()),
        pa.array(images, ROW_TYPE[1].type),
        pa.array(videos or [[] for _ in texts], ROW_TYPE[2].type),
    )


@pytest.mark.parametrize(
    "data", PNGS + JPEGS, ids=[f"png{s}" for s in SIZES] + [f"jpg{s}" for s in SIZES]
)
def test_placeholders_per_image_are_patches_over_merge_squared(data: bytes) -> None:
    image = _decoded(data)
    ids, pixels = fuse(_segments(b"ab" + MARKER.encode() + b"cd"), [image], _spec(), Counter())
    assert pixels is not None
    patches = pixels.counts[0]
    assert patches == image.patches.shape[0] == pixels.patches.shape[0]
    assert int(np.sum(ids == IMG)) == patches // MERGE**2 == image.tokens
    h, w = image.original_hw
    assert image.tokens == placeholder_tokens(h, w, GEOMETRY)
    assert pixels.patches.shape[1] == GEOMETRY.patch_values and pixels.patches.dtype == np.uint8


def test_each_marker_becomes_one_run_of_placeholders_at_its_place() -> None:
    text = b"ab<image>cd<image>ef"
    first, second = DECODED[1], DECODED[2]
    skips: Counter[str] = Counter()
    ids, pixels = fuse(_segments(text), [first, second], _spec(), skips)
    expected = (
        _ids(b"ab") + [IMG] * first.tokens + _ids(b"cd") + [IMG] * second.tokens + _ids(b"ef")
    )
    assert ids.dtype == np.int32 and ids.tolist() == expected
    assert _runs(ids) == [(2, first.tokens), (4 + first.tokens, second.tokens)]
    assert pixels is not None and pixels.grids == (first.grid, second.grid)
    assert np.array_equal(pixels.patches, np.concatenate([first.patches, second.patches]))
    assert dict(skips) == {}


def test_images_without_markers_precede_the_text() -> None:
    skips: Counter[str] = Counter()
    ids, pixels = fuse(_segments(b"hello"), [DECODED[0], DECODED[3]], _spec(), skips)
    tokens = DECODED[0].tokens + DECODED[3].tokens
    assert ids.tolist() == [IMG] * tokens + _ids(b"hello")
    assert pixels is not None and pixels.grids == (DECODED[0].grid, DECODED[3].grid)
    assert dict(skips) == {}


def test_no_marker_configured_means_images_first_even_if_the_text_holds_one() -> None:
    text = b"x<image>y"
    ids, pixels = fuse(_segments(text, marker=""), [DECODED[0]], _spec(marker=""), Counter())
    assert ids.tolist() == [IMG] * DECODED[0].tokens + _ids(text)
    assert pixels is not None and len(pixels.grids) == 1


def test_more_markers_than_images_drops_the_extra_markers_and_counts_them() -> None:
    text = b"a<image>b<image>c<image>d"
    runs = []
    for _ in range(2):
        skips: Counter[str] = Counter()
        ids, pixels = fuse(_segments(text), [DECODED[0]], _spec(), skips)
        runs.append((ids.tobytes(), dict(skips)))
        assert ids.tolist() == _ids(b"a") + [IMG] * DECODED[0].tokens + _ids(b"bcd")
        assert skips == Counter({UNPAIRED_MARKER: 2})
        assert pixels is not None and pixels.grids == (DECODED[0].grid,)
    assert runs[0] == runs[1]


def test_more_images_than_markers_keeps_the_first_ones_and_counts_the_rest() -> None:
    text = b"a<image>b"
    outputs = []
    for _ in range(2):
        skips: Counter[str] = Counter()
        ids, pixels = fuse(_segments(text), DECODED[:3], _spec(), skips)
        assert ids.tolist() == _ids(b"a") + [IMG] * DECODED[0].tokens + _ids(b"b")
        assert skips == Counter({UNPAIRED_IMAGE: 2})
        assert pixels is not None and pixels.grids == (DECODED[0].grid,)
        outputs.append((ids.tobytes(), pixels.patches.tobytes(), dict(skips)))
    assert outputs[0] == outputs[1]


def test_markers_but_no_images_is_plain_text_with_the_markers_removed() -> None:
    skips: Counter[str] = Counter()
    ids, pixels = fuse(_segments(b"a<image>b<image>"), [], _spec(), skips)
    assert ids.tolist() == _ids(b"ab") and pixels is None
    assert skips == Counter({UNPAIRED_MARKER: 2})


def test_undecodable_and_missing_images_go_with_their_markers_and_are_counted() -> None:
    text = b"s0<image>s1<image>s2<image>s3<image>s4<image>s5"
    images: list[bytes | None] = [PNGS[0], b"not an image at all", None, b"", JPEGS[1]]
    skips: Counter[str] = Counter()
    decoded = decode_all(images, GEOMETRY, skips)
    assert [d is None for d in decoded] == [False, True, True, True, False]
    assert skips == Counter({UNDECODABLE: 1, NO_BYTES: 2})
    ids, pixels = fuse(_segments(text), decoded, _spec(), skips)
    first, last = decoded[0], decoded[4]
    assert first is not None and last is not None
    expected = (
        _ids(b"s0") + [IMG] * first.tokens + _ids(b"s1s2s3s4") + [IMG] * last.tokens + _ids(b"s5")
    )
    assert ids.tolist() == expected
    assert pixels is not None and pixels.grids == (first.grid, last.grid)
    assert skips == Counter({UNDECODABLE: 1, NO_BYTES: 2})  # no marker counted as unpaired


def test_an_image_past_seq_len_and_every_later_one_is_dropped_then_the_text_is_cut() -> None:
    text = b"ab<image>cd<image>efgh<image>ijklmn"
    small, big, last = (dataclasses.replace(DECODED[i]) for i in (0, 1, 0))  # 4, 8, 4 tokens
    seq_len = 2 + small.tokens + 2 + big.tokens - 1  # the second image ends one past the row
    skips: Counter[str] = Counter()
    ids, pixels = fuse(_segments(text), [small, big, last], _spec(seq_len), skips)
    full = _ids(b"ab") + [IMG] * small.tokens + _ids(b"cdefghijklmn")
    assert len(full) > seq_len
    assert ids.tolist() == full[:seq_len]
    assert len(ids) == seq_len
    assert pixels is not None and pixels.grids == (small.grid,)
    # The third image (which alone would fit) is dropped too: a later image never jumps ahead.
    assert skips == Counter({PAST_ROW: 2, CUT_TOKENS: len(full) - seq_len})


def test_an_image_that_exactly_fills_the_row_is_kept() -> None:
    image = DECODED[2]
    seq_len = 3 + image.tokens
    skips: Counter[str] = Counter()
    ids, pixels = fuse(_segments(b"abc<image>defg"), [image], _spec(seq_len), skips)
    assert ids.tolist() == _ids(b"abc") + [IMG] * image.tokens
    assert pixels is not None and pixels.grids == (image.grid,)
    assert skips == Counter({CUT_TOKENS: 4})


def test_a_text_only_sample_may_stay_longer_than_seq_len() -> None:
    text = bytes(range(97, 123)) * 4
    skips: Counter[str] = Counter()
    ids, pixels = fuse(_segments(text), [], _spec(seq_len=10), skips)
    assert ids.tolist() == _ids(text) and pixels is None and not +skips


def test_a_sample_whose_only_image_does_not_fit_becomes_text_only_and_uncut() -> None:
    image = DECODED[2]
    text = b"x" * 20 + b"<image>" + b"y" * 20
    skips: Counter[str] = Counter()
    ids, pixels = fuse(_segments(text), [image], _spec(seq_len=25), skips)
    assert pixels is None
    assert ids.tolist() == _ids(b"x" * 20 + b"y" * 20)
    assert skips == Counter({PAST_ROW: 1})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segments=st.lists(st.binary(max_size=12), min_size=1, max_size=6),
    picks=st.lists(st.sampled_from([0, 1, 2, 3, None]), max_size=6),
    seq_len=st.integers(1, 60),
)
def test_fused_samples_with_images_never_exceed_seq_len(
    segments: list[bytes], picks: list[int | None], seq_len: int
) -> None:
    # A fresh object per image, as decode_all gives: fuse tells kept images apart by identity.
    images = [None if p is None else dataclasses.replace(DECODED[p]) for p in picks]
    text = MARKER.encode().join(s.replace(b"<", b"(") for s in segments)
    skips: Counter[str] = Counter()
    ids, pixels = fuse(_segments(text), images, _spec(seq_len), skips)
    assert ids.dtype == np.int32
    runs = _runs(ids)
    if pixels is None:
        assert not runs
        return
    assert len(ids) <= seq_len
    # Every kept image is one whole run of its own tokens, in order (they may touch each other).
    assert int(np.sum(ids == IMG)) == sum(c // MERGE**2 for c in pixels.counts)
    assert pixels.patches.shape == (sum(pixels.counts), GEOMETRY.patch_values)
    assert isinstance(pixels, SampleImages)
    markers = len(segments) - 1
    paired = min(markers, len(images)) if markers else len(images)
    assert len(pixels.grids) + skips[PAST_ROW] == sum(im is not None for im in images[:paired])


def test_fuser_turns_rows_into_samples_like_fuse() -> None:
    rows = _rows(
        [b"a<image>b", b"plain", None, b"<image><image>z"],
        [[PNGS[0]], [], [JPEGS[0]], [PNGS[1], b"\xff\xd8garbage"]],
    )
    fuser = Fuser(text_bytes, _spec(), require_text=False)
    ids, images = fuser(rows)
    assert len(ids) == len(images) == 4
    assert ids[0].tolist() == _ids(b"a") + [IMG] * DECODED[0].tokens + _ids(b"b")
    assert ids[1].tolist() == _ids(b"plain") and images[1] is None
    jpeg = _decoded(JPEGS[0])
    assert ids[2].tolist() == [IMG] * jpeg.tokens  # no text: the image alone
    assert images[2] is not None and images[2].grids == (jpeg.grid,)
    assert ids[3].tolist() == [IMG] * DECODED[1].tokens + _ids(b"z")
    assert fuser.skips == Counter({UNDECODABLE: 1})
    assert fuser.images_read == 4


def test_fuser_with_require_text_turns_a_null_text_row_into_an_empty_sample() -> None:
    rows = _rows([b"one<image>", None, b"three"], [[PNGS[0]], [PNGS[1]], None])
    fuser = Fuser(text_bytes, _spec(), require_text=True)
    ids, images = fuser(rows)
    assert ids[0].tolist() == _ids(b"one") + [IMG] * DECODED[0].tokens
    assert len(ids[1]) == 0 and images[1] is None
    assert ids[2].tolist() == _ids(b"three") and images[2] is None
    assert fuser.skips == Counter({NO_TEXT: 1})


def test_fuser_counts_skips_across_calls() -> None:
    rows = _rows([b"<image>x<image>"], [[None]])
    fuser = Fuser(text_bytes, _spec(), require_text=True)
    fuser(rows)
    fuser(rows)
    assert fuser.skips == Counter({NO_BYTES: 2, UNPAIRED_MARKER: 2})


def test_the_same_rows_give_byte_identical_samples() -> None:
    texts: list[bytes | None] = [
        b"p<image>q<image>r",
        b"no markers",
        None,
        b"<image>" * 3 + b"tail",
        b"z" * 30 + b"<image>",
        b"w" * 50,
    ]
    images: list[list[bytes | None] | None] = [
        [JPEGS[2], PNGS[3]],
        [JPEGS[0]],
        [PNGS[1]],
        [b"junk", None, JPEGS[3], PNGS[0]],
        [JPEGS[1]],
        [],
    ]

    def run() -> tuple[list[bytes], list[bytes | None], list[object], dict[str, int]]:
        fuser = Fuser(text_bytes, _spec(seq_len=40), require_text=True)
        ids, pixels = fuser(_rows(texts, images))
        return (
            [i.tobytes() for i in ids],
            [None if p is None else p.patches.tobytes() for p in pixels],
            [None if p is None else p.grids for p in pixels],
            dict(fuser.skips),
        )

    first, second = run(), run()
    assert first == second
    assert any(p is not None for p in first[1]) and first[3]  # something kept, something skipped
    with_images = [i for i, p in zip(first[0], first[1], strict=True) if p is not None]
    assert with_images and all(len(i) <= 4 * 40 for i in with_images)  # int32: 4 bytes an id
    assert max(len(i) for i in first[0]) > 4 * 40  # the text-only one stays longer


def test_a_sample_with_nothing_left_out_counts_no_reason() -> None:
    skips: Counter[str] = Counter()
    fuse(_segments(b"a<image>b"), [DECODED[0]], _spec(), skips)
    assert dict(skips) == {}


# -- long samples split into rows (``long_samples: split``) ---------------------------------------


def _split_spec(seq_len: int, rows: int) -> FuseSpec:
    return FuseSpec(GEOMETRY, IMG, MARKER, seq_len, long_samples="split", max_rows=rows)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 40), st.sampled_from(range(len(DECODED)))), max_size=8),
    st.integers(0, 40),
    st.integers(16, 48),
    st.integers(1, 6),
)
def test_a_split_sample_never_cuts_an_image_and_keeps_every_image_that_fits(
    pieces: list[tuple[int, int]], tail: int, seq_len: int, rows: int
) -> None:
    text = b"".join(b"t" * n + MARKER.encode() for n, _ in pieces) + b"e" * tail
    images = [DECODED[k] for _, k in pieces]
    skips: Counter[str] = Counter()
    ids, pixels = fuse(_segments(text), images, _split_spec(seq_len, rows), skips)
    kept = [] if pixels is None else list(pixels.grids)
    assert len(kept) + skips[PAST_ROW] == len(images)
    if pixels is not None:
        assert len(ids) <= seq_len * rows
        # Each image's placeholders lie inside one row: cutting at multiples of seq_len
        # (where the Planner cuts) never splits one.
        starts = pixels.starts(ids, IMG, MERGE)
        for start, count in zip(starts.tolist(), pixels.counts, strict=True):
            tokens = count // MERGE**2
            assert start // seq_len == (start + tokens - 1) // seq_len
            assert np.all(ids[start : start + tokens] == IMG)
        # Fillers only ever come right before an image, up to a row boundary.
        fill = np.flatnonzero(ids == FILLER)
        for f in fill.tolist():
            assert (ids[f + 1] in (FILLER, IMG) and (f + 1) % seq_len != 0) or ids[f + 1] == IMG
    # Without fillers and placeholders, the text is all there (up to the cap).
    text_ids = ids[(ids != IMG) & (ids != FILLER)]
    full_text = np.array(_ids(text.replace(MARKER.encode(), b"")), dtype=np.int32)
    assert np.array_equal(text_ids, full_text[: len(text_ids)])
    assert len(text_ids) == len(full_text) or len(ids) == seq_len * rows


def test_fillers_move_an_image_to_the_next_row() -> None:
    image = DECODED[2]  # 16 tokens
    ids, pixels = fuse(_segments(b"a" * 10 + b"<image>b"), [image], _split_spec(20, 4), Counter())
    assert ids.tolist() == _ids(b"a" * 10) + [FILLER] * 10 + [IMG] * 16 + _ids(b"b")
    assert pixels is not None and pixels.starts(ids, IMG, MERGE).tolist() == [20]


def test_an_image_longer_than_a_row_is_left_out_but_later_ones_are_kept() -> None:
    skips: Counter[str] = Counter()
    big, small = DECODED[2], DECODED[0]  # 16 and 4 tokens
    ids, pixels = fuse(_segments(b"<image>x<image>y"), [big, small], _split_spec(8, 4), skips)
    assert skips == Counter({PAST_ROW: 1})
    assert pixels is not None and pixels.grids == (small.grid,)
    assert ids.tolist() == _ids(b"x") + [IMG] * 4 + _ids(b"y")


def test_a_subset_of_images_takes_their_patches() -> None:
    patches = np.concatenate([d.patches for d in DECODED[:3]])
    images = SampleImages(patches, tuple(d.grid for d in DECODED[:3]))
    middle = images.subset(1, 3)
    assert middle.grids == images.grids[1:]
    assert np.array_equal(middle.patches, np.concatenate([DECODED[1].patches, DECODED[2].patches]))


def test_no_piece_holds_more_patches_than_max_patches() -> None:
    # 16-token images of 64 patches; pieces of 40 tokens hold 64 patches at most: one image each.
    image = DECODED[2]
    spec = dataclasses.replace(_split_spec(40, 4), max_patches=64)
    text = b"a<image>b<image>c<image>"
    skips: Counter[str] = Counter()
    ids, pixels = fuse(_segments(text), [image] * 3, spec, skips)
    assert pixels is not None and len(pixels.grids) == 3 and not skips
    rows = pixels.starts(ids, IMG, MERGE) // 40
    assert rows.tolist() == [0, 1, 2]  # the second and third moved to the next rows
    tight = dataclasses.replace(spec, max_patches=32)  # no image fits at all
    skips = Counter()
    assert fuse(_segments(text), [image] * 3, tight, skips)[1] is None
    assert skips == Counter({OVER_PATCHES: 3})
    one_row = dataclasses.replace(_spec(seq_len=200), max_patches=100)
    skips = Counter()
    _, kept = fuse(_segments(text), [image] * 3, one_row, skips)
    assert kept is not None and len(kept.grids) == 1 and skips == Counter({OVER_PATCHES: 2})
