"""Video sources cut into clips, and interleaved documents, end to end: real encoded files
(H.264 in MP4 with a keyframe a second, VP9 in WebM), a WebDataset and a Parquet source with
``clip:``, Parquet documents holding images and videos at their markers, and text; real role
processes, DP 2.

Checked: every clip of every video is a sample, delivered once (by id); each clip's
``pixel_values_videos`` rows equal decoding the whole video again here, from its first frame,
and sampling the clip's frames; a video shorter than a clip is one sample, whole; a document's
videos arrive whole (a sample of several videos is not cut) with its images, placeholders in
the order of its markers; the stream is byte-identical with two loaders per video source.
"""

from __future__ import annotations

import hashlib
import io
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from msd.recipe.schema import Video, Vision
from msd.sources import video as videos
from msd.sources.clips import ClipRule, clip_count, clip_window
from msd.sources.fuse import video_spec_of
from msd.synth.text import SynthSource, synth
from tests.conftest import read_rank_logs
from tests.integration.test_multimodal import digests, launch
from tests.videos import decode_all, encode, write_tar

SEQ_LEN = 256
VIDEO = Video(max_frames=8, min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 6)
SPEC = video_spec_of(VIDEO, Vision())
RULE = ClipRule(2.0, 1.5)
TEXT = SynthSource("notes", median_tokens=60, sigma=0.7, max_tokens=200, num_samples=40)
WDS, PARQUET, DOCS = 0, 1, 2
# (seconds, fps, kind) of each video: several clips, exactly one, shorter than one.
SHAPES = [(5.0, 10, "mp4"), (2.0, 8, "webm"), (1.0, 12, "mp4"), (7.5, 8, "webm"), (3.6, 10, "mp4")]


def _video(i: int) -> bytes:
    seconds, fps, kind = SHAPES[i % len(SHAPES)]
    return encode(kind, round(seconds * fps), 48, 64 + 8 * (i % 3), fps, gop=fps)


@pytest.fixture(scope="module")
def clip_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, list[bytes]]]:
    root = tmp_path_factory.mktemp("clips")
    own: dict[int, list[bytes]] = {WDS: [_video(i) for i in range(6)]}
    own[PARQUET] = [_video(i + 2) for i in range(5)]
    (root / "wds").mkdir()
    members: list[tuple[str, bytes]] = []
    for i, data in enumerate(own[WDS]):
        ext = "mp4" if data[4:8] == b"ftyp" else "webm"
        members += [
            (f"v{i:02d}.txt", f"<video> clip of video {i}".encode()),
            (f"v{i:02d}.{ext}", data),
        ]
    write_tar(root / "wds" / "shard-0.tar", members)
    (root / "pq").mkdir()
    texts = [f"what happens in <video> {i}?" for i in range(len(own[PARQUET]))]
    table = pa.table({"text": texts, "video": pa.array(own[PARQUET], pa.binary())})
    pq.write_table(table, root / "pq" / "part-0.parquet", row_group_size=2)
    own[DOCS] = [_video(i) for i in (1, 4, 2, 0)]  # two a document
    _documents(root / "docs", own[DOCS])
    synth(root, (TEXT,), seed=5, files_per_source=1, rows_per_row_group=8)
    return root, own


def _png(shade: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (60, 44), (shade, 255 - shade, 90)).save(out, format="PNG")
    return out.getvalue()


def _documents(folder: Path, clips: list[bytes]) -> None:
    """Two interleaved documents: image, video, video, image at their markers."""
    folder.mkdir()
    text = "first <image> then <video> and <video> last <image> end"
    table = pa.table(
        {
            "text": [
                text,
                text.upper().replace("<IMAGE>", "<image>").replace("<VIDEO>", "<video>"),
            ],
            "images": pa.array(
                [[_png(10), _png(60)], [_png(110), _png(160)]], pa.list_(pa.binary())
            ),
            "videos": pa.array([clips[:2], clips[2:]], pa.list_(pa.binary())),
        }
    )
    pq.write_table(table, folder / "part-0.parquet")


def recipe(root: Path) -> dict[str, Any]:
    clip = {"length_s": RULE.length_s, "stride_s": RULE.stride_s}
    sources = [
        {
            "name": "clips-wds",
            "path": str(root / "wds" / "*.tar"),
            "format": "webdataset",
            "text_column": "txt",
            "video_exts": ["mp4", "webm"],
            "clip": clip,
            "weight": 0.4,
        },
        {
            "name": "clips-qa",
            "path": str(root / "pq" / "*.parquet"),
            "text_column": "text",
            "video_column": "video",
            "clip": clip,
            "weight": 0.3,
        },
        {
            "name": "docs",
            "path": str(root / "docs" / "*.parquet"),
            "text_column": "text",
            "image_column": "images",
            "video_column": "videos",
            "clip": clip,
            "weight": 0.1,
        },
        {
            "name": "notes",
            "path": str(root / "notes" / "*.parquet"),
            "text_column": "text",
            "weight": 0.2,
        },
    ]
    return {
        "name": "clips",
        "seed": 4,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": 2 * SEQ_LEN,
        "distribute": {"dp": 2},
        "vision": {"max_pixels": 14 * 14 * 4 * 64},
        "video": {
            "max_frames": VIDEO.max_frames,
            "min_pixels": VIDEO.min_pixels,
            "max_pixels": VIDEO.max_pixels,
        },
        "sources": [{**s, "repeat": False} for s in sources],
        "trainer": {"command": "demo", "demo": {"step_ms": 0, "save_batches": True}},
    }


@pytest.fixture(scope="module")
def epoch(
    tmp_path_factory: pytest.TempPathFactory, clip_data: tuple[Path, dict[int, list[bytes]]]
) -> tuple[Path, dict[str, Any]]:
    root, _ = clip_data
    where = tmp_path_factory.mktemp("epoch")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MSD_CACHE_DIR", str(where / "cache"))
        return launch(where, recipe(root))


def _digest(patches: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(patches).tobytes()).hexdigest()


def expected_clips(own: list[bytes], rule: ClipRule = RULE) -> list[str]:
    """Each sample's video patches, in sample id order: every frame of each video decoded here,
    each clip's frames sampled, resized and patched."""
    found = []
    for data in own:
        header = videos.probe(data, SPEC)
        assert isinstance(header, videos.VideoHeader)
        frames = decode_all(data)
        for k in range(clip_count(header, rule)):
            plan = videos.plan_video(header, SPEC, clip_window(header, rule, k))
            h, w = plan.size
            picked = [
                np.asarray(Image.fromarray(frames[i]).resize((w, h), Image.Resampling.BICUBIC))
                for i in plan.indices
            ]
            picked += [picked[-1]] * (-len(picked) % SPEC.temporal_patch_size)
            found.append(_digest(videos.patchify_frames(np.stack(picked), SPEC)))
    return found


def delivered(job: Path) -> dict[tuple[int, int], Counter[str]]:
    """(source, sample id) → digests of the video patches delivered for it."""
    found: dict[tuple[int, int], Counter[str]] = {}
    for rank, records in read_rank_logs(job).items():
        for r in records:
            batch = np.load(job / "trainer" / f"rank-{rank}" / f"step-{r['step']}.npz")
            bounds = batch["video_cu_seqlens"]
            owners = zip(
                batch["video_source_ids"].tolist(), batch["video_sample_ids"].tolist(), strict=True
            )
            for k, owner in enumerate(owners):
                rows = batch["pixel_values_videos"][bounds[k] : bounds[k + 1]]
                found.setdefault(owner, Counter())[_digest(rows)] += 1
    return found


def test_every_clip_is_a_sample_delivered_once_as_decoded_again_here(
    epoch: tuple[Path, dict[str, Any]], clip_data: tuple[Path, dict[int, list[bytes]]]
) -> None:
    job, summary = epoch
    _, own = clip_data
    expected = {
        (source, i): Counter([digest])
        for source in (WDS, PARQUET)
        for i, digest in enumerate(expected_clips(own[source]))
    }
    # 5 s: 3 clips; 2 s: 1, whole; 1 s: 1; 7.5 s: 4; 3.6 s: 2.
    assert sum(1 for s, _ in expected if s == WDS) == 3 + 1 + 1 + 4 + 2 + 3
    for doc in range(2):  # whole videos: the 5 s one is not cut in a document
        whole = [
            expected_clips([data], ClipRule(60.0, 60.0))[0] for data in own[DOCS][2 * doc :][:2]
        ]
        expected[(DOCS, doc)] = Counter(whole)
    assert delivered(job) == expected
    starts = Counter(
        (s, i)
        for records in read_rank_logs(job).values()
        for r in records
        for s, i, o in zip(r["source_ids"], r["sample_ids"], r["sample_offsets"], strict=True)
        if o == 0 and s in (WDS, PARQUET, DOCS)
    )
    assert starts == Counter({key: 1 for key in expected})
    assert summary["skipped_images_by_source"] == {}
    assert document_images(job) == Counter({0: 2, 1: 2})


def document_images(job: Path) -> Counter[int]:
    """Images delivered per document."""
    found: Counter[int] = Counter()
    for rank, records in read_rank_logs(job).items():
        for r in records:
            batch = np.load(job / "trainer" / f"rank-{rank}" / f"step-{r['step']}.npz")
            owners = zip(
                batch["image_source_ids"].tolist(), batch["image_sample_ids"].tolist(), strict=True
            )
            found.update(sample for source, sample in owners if source == DOCS)
    return found


def test_the_clips_stream_is_the_same_with_two_loaders_a_source(
    tmp_path: Path,
    epoch: tuple[Path, dict[str, Any]],
    clip_data: tuple[Path, dict[int, list[bytes]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MSD_CACHE_DIR", str(tmp_path / "cache"))  # counted anew, the same
    doc = recipe(clip_data[0])
    for source in doc["sources"][:2]:
        source["loaders"] = 2
    doc["trainer"]["demo"]["save_batches"] = False
    job, _ = launch(tmp_path, doc)
    reference = digests(epoch[0])
    assert digests(job) == reference and len(reference) >= 2 * 4
