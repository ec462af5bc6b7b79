"""Videos cut into clips (`msd.sources.clips`, `msd.sources.clip_index`): how many clips a video
holds and which frames each samples, a clip decoded from a keyframe before it equal to the same
frames of a decode from the start, and a source whose index counts clips, not rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from msd.recipe.schema import Clip, Source
from msd.sources import clip_index
from msd.sources.clips import ClipRule, clip_count, clip_window
from msd.sources.image_rows import ImageRowReader
from msd.sources.index import open_source
from msd.sources.read import RowGroupReader
from msd.sources.video import (
    DecodedVideo,
    VideoHeader,
    VideoSpec,
    Window,
    decode,
    patchify_frames,
    plan_video,
    probe,
)
from tests.videos import decode_all, encode, write_tar

SPEC = VideoSpec(min_pixels=28 * 28, max_pixels=56 * 84)


def _header(frames: int, fps: float) -> VideoHeader:
    return VideoHeader(frames, fps, frames / fps, 48, 64, "h264")


@pytest.mark.parametrize(
    ("seconds", "length_s", "stride_s", "count"),
    [
        (65, 30, 30, 2),  # the last 5 s are not a whole clip
        (60, 30, 30, 2),  # exactly two
        (65, 30, 10, 4),  # 0, 10, 20, 30
        (30, 30, 30, 1),  # no longer than a clip: the whole video
        (7, 30, 30, 1),
        (3.1, 1, 0.7, 4),  # 0, 0.7, 1.4, 2.1 (ends at 3.1 exactly)
    ],
)
def test_a_video_holds_the_clips_that_fit_whole(
    seconds: float, length_s: float, stride_s: float, count: int
) -> None:
    header = _header(round(seconds * 10), 10.0)
    assert clip_count(header, ClipRule(length_s, stride_s)) == count


def test_each_clip_is_its_frames_at_the_streams_rate() -> None:
    header = _header(650, 10.0)  # 65 s
    rule = ClipRule(30, 10)
    assert [clip_window(header, rule, k) for k in range(4)] == [
        Window(0, 300),
        Window(100, 400),
        Window(200, 500),
        Window(300, 600),
    ]
    assert clip_window(_header(70, 10.0), rule, 0) == Window(0, 70)  # shorter: whole
    with pytest.raises(ValueError, match="clip 4 of a video cut into 4"):
        clip_window(header, rule, 4)
    with pytest.raises(ValueError, match="positive"):
        ClipRule(0, 1)


def test_a_clip_is_sampled_as_a_whole_video_of_its_frames() -> None:
    header = _header(600, 30.0)  # 20 s
    plan = plan_video(header, SPEC, Window(300, 450))  # a 5 s clip: 10 frames at 2 fps
    assert len(plan.indices) == 10
    assert plan.indices[0] == 300 and plan.indices[-1] < 450
    whole = plan_video(_header(150, 30.0), SPEC)
    assert [i - 300 for i in plan.indices] == list(whole.indices)
    assert plan_video(header, SPEC, Window(0, 600)) == plan_video(header, SPEC)


def _expected(data: bytes, window: Window) -> np.ndarray:
    """The clip's patches from every frame decoded here, from the first."""
    header = probe(data, SPEC)
    assert isinstance(header, VideoHeader)
    frames = decode_all(data)
    plan = plan_video(header, SPEC, window)
    h, w = plan.size
    picked = [
        np.asarray(Image.fromarray(frames[i]).resize((w, h), Image.Resampling.BICUBIC))
        for i in plan.indices
    ]
    picked += [picked[-1]] * (-len(picked) % SPEC.temporal_patch_size)
    return patchify_frames(np.stack(picked), SPEC)


@pytest.mark.parametrize(
    ("kind", "fps"), [("mp4", 24), ("webm", 30), ("gif", 10)], ids=["h264", "vp9", "gif"]
)
def test_a_clip_decoded_from_a_keyframe_before_it_equals_a_decode_from_the_start(
    kind: str, fps: int
) -> None:
    data = encode(kind, 8 * fps, 48, 64, fps, gop=fps)  # 8 s, a keyframe a second
    header = probe(data, SPEC)
    assert isinstance(header, VideoHeader)
    rule = ClipRule(2.0, 1.5)
    count = clip_count(header, rule)
    assert count == 5  # 0, 1.5, 3, 4.5, 6
    for k in range(count):
        window = clip_window(header, rule, k)
        got = decode(data, SPEC, header, window)
        assert isinstance(got, DecodedVideo)
        assert np.array_equal(got.patches, _expected(data, window)), k


def test_a_variable_frame_rate_clip_is_its_frames_in_display_order() -> None:
    pts = [0, 1, 3, 4, 8, 9, 10, 12, 13, 15, 16, 19, 20, 21, 24, 25]
    data = encode("mp4", len(pts), 48, 64, 10, pts=pts, gop=4)
    header = probe(data, SPEC)
    assert isinstance(header, VideoHeader)
    window = Window(6, 16)
    got = decode(data, SPEC, header, window)
    assert isinstance(got, DecodedVideo)
    assert np.array_equal(got.patches, _expected(data, window))


def _clips_source(tmp_path: Path, fmt: str) -> tuple[Source, list[bytes]]:
    """Three samples: a 5 s video, a 1 s video, and text alone; clips of 2 s every 1.5 s."""
    long, short = encode("mp4", 50, 48, 64, 10, gop=10), encode("webm", 10, 48, 64, 10)
    clip = Clip(length_s=2.0, stride_s=1.5)
    if fmt == "webdataset":
        members = [("a.txt", b"<video> a"), ("a.mp4", long), ("b.txt", b"<video> b")]
        write_tar(tmp_path / "s.tar", [*members, ("b.webm", short), ("c.txt", b"c")])
        source = Source(
            name="v",
            path=str(tmp_path / "*.tar"),
            weight=1.0,
            format="webdataset",
            video_exts=("mp4", "webm"),
            clip=clip,
        )
        return source, [long, short]
    videos = pa.array([long, short, None], pa.binary())
    table = pa.table({"text": ["<video> a", "<video> b", "c"], "video": videos})
    pq.write_table(table, tmp_path / "v.parquet")
    source = Source(
        name="v",
        path=str(tmp_path / "*.parquet"),
        weight=1.0,
        text_column="text",
        video_column="video",
        clip=clip,
    )
    return source, [long, short]


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_a_source_cut_into_clips_is_a_sample_per_clip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path / "cache"))
    source, (long, short) = _clips_source(tmp_path, fmt)
    src = open_source(source, "sources[0]")
    # 5 s: clips at 0, 1.5 and 3 s; 1 s: one clip, the whole video; text alone: one sample.
    assert src.num_rows == 5
    assert [rg.rows_stored for rg in src.row_groups] == [3]
    reader = ImageRowReader(source, src, RowGroupReader())
    rows = reader.read(src.row_groups[0])
    assert rows.field("clip").to_pylist() == [0, 1, 2, 0, 0]
    none = [] if fmt == "webdataset" else [None]  # a Parquet null cell: a video without bytes
    assert rows.field("videos").to_pylist() == [[long]] * 3 + [[short], none]
    assert rows.field("text").to_pylist() == [b"<video> a"] * 3 + [b"<video> b", b"c"]
    picked = reader.read(src.row_groups[0], np.array([4, 1, 2]))
    assert picked.field("clip").to_pylist() == [0, 1, 2]
    sizes = reader.sizes(src.row_groups[0])
    assert sizes is not None and sizes.tolist()[:3] == [sizes[0]] * 3

    # The counts are cached: a second index reads no video header.
    (cached,) = (tmp_path / "cache" / "clips").iterdir()
    assert json.loads(cached.read_text())["counts"] == [[3, 1, 1]]
    monkeypatch.setattr(clip_index, "probe", lambda *_: pytest.fail("probed again"))
    assert open_source(source, "sources[0]").num_rows == 5
