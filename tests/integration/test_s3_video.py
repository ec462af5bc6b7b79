"""Video sources in an S3-compatible store (the moto server of ``tests/s3``): WebDataset shards of
clips and a Parquet video column read from ``s3://`` give the stream the same files give from
local disk, byte for byte (the demo trainer's digests of every batch, videos' patches
included), and leave out and count a damaged clip the same; `msd validate` reads the header of
each file's first video from the store and names the damaged one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from msd.synth.video import PARQUET_SOURCE, WDS_SOURCE, write_video_sources
from tests.conftest import run_msd
from tests.integration.test_multimodal import digests, launch
from tests.s3.server import S3Bucket
from tests.videos import encode, write_tar

SEQ_LEN = 256


@pytest.fixture(scope="module")
def video_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's two video sources, small, and a third shard of a clip cut mid-stream and an
    H.264 clip."""
    root = tmp_path_factory.mktemp("s3-video")
    write_video_sources(root, seed=5, videos=6, files_per_source=2)
    clip = encode("mp4", 24, 48, 64, 12)
    write_tar(
        root / WDS_SOURCE / "shard-00002.tar",
        [
            ("cut.mp4", clip[: len(clip) // 2]),
            ("cut.txt", b"<video> a clip cut short"),
            ("h264.mp4", clip),
            ("h264.txt", b"<video> an H.264 clip"),
        ],
    )
    return root


def recipe(root: str) -> dict[str, Any]:
    """One finite epoch of both video sources under ``root`` (a folder or a URL), DP 2."""
    return {
        "name": "s3-video",
        "seed": 5,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": 2 * SEQ_LEN,
        "distribute": {"dp": 2},
        "video": {"max_frames": 8, "min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16},
        "sources": [
            {
                "name": "clips",
                "path": f"{root}/{WDS_SOURCE}/*.tar",
                "format": "webdataset",
                "text_column": "txt",
                "video_exts": ["webm", "mp4"],
                "weight": 0.5,
                "repeat": False,
            },
            {
                "name": "questions",
                "path": f"{root}/{PARQUET_SOURCE}/*.parquet",
                "text_column": "text",
                "video_column": "video",
                "weight": 0.5,
                "repeat": False,
            },
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": 0}},
    }


def test_video_sources_from_s3_give_the_local_stream(
    s3: S3Bucket, video_data: Path, tmp_path: Path
) -> None:
    local, here = launch(tmp_path / "local", recipe(str(video_data)))
    remote, there = launch(tmp_path / "s3", recipe(s3.upload(video_data, "videos")))
    assert len(digests(local)) == 2 * here["steps"] > 0
    assert digests(remote) == digests(local)
    assert there["images"] == here["images"] == 6 + 6 + 1  # every clip but the cut one
    # Counted with the samples they belonged to: the same on every run.
    assert there["skipped_images_by_source"] == here["skipped_images_by_source"] == {"clips": 1}
    # What the loaders read, by reason: final once every source was read to its end, which a
    # finite job's loaders report at once, however short the job.
    assert there["left_out_by_source"] == here["left_out_by_source"]
    assert list(here["left_out_by_source"]) == ["clips"], here["left_out_by_source"]
    reads = {n: v["read"] for n, v in here["videos_by_source"].items()}
    assert {n: v["read"] for n, v in there["videos_by_source"].items()} == reads
    assert reads == {"clips": 8, "questions": 6}  # the cut clip was read too
    saved = json.loads((remote / "recipe.json").read_text())
    files = [f[0] for s in saved["sources"] for f in s["files"]]
    assert len(files) == 5 and all(f.startswith(s3.url("videos") + "/") for f in files)
    validated = run_msd("validate", "r.yaml", cwd=tmp_path / "s3")
    assert validated.returncode == 0, validated.stderr
    (warning,) = " ".join(validated.stderr.split()).split("warning: ")[1:]
    shard = s3.url(f"videos/{WDS_SOURCE}/shard-00002.tar")
    assert warning.startswith(f"source 'clips' (sources[0]): '{shard}' sample 'cut'"), warning
    assert "not a usable video (not a video)" in warning
