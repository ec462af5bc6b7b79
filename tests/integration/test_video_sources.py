"""Video-text sources end to end: real encoded files (PyAV: VP9 in WebM, H.264 in MP4, a GIF,
odd sizes, odd and variable frame rates, rotation metadata), a WebDataset video source and a
Parquet video column beside an image source and text, real role processes, DP 4.

Checked: every sample and every usable video is delivered exactly once (by id); each video's
``pixel_values_videos`` rows equal decoding all its frames again here, sampling them by
Qwen2-VL's rule and patching them; its temporal patches follow the sampling rule;
placeholders are patches / merge²; damaged files (cut mid-stream, garbage, no frames) are left
out and counted; the stream is byte-identical on a second run with another loader
count, after kill -9 of a video loader (restarted, and taken over by its shadow), after ``msd
rescale`` of a video source, and on a restore onto DP 2 (the same global batches).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import signal
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import av
import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from msd.jobdir import JobDir
from msd.recipe.schema import Video, Vision
from msd.sources import video as videos
from msd.sources.fuse import video_spec_of
from msd.synth.text import SynthSource, synth
from msd.synth.video import write_video_sources
from msd.synth.vlm import write_vlm_sources
from tests.conftest import (
    assert_launch_ok,
    processes_of_launcher,
    read_rank_logs,
    run_msd,
    start_launch,
)
from tests.integration.test_multimodal import digests, global_batches, launch
from tests.integration.test_recovery import peak_rss_until_exit, role_pids, wait_for_step
from tests.videos import decode_all, encode, no_frames, write_tar

IMAGE_TOKEN, VIDEO_TOKEN = 151655, 151656
SEQ_LEN = 256
VIDEO = Video(max_frames=16, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
SPEC = video_spec_of(VIDEO, Vision())
TEXT = SynthSource("notes", median_tokens=60, sigma=0.7, max_tokens=240, num_samples=120)
WDS, PARQUET, IMAGES, NOTES = range(4)
VIDEOS = 20  # per synthetic source


def _odd_shard(path: Path) -> None:
    """Clips of every kind the tests encode, and three damaged ones, each with a caption."""
    good = encode("mp4", 40, 64, 96, 24)
    clips = [
        ("h264", "mp4", good),
        ("gif", "gif", encode("gif", 9, 40, 52, 10)),
        ("odd", "webm", encode("webm", 13, 45, 61, 7)),
        ("vfr", "mp4", encode("mp4", 6, 48, 64, 10, pts=[0, 1, 3, 4, 8, 9])),
        ("rotated", "mp4", encode("mp4", 8, 48, 96, 24, rotation=90)),
        ("cut", "mp4", good[: len(good) // 2]),
        ("garbage", "mp4", b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8),
        ("empty", "mp4", no_frames()),
    ]
    members = []
    for key, ext, data in clips:
        members += [
            (f"odd-{key}.{ext}", data),
            (f"odd-{key}.txt", f"<video> a {key} clip".encode()),
        ]
    write_tar(path, members)


@pytest.fixture(scope="module")
def video_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("video")
    write_video_sources(root, seed=3, videos=VIDEOS, files_per_source=2)
    _odd_shard(root / "video-captions-wds" / "shard-00002.tar")
    write_vlm_sources(root / "img", seed=3, samples=12, files_per_source=1, rows_per_row_group=4)
    synth(root, (TEXT,), seed=3, files_per_source=1, rows_per_row_group=16)
    return root


def recipe(data: Path) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "video",
        "seed": 9,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": 4 * SEQ_LEN,
        "distribute": {"dp": 4},
        "vision": {"max_pixels": 14 * 14 * 4 * 64},
        "video": {
            "max_frames": VIDEO.max_frames,
            "min_pixels": VIDEO.min_pixels,
            "max_pixels": VIDEO.max_pixels,
        },
        "sources": [
            {
                "name": "video-captions",
                "path": str(data / "video-captions-wds" / "*.tar"),
                "format": "webdataset",
                "text_column": "txt",
                "video_exts": ["webm", "mp4", "gif"],
                "weight": 0.3,
            },
            {
                "name": "video-qa",
                "path": str(data / "video-qa-parquet" / "*.parquet"),
                "text_column": "text",
                "video_column": "video",
                "weight": 0.3,
            },
            {
                "name": "captions",
                "path": str(data / "img" / "captions-wds" / "*.tar"),
                "format": "webdataset",
                "text_column": "txt",
                "weight": 0.2,
            },
            {
                "name": "notes",
                "path": str(data / "notes" / "*.parquet"),
                "text_column": "text",
                "weight": 0.2,
            },
        ],
        "checkpoint": {"every_steps": 3, "keep": 20},
        "trainer": {"command": "demo", "demo": {"step_ms": 50, "save_batches": True}},
    }
    for source in doc["sources"]:
        source["repeat"] = False
    return doc


@pytest.fixture(scope="module")
def epoch(tmp_path_factory: pytest.TempPathFactory, video_data: Path) -> tuple[Path, dict]:
    return launch(tmp_path_factory.mktemp("epoch"), recipe(video_data))


def source_videos(data: Path) -> dict[tuple[int, int], list[bytes]]:
    """(source, sample id) → its videos' bytes, read straight from the files."""
    found: dict[tuple[int, int], list[bytes]] = {}
    row = 0
    for path in sorted((data / "video-captions-wds").glob("*.tar")):
        with tarfile.open(path) as tar:
            members: dict[str, dict[str, bytes]] = {}
            for m in tar:
                key, _, ext = m.name.partition(".")
                handle = tar.extractfile(m)
                members.setdefault(key, {})[ext] = handle.read() if handle else b""
        for parts in members.values():
            found[(WDS, row)] = [v for e, v in parts.items() if e in ("webm", "mp4", "gif")]
            row += 1
    cells = [
        cell
        for path in sorted((data / "video-qa-parquet").glob("*.parquet"))
        for cell in pq.read_table(path).column("video").to_pylist()
    ]
    for i, cell in enumerate(cells):
        found[(PARQUET, i)] = [cell["bytes"]]
    return found


def resampled(data: bytes) -> np.ndarray | None:
    """A video's patches made here: every frame decoded, the sampled ones picked by Qwen2-VL's
    rule, resized (bicubic) and patched; None where the file is not a usable video."""
    header = videos.probe(data, SPEC)
    if isinstance(header, videos.DecodeFailure):
        return None
    try:
        frames = decode_all(data)
    except Exception:  # a damaged stream
        return None
    count = videos.sample_count(header.frames, header.fps, SPEC)
    indices = videos.sample_indices(header.frames, count)
    if not frames or indices[-1] >= len(frames):
        return None
    plan = videos.plan_video(header, SPEC)
    h, w = plan.size
    picked = [
        np.asarray(Image.fromarray(frames[i]).resize((w, h), Image.Resampling.BICUBIC))
        for i in indices
    ]
    picked += [picked[-1]] * (-len(picked) % SPEC.temporal_patch_size)
    assert plan.grid[0] == math.ceil(count / SPEC.temporal_patch_size)
    return videos.patchify_frames(np.stack(picked), SPEC)


def _digest(patches: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(patches).tobytes()).hexdigest()


def delivered_videos(job: Path) -> tuple[dict[tuple[int, int], Counter[str]], Counter]:
    """(source, sample) → digests of its delivered videos' patches; and every piece by id."""
    logs = read_rank_logs(job)
    assert sorted(logs) == [0, 1, 2, 3]
    found: dict[tuple[int, int], Counter[str]] = {}
    pieces: Counter = Counter()
    for rank, records in logs.items():
        for r in records:
            pieces.update(zip(r["source_ids"], r["sample_ids"], r["sample_offsets"], strict=True))
            batch = np.load(job / "trainer" / f"rank-{rank}" / f"step-{r['step']}.npz")
            grids, bounds = batch["video_grid_thw"], batch["video_cu_seqlens"]
            assert np.array_equal(np.diff(bounds), grids.prod(axis=1))
            assert batch["pixel_values_videos"].shape[1] == SPEC.patch_values
            assert len(batch["second_per_grid_ts"]) == len(grids)
            assert np.allclose(batch["second_per_grid_ts"], 2 / VIDEO.fps)
            placeholders = int(np.count_nonzero(batch["input_ids"] == VIDEO_TOKEN))
            assert placeholders == int(grids.prod(axis=1).sum()) // 4
            assert not np.any(batch["labels"] == VIDEO_TOKEN)
            owners = zip(
                batch["video_source_ids"].tolist(), batch["video_sample_ids"].tolist(), strict=True
            )
            for k, owner in enumerate(owners):
                rows = batch["pixel_values_videos"][bounds[k] : bounds[k + 1]]
                found.setdefault(owner, Counter())[_digest(rows)] += 1
    return found, pieces


def test_one_epoch_delivers_every_sample_and_video_once_as_decoded_again_here(
    epoch: tuple[Path, dict], video_data: Path
) -> None:
    job, summary = epoch
    got, pieces = delivered_videos(job)
    clips = source_videos(video_data)
    rows = {WDS: sum(1 for s, _ in clips if s == WDS), PARQUET: VIDEOS, IMAGES: 12, NOTES: 120}
    starts = Counter((s, i) for (s, i, o) in pieces if o == 0)
    assert starts == Counter({(s, i): 1 for s, n in rows.items() for i in range(n)})
    expected = {}
    for owner, own in clips.items():
        usable = [p for p in map(resampled, own) if p is not None]
        if usable:
            expected[owner] = Counter(map(_digest, usable))
    assert len(expected) == rows[WDS] + rows[PARQUET] - 3  # cut, garbage and empty left out
    assert got == expected
    # Counted with the samples they belonged to, so the same on every run.
    assert summary["skipped_images_by_source"] == {"video-captions": 3}


def test_the_stream_is_the_same_with_more_video_loaders(
    tmp_path: Path, epoch: tuple[Path, dict], video_data: Path
) -> None:
    doc = recipe(video_data)
    doc["sources"][0]["loaders"] = 2
    doc["sources"][1]["loaders"] = 2
    doc["trainer"]["demo"]["save_batches"] = False
    job, summary = launch(tmp_path, doc)
    digests = {
        (rank, r["step"]): r["digest"] for rank, rs in read_rank_logs(job).items() for r in rs
    }
    reference = {
        (rank, r["step"]): r["digest"] for rank, rs in read_rank_logs(epoch[0]).items() for r in rs
    }
    assert digests == reference and len(reference) >= 3 * 4
    assert summary["skipped_images_by_source"] == epoch[1]["skipped_images_by_source"]


COUNTS = ("steps", "tokens", "images", "skipped_images", "empty_samples")


def _slow(doc: dict[str, Any], step_ms: int = 300) -> dict[str, Any]:
    """The recipe with steps slow enough for something to happen mid-run, no batches saved."""
    doc["trainer"]["demo"] = {"step_ms": step_ms}
    return doc


@pytest.mark.parametrize("shadows", [0, 1], ids=["restarted", "shadow"])
def test_a_killed_video_loader_leaves_the_stream_unchanged(
    tmp_path: Path, video_data: Path, epoch: tuple[Path, dict], shadows: int
) -> None:
    doc = _slow(recipe(video_data))
    doc["loader"] = {"heartbeat_s": 2}
    doc["sources"][PARQUET]["shadows"] = shadows
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml", "--json")
    try:
        job = wait_for_step(tmp_path, 3, proc)
        victims = [
            p
            for p in role_pids(proc.pid, "loader")
            if "video-qa" in " ".join(psutil.Process(p).cmdline())
            and "~shadow" not in " ".join(psutil.Process(p).cmdline())
        ]
        assert len(victims) == 1
        os.kill(victims[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_launch_ok(proc, out, err)
    recoveries = json.loads((job / "job.json").read_text())["recoveries"]
    assert [r["how"] for r in recoveries] == ["shadow" if shadows else "restarted"], recoveries
    assert digests(job) == digests(epoch[0])
    summary = json.loads(out[out.index("{") :])
    assert {k: summary[k] for k in COUNTS} == {k: epoch[1][k] for k in COUNTS}
    assert summary["skipped_images_by_source"] == epoch[1]["skipped_images_by_source"]
    assert processes_of_launcher(proc.pid) == []


def test_rescaling_a_video_source_mid_run_leaves_the_stream_unchanged(
    tmp_path: Path, video_data: Path, epoch: tuple[Path, dict]
) -> None:
    # Slower steps, and loaders that read little ahead: the new loaders start (a Python process
    # each) while the source still has visits to open, however busy the machine (with the
    # default read-ahead the old loader can read the whole source before they do).
    doc = _slow(recipe(video_data), step_ms=600)
    doc["loader"] = {"buffer_tokens": SEQ_LEN, "buffer_bytes": 1 << 20}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml")
    try:
        job = wait_for_step(tmp_path, 1, proc)
        scaled = run_msd(
            "rescale", str(job), "--source", "video-captions", "--loaders", "2", cwd=tmp_path
        )
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    assert_launch_ok(proc, out, err)
    generations = json.loads(JobDir(job).rescales.read_text())["generations"]
    assert [(g["source"], g["loaders"]) for g in generations] == [("video-captions", 2)]
    assert generations[0]["start"] is not None, "the rescale finished after the run"
    assert digests(job) == digests(epoch[0])


def test_a_restore_onto_dp_2_gives_the_same_global_batches(
    tmp_path: Path, video_data: Path, epoch: tuple[Path, dict]
) -> None:
    doc = recipe(video_data)
    doc["distribute"] = {"dp": 2}
    doc["trainer"]["demo"]["save_batches"] = False
    (tmp_path / "dp2.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run_msd(
        "restore", str(epoch[0]), "--step", "3", "--recipe", "dp2.yaml", "--json", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    restored = Path(json.loads(result.stdout)["job"])
    assert sorted(read_rank_logs(restored)) == [0, 1]
    before, after = global_batches(epoch[0]), global_batches(restored)
    assert sorted(after) == [s for s in sorted(before) if s >= 3] and len(after) >= 4
    for step in after:
        assert after[step] == before[step], step


# -- memory: long 1080p videos -----------------------------------------------------------------
LONG_S, LONG_FPS = 30, 10  # 300 frames of 1920 × 1080: 1.9 GB decoded whole, 6 MB each
LOADER_RSS_BOUND = 512 << 20


def _long_1080p_clip() -> bytes:
    """30 s of 1080p H.264, a gradient moving sideways (quick to encode, every frame new)."""
    height, width = 1080, 1920
    base = np.zeros((height, width, 3), np.uint8)
    base[..., 0] = np.arange(width, dtype=np.uint32)[None, :] * 255 // width
    base[..., 1] = np.arange(height, dtype=np.uint32)[:, None] * 255 // height
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=LONG_FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.options = {"preset": "ultrafast", "crf": "30"}
        stream.codec_context.thread_count = 1
        for i in range(LONG_S * LONG_FPS):
            frame = av.VideoFrame.from_ndarray(np.roll(base, 8 * i, axis=1), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def test_a_loader_of_long_1080p_videos_stays_under_its_memory_bound(tmp_path: Path) -> None:
    """A loader decodes each frame into the video's patches as it arrives: never the whole
    decoded video (1.9 GB each here), so its RSS stays under LOADER_RSS_BOUND."""
    clip = _long_1080p_clip()
    (tmp_path / "long").mkdir()
    members = []
    for k in range(3):
        members += [(f"long-{k}.mp4", clip), (f"long-{k}.txt", b"<video> a long clip")]
    write_tar(tmp_path / "long" / "shard-00000.tar", members)
    doc = {
        "name": "long-videos",
        "seed": 1,
        "seq_len": 8192,
        "global_batch_tokens": 8192,
        "distribute": {"dp": 1},
        "video": {"max_pixels": 28 * 28 * 256},  # 256 tokens a frame pair: 30 × 256 a video
        "sources": [
            {
                "name": "long",
                "path": str(tmp_path / "long" / "*.tar"),
                "format": "webdataset",
                "text_column": "txt",
                "video_exts": ["mp4"],
                "weight": 1.0,
                "repeat": False,
            }
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 10}},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml", "--json")
    out, err, peak = peak_rss_until_exit(proc, "loader")
    assert_launch_ok(proc, out, err)
    summary = json.loads(out[out.index("{") :])
    assert summary["videos_by_source"]["long"]["read"] == 3
    assert summary["videos_by_source"]["long"]["seconds"] == pytest.approx(3 * LONG_S, rel=0.05)
    assert summary["steps"] == 3  # one video a step: 7,680 placeholders and its caption
    assert 0 < peak < LOADER_RSS_BOUND, f"a loader peaked at {peak / 2**20:.0f} MiB"
