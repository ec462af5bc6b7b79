"""Videos inside samples: fused beside text and images (placeholders, pairing with markers,
damage counted by reason), carried on the wire, and packed into the batch tensors a Qwen2-VL
style model takes. Real files encoded here with PyAV."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from msd.batch.pack import IGNORE_INDEX, Piece, VideoOutput, pack_rows
from msd.batch.sample import SampleImages
from msd.errors import ProtocolError
from msd.launch.auto_loaders import plan_loaders
from msd.recipe.checks import check_recipe
from msd.recipe.schema import Recipe, Source, Video, Vision, stream_fingerprint
from msd.sources import video as videos
from msd.sources.fuse import (
    UNPAIRED_VIDEO,
    UNPAIRED_VIDEO_MARKER,
    VIDEO_NO_BYTES,
    Fuser,
    FuseSpec,
    video_spec_of,
)
from msd.sources.image_rows import ROW_TYPE, ImageRowReader, rows_of
from msd.sources.index import open_source
from msd.sources.read import RowGroupReader
from msd.sources.vision import ImageGeometry
from msd.sources.vision import decode as decode_image
from msd.wire.protocol import Payload, PayloadLayout, decode, encode
from tests.videos import encode as encode_video
from tests.videos import write_tar

IMAGE, VIDEO = 151655, 151656
SPEC = video_spec_of(Video(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16), Vision())
GEOMETRY = ImageGeometry()
FUSE = FuseSpec(
    GEOMETRY, IMAGE, "<image>", 4096, video=SPEC, video_token_id=VIDEO, video_marker="<video>"
)
MP4 = encode_video("mp4", 12, 64, 96, fps=6)  # 2 s: 4 frames at 2 fps, grid (2, 4, 6)
WEBM = encode_video("webm", 8, 45, 61, fps=4)  # odd sides, VP9
PNG = io.BytesIO()
Image.new("RGB", (56, 84), (10, 200, 30)).save(PNG, format="PNG")


def _tokenize(texts: pa.Array) -> list[np.ndarray]:
    return [np.frombuffer(t, dtype=np.uint8).astype(np.int32) + 1 for t in texts.to_pylist()]


def _rows(texts: list[bytes | None], images: list[list], clips: list[list]) -> pa.StructArray:
    return rows_of(
        pa.array(texts, pa.large_binary()),
        pa.array(images, ROW_TYPE[1].type),
        pa.array(clips, ROW_TYPE[2].type),
    )


def _video_patches(data: bytes) -> np.ndarray:
    decoded = videos.decode(data, SPEC)
    assert isinstance(decoded, videos.DecodedVideo)
    return decoded.patches


def test_a_video_takes_patches_over_merge_squared_placeholders_at_its_marker() -> None:
    fuser = Fuser(_tokenize, FUSE, require_text=False)
    ids, kept = fuser(_rows([b"see <video> then"], [[]], [[MP4]]))
    tokens, images = ids[0], kept[0]
    assert images is not None and images.videos == (True,) and images.video_rows == 2
    patches = _video_patches(MP4)
    (t, h, w) = images.grids[0]
    assert (t, h, w) == (2, 4, 6) and len(patches) == t * h * w
    run = np.flatnonzero(tokens == VIDEO)
    assert len(run) == t * h * w // 4 and np.all(np.diff(run) == 1)
    assert run[0] == len(b"see ")  # where the marker was
    assert not np.any(tokens == IMAGE)
    # The video's patches, two image-width rows each, are the decoder's own.
    assert np.array_equal(images.patches.reshape(-1, SPEC.patch_values), patches)
    assert images.rows == (2 * t * h * w,) and images.counts == (t * h * w,)


def test_images_and_videos_keep_the_order_of_their_markers() -> None:
    fuser = Fuser(_tokenize, FUSE, require_text=False)
    text = b"a<video>b<image>c<video>d"
    ids, kept = fuser(_rows([text], [[PNG.getvalue()]], [[MP4, WEBM]]))
    images = kept[0]
    assert images is not None and images.videos == (True, False, True)
    starts = images.starts(ids[0], IMAGE, 2, VIDEO)
    kinds = [int(ids[0][s]) for s in starts]
    assert kinds == [VIDEO, IMAGE, VIDEO]
    image = decode_image(PNG.getvalue(), GEOMETRY)
    rows = np.cumsum((0, *images.rows))
    assert np.array_equal(images.patches[rows[1] : rows[2]], image.patches)  # type: ignore[union-attr]
    assert np.array_equal(
        images.patches[rows[2] : rows[3]].reshape(-1, SPEC.patch_values), _video_patches(WEBM)
    )
    assert images.subset(1, 3).videos == (False, True)


def test_unmarked_videos_follow_the_unmarked_images_before_the_text() -> None:
    fuser = Fuser(_tokenize, FUSE, require_text=False)
    ids, kept = fuser(_rows([b"caption"], [[PNG.getvalue()]], [[MP4]]))
    images = kept[0]
    assert images is not None and images.videos == (False, True)
    first_text = np.flatnonzero((ids[0] != IMAGE) & (ids[0] != VIDEO))[0]
    assert int(ids[0][0]) == IMAGE and int(ids[0][first_text - 1]) == VIDEO
    assert ids[0][first_text:].tolist() == _tokenize(pa.array([b"caption"]))[0].tolist()


def test_damaged_and_unpaired_videos_are_counted_by_reason_and_leave_no_placeholders() -> None:
    fuser = Fuser(_tokenize, FUSE, require_text=False)
    rows = _rows(
        [b"<video>x", b"<video>y<video>", b"z<video>", b"w<video>"],
        [[], [], [], []],
        [[MP4[: len(MP4) // 3]], [b"garbage bytes, not a container"], [MP4, WEBM], [None]],
    )
    ids, kept = fuser(rows)
    assert kept[0] is None and kept[1] is None and kept[3] is None
    assert kept[2] is not None and len(kept[2].grids) == 1
    assert not any(np.any(t == VIDEO) for t in (ids[0], ids[1], ids[3]))
    reasons = Counter({k: v for k, v in fuser.skips.items() if k.startswith("videos undecodable")})
    assert sum(reasons.values()) == 2 and all(k.endswith(")") for k in reasons)
    assert fuser.skips[UNPAIRED_VIDEO_MARKER] == 1  # the second marker of row 1 has no video
    assert fuser.skips[UNPAIRED_VIDEO] == 1  # row 2: two videos, one marker
    assert fuser.skips[VIDEO_NO_BYTES] == 1
    assert fuser.skipped_per_sample == [1, 1, 1, 1]
    assert fuser.videos_read == 5
    assert fuser.video_cost.seconds == pytest.approx(2.0)  # the one decoded: 12 frames at 6 fps
    # The same bytes, the same result: a second Fuser leaves out the same and counts the same.
    again = Fuser(_tokenize, FUSE, require_text=False)
    ids2, _ = again(rows)
    assert again.skips == fuser.skips and all(map(np.array_equal, ids, ids2))


def _piece(sample_id: int, tokens: np.ndarray, images: SampleImages | None) -> Piece:
    return Piece(0, sample_id, tokens, images=images)


def test_a_batch_holds_image_and_video_tensors_apart_in_row_order() -> None:
    fuser = Fuser(_tokenize, FUSE, require_text=False)
    ids, kept = fuser(
        _rows([b"x<video>y<image>", b"<video>q"], [[PNG.getvalue()], []], [[MP4], [WEBM]])
    )
    values = GEOMETRY.patch_values
    video = VideoOutput(VIDEO, SPEC.patch_values, 1.0)
    packed = pack_rows(
        [[_piece(7, ids[0], kept[0]), _piece(8, ids[1], kept[1])]], 4096, IMAGE, values, video
    )
    assert packed["pixel_values_videos"].shape == (
        len(_video_patches(MP4)) + len(_video_patches(WEBM)),
        SPEC.patch_values,
    )
    assert np.array_equal(
        packed["pixel_values_videos"],
        np.concatenate([_video_patches(MP4), _video_patches(WEBM)]),
    )
    assert packed["video_grid_thw"].tolist() == [list(kept[0].grids[0]), list(kept[1].grids[0])]  # type: ignore[union-attr]
    assert packed["video_sample_ids"].tolist() == [7, 8]
    assert packed["image_sample_ids"].tolist() == [7]
    assert packed["pixel_values"].shape[1] == values
    assert np.array_equal(
        np.diff(packed["video_cu_seqlens"]), packed["video_grid_thw"].prod(axis=1)
    )
    assert packed["second_per_grid_ts"].dtype == np.float32
    assert packed["second_per_grid_ts"].tolist() == [1.0, 1.0]
    placeholders = int(np.count_nonzero(packed["input_ids"] == VIDEO))
    assert placeholders == int(packed["video_grid_thw"].prod(axis=1).sum()) // 4
    assert not np.any(packed["labels"] == VIDEO) and not np.any(packed["labels"] == IMAGE)
    assert packed["labels"].min() >= IGNORE_INDEX


def test_a_batch_without_videos_still_names_empty_video_tensors() -> None:
    video = VideoOutput(VIDEO, SPEC.patch_values, 1.0)
    tokens = np.arange(1, 10, dtype=np.int32)
    packed = pack_rows([[_piece(1, tokens, None)]], 16, IMAGE, GEOMETRY.patch_values, video)
    assert packed["pixel_values_videos"].shape == (0, SPEC.patch_values)
    assert packed["video_grid_thw"].shape == (0, 3) and packed["second_per_grid_ts"].shape == (0,)
    without = pack_rows([[_piece(1, tokens, None)]], 16, IMAGE, GEOMETRY.patch_values)
    assert not any(k.startswith(("video", "pixel_values_videos")) for k in without)


def _payload(images: SampleImages) -> tuple[Payload, list[np.ndarray]]:
    tokens = np.arange(5, dtype=np.int32)
    msg = Payload(
        step=0,
        source=(0,),
        gpos=(0,),
        lengths=(5,),
        images=(len(images.grids),),
        grids=tuple(n for g in images.grids for n in g),
        patch_values=images.patches.shape[1],
        videos=tuple(int(v) for v in images.videos),
        video_rows=images.video_rows,
    )
    return msg, [tokens, images.patches]


def test_a_payload_carries_videos_and_refuses_a_wrong_video_size() -> None:
    fuser = Fuser(_tokenize, FUSE, require_text=False)
    _, kept = fuser(_rows([b"<image><video>"], [[PNG.getvalue()]], [[MP4]]))
    assert kept[0] is not None
    msg, buffers = _payload(kept[0])
    frames = encode(msg, buffers)
    got, _ = decode([memoryview(f) for f in frames])
    assert got == msg
    layout = PayloadLayout.of(got)
    assert np.diff(layout.rows).tolist() == list(kept[0].rows)
    bad = msgspec.structs.replace(msg, video_rows=1)
    with pytest.raises(ProtocolError, match="images take"):
        decode([memoryview(f) for f in encode(bad, buffers)])
    flags = msgspec.structs.replace(msg, videos=(1,))
    with pytest.raises(ProtocolError, match="flags 1 videos"):
        decode([memoryview(f) for f in encode(flags, buffers)])


def _recipe(**source: object) -> Recipe:
    doc = {
        "seq_len": 4096,
        "global_batch_tokens": 8192,
        "steps": 10,
        "sources": [{"name": "v", "path": "/d/*.tar", "weight": 1.0, **source}],
    }
    return msgspec.convert(doc, Recipe)


def test_recipes_check_video_sections_and_sources() -> None:
    assert check_recipe(_recipe(video_exts=["mp4"])) == []
    keys = {p.key for p in check_recipe(_recipe(video_exts=["jpg"]))}
    assert "sources[0].video_exts" in keys  # also an image extension
    keys = {p.key for p in check_recipe(_recipe(video_column="clip"))}
    assert "sources[0].video_column" in keys  # not read from WebDataset
    doc = _recipe(video_exts=["mp4"])
    for video, key in (
        (Video(fps=0.0), "video.fps"),
        (Video(min_frames=9, max_frames=4), "video.min_frames"),
        (Video(temporal_patch_size=3), None),
        (Video(video_token_id=151655), "video.video_token_id"),
        (Video(marker="<image>"), "video.marker"),
        (Video(min_pixels=28 * 28 * 4096), "video.min_pixels"),
        (Video(max_decode_pixels=0), "video.max_decode_pixels"),
    ):
        found = {p.key for p in check_recipe(msgspec.structs.replace(doc, video=video))}
        assert (key in found) if key else not found, (video, found)
    odd = msgspec.structs.replace(
        doc,
        vision=msgspec.structs.replace(doc.vision, temporal_patch_size=2),
        video=Video(temporal_patch_size=3),
    )
    assert "video.temporal_patch_size" in {p.key for p in check_recipe(odd)}


def test_a_text_or_image_recipe_keeps_its_stream_fingerprint_with_the_video_section() -> None:
    plain = _recipe()
    tuned = msgspec.structs.replace(plain, video=Video(fps=1.0))
    assert stream_fingerprint(plain) == stream_fingerprint(tuned)
    with_videos = _recipe(video_exts=["mp4"])
    assert stream_fingerprint(with_videos) != stream_fingerprint(
        msgspec.structs.replace(with_videos, video=Video(fps=1.0))
    )


def test_webdataset_video_members_and_parquet_video_columns_are_read_as_rows(
    tmp_path: Path,
) -> None:
    write_tar(
        tmp_path / "s.tar",
        [
            ("a.txt", b"one <video>"),
            ("a.mp4", MP4),
            ("b.txt", b"two"),
            ("b.png", PNG.getvalue()),
            ("b.webm", WEBM),
        ],
    )
    source = Source(
        name="w",
        path=str(tmp_path / "*.tar"),
        weight=1.0,
        format="webdataset",
        video_exts=("mp4", "webm"),
    )
    src = open_source(source, "sources[0]")
    rows = ImageRowReader(source, src, RowGroupReader()).read(src.row_groups[0])
    assert rows.field("videos").to_pylist() == [[MP4], [WEBM]]
    assert rows.field("images").to_pylist() == [[], [PNG.getvalue()]]

    table = pa.table(
        {
            "text": ["<video>x", "y"],
            "clip": pa.array([{"bytes": WEBM, "path": "a.webm"}, {"bytes": None, "path": "b"}]),
        }
    )
    (tmp_path / "p").mkdir()
    pq.write_table(table, tmp_path / "p" / "v.parquet")
    source = Source(
        name="p",
        path=str(tmp_path / "p" / "*.parquet"),
        weight=1.0,
        text_column="text",
        video_column="clip",
    )
    src = open_source(source, "sources[0]")
    rows = ImageRowReader(source, src, RowGroupReader()).read(src.row_groups[0])
    assert rows.field("videos").to_pylist() == [[WEBM], [None]]
    assert rows.field("images").to_pylist() == [[], []]


def test_a_parquet_video_column_of_the_wrong_type_is_refused_naming_file_and_key(
    tmp_path: Path,
) -> None:
    pq.write_table(pa.table({"text": ["a"], "clip": [3]}), tmp_path / "v.parquet")
    source = Source(
        name="p",
        path=str(tmp_path / "*.parquet"),
        weight=1.0,
        text_column="text",
        video_column="clip",
    )
    with pytest.raises(
        Exception, match=r"sources\[0\]\.video_column.*v\.parquet.*not binary, a video struct"
    ):
        open_source(source, "sources[0]")


def test_msd_plan_profiles_a_video_source_with_its_videos_decoded(tmp_path: Path) -> None:
    """``msd plan`` / ``loaders: auto`` measure a video source as its loaders read it: each
    profiled sample's length holds its videos' placeholders, and the cost their decode."""
    table = pa.table(
        {
            "text": ["<video> one", "two <video>", "three"],
            "clip": pa.array(
                [
                    {"bytes": MP4, "path": "a.mp4"},
                    {"bytes": WEBM, "path": "b.webm"},
                    {"bytes": None, "path": "c"},
                ]
            ),
        }
    )
    pq.write_table(table, tmp_path / "v.parquet")
    doc = _recipe(path=str(tmp_path / "*.parquet"), text_column="text", video_column="clip")
    recipe = msgspec.structs.replace(
        doc, video=Video(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    )
    plan = plan_loaders(recipe)
    (profile,) = plan.profiles
    placeholders = [
        videos.plan_video(header, SPEC).patches // 4
        for header in (videos.probe(MP4, SPEC), videos.probe(WEBM, SPEC))
        if isinstance(header, videos.VideoHeader)
    ]
    assert len(placeholders) == 2 and min(placeholders) > 0
    texts = [len(" one"), len("two "), len("three")]  # the test transform: one id a byte
    assert profile.lengths == (texts[0] + placeholders[0], texts[1] + placeholders[1], texts[2])
