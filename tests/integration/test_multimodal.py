"""Image-text sources end to end: real images (Pillow), real WebDataset tar shards and Parquet
image columns, real role processes. One finite epoch of two image-caption sources (WebDataset,
Parquet), interleaved documents and a text source, at DP 4 with a patch budget per
micro-batch, some of it damaged on purpose.

Checked: every sample and every image is delivered exactly once (by id); each batch's
``pixel_values`` equal the patches of the images it claims, decoded again here from the files;
placeholder tokens match patch counts; the stream is byte-identical across runs, loader
counts, kill -9 of an image loader (with and without a shadow), ``msd rescale`` of an image
source and a restore onto DP 2; damaged data is counted the same on every run.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from msd.jobdir import JobDir
from msd.sources.vision import ImageGeometry, decode
from msd.synth.text import SynthSource, synth
from msd.synth.vlm import write_vlm_sources
from tests.conftest import (
    assert_launch_ok,
    processes_of_launcher,
    read_rank_logs,
    run_msd,
    start_launch,
)
from tests.integration.test_recovery import role_pids, wait_for_step
from tests.s3.server import S3Bucket

IMAGE_TOKEN = 151655
MAX_PIXELS = 14 * 14 * 4 * 256  # at most 256 tokens an image: cheap to decode, several per row
MAX_PATCHES = 2048  # a rank's micro-batch (one row here) holds at most two of the largest
SEQ_LEN = 1024
GEOMETRY = ImageGeometry(max_pixels=MAX_PIXELS)
TEXT = SynthSource("notes", median_tokens=60, sigma=0.7, max_tokens=1500, num_samples=120)
SOURCES = ("captions-wds", "captions-parquet", "interleaved", "notes")
WDS, PARQUET, INTERLEAVED, NOTES = range(4)


@pytest.fixture(scope="module")
def vlm_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's image sources, 32 samples each, and a text source; then damaged: one
    undecodable image and a sample without its text in the tar shards, plus a shard cut short;
    a Parquet row whose image has no bytes."""
    root = tmp_path_factory.mktemp("vlm")
    write_vlm_sources(root, seed=3, samples=32, files_per_source=2, rows_per_row_group=4)
    synth(root, (TEXT,), seed=3, files_per_source=1, rows_per_row_group=16)
    _damage_tar(root / "captions-wds" / "shard-00000.tar")
    _write_cut_shard(root / "captions-wds" / "shard-00002.tar")
    _null_image(root / "captions-parquet" / "part-00000.parquet", row=2)
    return root


def _damage_tar(path: Path) -> None:
    """Overwrite the first image's bytes with garbage (the tar stays valid)."""
    with tarfile.open(path) as tar:
        first = next(m for m in tar.getmembers() if m.name.endswith((".jpg", ".png", ".webp")))
    with open(path, "r+b") as file:
        file.seek(first.offset_data)
        file.write(b"\x00not an image" * (first.size // 13))


def _png(side: int, colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side), colour).save(out, format="PNG")
    return out.getvalue()


def _write_cut_shard(path: Path) -> None:
    """Three samples: one without text, two whole; then the file is cut inside the third's
    image, so the index keeps the first two and reports the cut."""
    members = [
        ("extra-0.png", _png(64, (200, 10, 10))),  # no text member
        ("extra-1.png", _png(96, (10, 200, 10))),
        ("extra-1.txt", b"a green square"),
        ("extra-2.txt", b"a blue square"),
        ("extra-2.png", _png(128, (10, 10, 200))),
    ]
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        last = tar.getmember("extra-2.png")
    os.truncate(path, last.offset_data + last.size // 2)


def _null_image(path: Path, row: int) -> None:
    table = pq.read_table(path)
    images = table.column("image").to_pylist()
    images[row] = {"bytes": None, "path": images[row]["path"]}
    column = pa.array(images, table.schema.field("image").type)
    table = table.set_column(table.schema.get_field_index("image"), "image", column)
    pq.write_table(table, path, row_group_size=4)


def recipe(data: Path, **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "vlm",
        "seed": 4,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": 4 * SEQ_LEN,
        "distribute": {"dp": 4},
        "vision": {"max_pixels": MAX_PIXELS, "image_token_id": IMAGE_TOKEN},
        "sources": [
            {
                "name": "captions-wds",
                "path": str(data / "captions-wds" / "*.tar"),
                "format": "webdataset",
                "text_column": "txt",
                "weight": 0.3,
            },
            {
                "name": "captions-parquet",
                "path": str(data / "captions-parquet" / "*.parquet"),
                "text_column": "text",
                "image_column": "image",
                "weight": 0.3,
            },
            {
                "name": "interleaved",
                "path": str(data / "interleaved-parquet" / "*.parquet"),
                "text_column": "text",
                "image_column": "images",
                "weight": 0.2,
            },
            {
                "name": "notes",
                "path": str(data / "notes" / "*.parquet"),
                "text_column": "text",
                "weight": 0.2,
            },
        ],
        "balance": {"max_patches": MAX_PATCHES},
        "checkpoint": {"every_steps": 4, "keep": 20},
        "trainer": {"command": "demo", "demo": {"step_ms": 300}},
    }
    for source in doc["sources"]:
        source["repeat"] = False
    doc.update(overrides)
    return doc


def launch(where: Path, doc: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Run a job to its end; its folder and summary."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run_msd("launch", "r.yaml", "--json", cwd=where, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    return Path(summary["job"]), summary


def digests(job: Path) -> dict[tuple[int, int], str]:
    return {(rank, r["step"]): r["digest"] for rank, rs in read_rank_logs(job).items() for r in rs}


def global_batches(job: Path) -> dict[int, Counter[tuple[int, int, int]]]:
    steps: dict[int, Counter[tuple[int, int, int]]] = {}
    for rs in read_rank_logs(job).values():
        for r in rs:
            pieces = zip(r["source_ids"], r["sample_ids"], r["sample_offsets"], strict=True)
            steps.setdefault(r["step"], Counter()).update(pieces)
    return steps


COUNTS = ("steps", "tokens", "images", "skipped_images", "empty_samples", "split_samples")


@pytest.fixture(scope="module")
def epoch(tmp_path_factory: pytest.TempPathFactory, vlm_data: Path) -> tuple[Path, dict]:
    """The reference run, every batch saved."""
    doc = recipe(vlm_data)
    doc["trainer"]["demo"]["save_batches"] = True
    return launch(tmp_path_factory.mktemp("epoch"), doc)


def source_images(data: Path) -> dict[tuple[int, int], list[bytes | None]]:
    """(source, sample id) → its images' bytes, read straight from the files."""
    found: dict[tuple[int, int], list[bytes | None]] = {}
    shards = sorted((data / "captions-wds").glob("*.tar"))
    row = 0
    for path in shards:
        with tarfile.open(path, ignore_zeros=False) as tar:
            members: dict[str, dict[str, bytes]] = {}
            try:
                for m in tar:
                    key, _, ext = m.name.partition(".")
                    handle = tar.extractfile(m)
                    members.setdefault(key, {})[ext] = handle.read() if handle else b""
            except (tarfile.ReadError, OSError):
                pass
        for key, parts in members.items():
            if path.name == "shard-00002.tar" and key == "extra-2":
                continue  # cut short: not in the source
            found[(WDS, row)] = [v for e, v in parts.items() if e in ("jpg", "png", "webp")]
            row += 1
    for source, folder, column in (
        (PARQUET, "captions-parquet", "image"),
        (INTERLEAVED, "interleaved-parquet", "images"),
    ):
        cells = [
            cell
            for path in sorted((data / folder).glob("*.parquet"))
            for cell in pq.read_table(path).column(column).to_pylist()
        ]
        for i, cell in enumerate(cells):
            structs = cell if isinstance(cell, list) else [cell]
            found[(source, i)] = [s["bytes"] for s in structs]
    return found


def test_one_epoch_delivers_every_sample_and_image_once_with_the_loaders_pixels(
    epoch: tuple[Path, dict], vlm_data: Path
) -> None:
    job, summary = epoch
    logs = read_rank_logs(job)
    assert sorted(logs) == [0, 1, 2, 3]
    pieces = Counter(
        (s, i, o)
        for rs in logs.values()
        for r in rs
        for s, i, o in zip(r["source_ids"], r["sample_ids"], r["sample_offsets"], strict=True)
    )
    starts = Counter((s, i) for (s, i, o) in pieces if o == 0)
    images = source_images(vlm_data)
    rows = {WDS: sum(1 for s, _ in images if s == WDS), PARQUET: 32, INTERLEAVED: 32}
    rows[NOTES] = TEXT.num_samples
    assert starts == Counter({(s, i): 1 for s, n in rows.items() for i in range(n)})
    assert all(n == 1 for n in pieces.values())
    split = {(s, i) for (s, i, o) in pieces if o > 0}
    assert any(s == INTERLEAVED for s, _ in split), "long documents are split at text positions"

    # (source, sample) → digests of the patches of its images in the batches; a split sample's
    # pieces may sit on several ranks, so each sample's images are compared as a multiset.
    delivered: dict[tuple[int, int], Counter[str]] = {}
    checked = 0
    for rank, records in logs.items():
        for r in records:
            batch = np.load(job / "trainer" / f"rank-{rank}" / f"step-{r['step']}.npz")
            bounds = batch["vision_cu_seqlens"]
            grids = batch["image_grid_thw"]
            assert len(bounds) == len(grids) + 1 == len(batch["image_sample_ids"]) + 1
            assert np.array_equal(np.diff(bounds), grids.prod(axis=1))
            placeholders = int(np.count_nonzero(batch["input_ids"] == IMAGE_TOKEN))
            assert placeholders == int(grids.prod(axis=1).sum()) // 4  # merge 2: 4 patches each
            assert not np.any(batch["labels"] == IMAGE_TOKEN)
            assert batch["input_ids"].min() >= 0  # no filler reaches a trainer
            assert len(batch["pixel_values"]) <= MAX_PATCHES  # a rank's one micro-batch
            owners = zip(
                batch["image_source_ids"].tolist(), batch["image_sample_ids"].tolist(), strict=True
            )
            for k, owner in enumerate(owners):
                patches = batch["pixel_values"][bounds[k] : bounds[k + 1]]
                delivered.setdefault(owner, Counter())[_digest(patches)] += 1
                checked += 1
    for owner, got in delivered.items():
        usable = [d for d in map(_decoded, images[owner]) if d is not None]
        assert got == Counter(map(_digest, usable)), owner
    assert checked == summary["images"] > 60
    # Each image at most once, and what is not delivered is counted as left out.
    total = sum(len(v) for v in images.values())
    assert summary["images"] + summary["skipped_images"] == total
    assert summary["skipped_images"] >= 3  # the undecodable one, the one without bytes, no-text
    assert summary["empty_samples"] == 1  # the tar sample without its text


def _digest(patches: np.ndarray) -> str:
    return hashlib.sha256(patches.tobytes()).hexdigest()


def _decoded(data: bytes | None) -> np.ndarray | None:
    if not data:
        return None
    result = decode(data, GEOMETRY)
    return getattr(result, "patches", None)


def test_damaged_data_is_counted_per_source(epoch: tuple[Path, dict]) -> None:
    """What ``msd status`` shows per source while the job runs, the summary has at its end."""
    skipped = epoch[1]["skipped_images_by_source"]
    assert skipped["captions-wds"] >= 2  # an undecodable image, an image without its text
    assert skipped["captions-parquet"] >= 1  # an image without bytes
    assert "notes" not in skipped
    assert sum(skipped.values()) == epoch[1]["skipped_images"]


def test_the_stream_is_the_same_with_more_loaders(
    tmp_path: Path, vlm_data: Path, epoch: tuple[Path, dict]
) -> None:
    doc = recipe(vlm_data)
    for source in doc["sources"][:3]:
        source["loaders"] = 2
    job, summary = launch(tmp_path, doc)
    assert digests(job) == digests(epoch[0])
    assert {k: summary[k] for k in COUNTS} == {k: epoch[1][k] for k in COUNTS}


def test_the_same_shards_and_files_in_s3_give_the_same_stream(
    tmp_path: Path, vlm_data: Path, epoch: tuple[Path, dict], s3: S3Bucket
) -> None:
    """WebDataset shards (a damaged and a cut one among them), Parquet image and interleaved
    files and a text source, all read from an S3 bucket: the local stream, damage counted the
    same (the trainers' pace does not change the stream)."""
    s3.upload(vlm_data, "vlm")
    doc = recipe(vlm_data, trainer={"command": "demo", "demo": {"step_ms": 0}})
    for source in doc["sources"]:
        source["path"] = source["path"].replace(str(vlm_data), s3.url("vlm"))
    job, summary = launch(tmp_path, doc)
    assert digests(job) == digests(epoch[0])
    assert {k: summary[k] for k in COUNTS} == {k: epoch[1][k] for k in COUNTS}
    assert summary["skipped_images_by_source"] == epoch[1]["skipped_images_by_source"]


@pytest.mark.parametrize("shadows", [0, 1], ids=["restarted", "shadow"])
def test_a_killed_image_loader_leaves_the_stream_unchanged(
    tmp_path: Path, vlm_data: Path, epoch: tuple[Path, dict], shadows: int
) -> None:
    doc = recipe(vlm_data, loader={"heartbeat_s": 2})
    doc["sources"][INTERLEAVED]["shadows"] = shadows
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml", "--json")
    try:
        job = wait_for_step(tmp_path, 5, proc)
        victims = [
            p
            for p in role_pids(proc.pid, "loader")
            if "interleaved" in " ".join(psutil.Process(p).cmdline())
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
    assert len(recoveries) == 1, recoveries
    assert recoveries[0]["how"] == ("shadow" if shadows else "restarted"), recoveries
    assert digests(job) == digests(epoch[0])
    summary = json.loads(out[out.index("{") :])
    assert {k: summary[k] for k in COUNTS} == {k: epoch[1][k] for k in COUNTS}
    assert processes_of_launcher(proc.pid) == []


def test_rescaling_an_image_source_mid_run_leaves_the_stream_unchanged(
    tmp_path: Path, vlm_data: Path, epoch: tuple[Path, dict]
) -> None:
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe(vlm_data), sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml")
    try:
        job = wait_for_step(tmp_path, 3, proc)
        scaled = run_msd(
            "rescale", str(job), "--source", "captions-wds", "--loaders", "2", cwd=tmp_path
        )
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    assert_launch_ok(proc, out, err)
    generations = json.loads(JobDir(job).rescales.read_text())["generations"]
    assert [(g["source"], g["loaders"]) for g in generations] == [("captions-wds", 2)]
    assert generations[0]["start"] is not None, "the rescale finished after the run"
    assert digests(job) == digests(epoch[0])


def test_a_restore_onto_dp_2_gives_the_same_global_batches(
    tmp_path: Path, vlm_data: Path, epoch: tuple[Path, dict]
) -> None:
    original = epoch[0]
    other = tmp_path / "dp2.yaml"
    doc = recipe(vlm_data, distribute={"dp": 2}, global_batch_tokens=4 * SEQ_LEN)
    other.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run_msd(
        "restore", str(original), "--step", "8", "--recipe", str(other), "--json", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    restored = Path(json.loads(result.stdout)["job"])
    assert sorted(read_rank_logs(restored)) == [0, 1]
    before, after = global_batches(original), global_batches(restored)
    steps = sorted(before)
    assert sorted(after) == [s for s in steps if s >= 8] and len(after) >= 3
    for step in after:
        assert after[step] == before[step], step
