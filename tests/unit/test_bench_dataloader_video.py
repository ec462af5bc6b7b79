"""The video mode of benchmarks.dataloader: its clip mix, its data, its baseline's dataset, its
cost math, its recipe and its report.

Tiny data (2 sources of 3 one-second clips, encoded here with PyAV), no job launches, no
DataLoader processes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmarks.dataloader.config import Settings
from benchmarks.dataloader.cost import CostModel
from benchmarks.dataloader.video import (
    VIDEO,
    VIDEO_COST,
    VISION,
    Setup,
    VideoPoint,
    markdown,
    parse_point,
    recipe_dict,
    sample_units,
)
from benchmarks.dataloader.video_baseline import MixedVideoStream, VideoStreamConfig, read_shard
from benchmarks.dataloader.video_data import (
    RATES,
    SIZES,
    VideoDataset,
    VideoDataSpec,
    clip_mix,
    ensure_video_data,
)
from benchmarks.dataloader.vlm_cost import batch_costs
from msd.batch.pack import Piece, pack_rows
from msd.batch.sample import SampleImages
from msd.recipe.load import load_recipe
from msd.sources import video as videos
from msd.sources.fuse import video_spec_of

SPEC = VideoDataSpec(2, clips=3, clips_per_shard=2, median_s=1.0, max_s=1.5)
SEQ_LEN = 2048
VIDEO_SPEC = video_spec_of(VIDEO, VISION)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> VideoDataset:
    return ensure_video_data(SPEC, tmp_path_factory.mktemp("video-bench"))


def clip_bytes(dataset: VideoDataset) -> dict[tuple[int, int], bytes]:
    """(source, clip index) -> the clip's bytes, straight from the shards."""
    found = {}
    for s, source in enumerate(dataset.sources):
        for path in source.shards:
            rows = read_shard(path)
            for k, name in enumerate(_keys(path)):
                found[(s, int(name))] = rows.field("videos")[k].as_py()[0]
    return found


def _keys(path: str) -> list[str]:
    import tarfile

    with tarfile.open(path) as tar:
        return list(dict.fromkeys(m.name.partition(".")[0] for m in tar))


def test_the_clip_mix_is_long_tailed_and_drawn_from_the_sizes_and_rates() -> None:
    shapes = clip_mix(np.random.default_rng(0), 2000, 4.0, 40.0)
    seconds = np.array([s.seconds for s in shapes])
    assert 3.4 < float(np.median(seconds)) < 4.6
    assert seconds.min() >= 0.95 and seconds.max() <= 40.0 + 1 / min(RATES)
    assert (seconds > 15).mean() > 0.03  # the tail: tens of seconds
    assert (seconds < 8).mean() > 0.7  # most: a few seconds
    assert {(s.height, s.width) for s in shapes} == set(SIZES)
    assert {s.fps for s in shapes} == set(RATES)
    assert clip_mix(np.random.default_rng(0), 2000, 4.0, 40.0) == shapes  # the same mix again


def test_the_data_is_reused_and_its_manifest_matches_the_files(
    dataset: VideoDataset, tmp_path: Path
) -> None:
    clips = clip_bytes(dataset)
    for s, source in enumerate(dataset.sources):
        assert len(source.shards) == 2 and source.samples == 3
        for i, shape in enumerate(source.clips):
            header = videos.probe(clips[(s, i)])
            assert isinstance(header, videos.VideoHeader)
            assert (header.frames, header.height, header.width) == (
                shape.frames,
                shape.height,
                shape.width,
            )
            assert header.fps == pytest.approx(shape.fps)
    mtimes = [Path(p).stat().st_mtime_ns for s in dataset.sources for p in s.shards]
    again = ensure_video_data(SPEC, dataset.folder.parent)
    assert again.sources == dataset.sources
    assert mtimes == [Path(p).stat().st_mtime_ns for s in again.sources for p in s.shards]


def config(dataset: VideoDataset) -> VideoStreamConfig:
    return VideoStreamConfig(
        shards=tuple(s.shards for s in dataset.sources),
        weights=dataset.weights,
        seq_len=SEQ_LEN,
        rows=1,
        patience=2,
        vision=VISION,
        video=VIDEO,
    )


def batches(dataset: VideoDataset, rank: int, world: int, worker: int, workers: int, n: int):
    stream = MixedVideoStream(config(dataset), rank, world).stream(worker, workers)
    return [{k: v.numpy() for k, v in next(stream).items()} for _ in range(n)]


def test_the_baseline_delivers_each_clip_as_msd_decodes_it(dataset: VideoDataset) -> None:
    clips = clip_bytes(dataset)
    checked = 0
    for batch in batches(dataset, 0, 1, 0, 1, 3):
        grids, bounds = batch["video_grid_thw"], batch["video_cu_seqlens"]
        assert np.array_equal(np.diff(bounds), grids.prod(axis=1))
        assert batch["pixel_values_videos"].shape[1] == VIDEO_SPEC.patch_values
        placeholders = int(np.count_nonzero(batch["input_ids"] == VIDEO.video_token_id))
        assert placeholders == int(grids.prod(axis=1).sum()) // VISION.merge_size**2
        owners = zip(
            batch["video_source_ids"].tolist(), batch["video_sample_ids"].tolist(), strict=True
        )
        for k, (source, sample) in enumerate(owners):
            shard, row = divmod(sample, 1 << 20)
            index = (shard % 2) * SPEC.clips_per_shard + row  # shards of 2 clips, in order
            decoded = videos.decode(clips[(source, index)], VIDEO_SPEC)
            assert isinstance(decoded, videos.DecodedVideo)
            rows = batch["pixel_values_videos"][bounds[k] : bounds[k + 1]]
            assert np.array_equal(rows, decoded.patches)
            checked += 1
    assert checked >= 3


def test_workers_read_disjoint_shards(dataset: VideoDataset) -> None:
    seen: dict[tuple[int, int], set[int]] = {}
    for rank in range(2):
        for batch in batches(dataset, rank, 2, 0, 1, 2):
            for key in zip(batch["source_ids"].tolist(), batch["sample_ids"].tolist(), strict=True):
                seen.setdefault(key, set()).add(rank)
    assert len(seen) >= 4
    assert all(len(ranks) == 1 for ranks in seen.values())


def test_the_calibration_plans_what_the_decode_gives(dataset: VideoDataset) -> None:
    clips = clip_bytes(dataset)
    model = CostModel(attn=1.0, lin=0.0, enc_attn=1.0, enc_lin=0.0)
    units = sample_units(dataset.sources[0], VISION, VIDEO, SEQ_LEN, model)
    for i, (length, cost) in enumerate(units):
        decoded = videos.decode(clips[(0, i)], VIDEO_SPEC)
        assert isinstance(decoded, videos.DecodedVideo)
        t = decoded.grid[0]
        assert length == decoded.tokens + dataset.sources[0].caption_tokens[i]
        assert cost == len(decoded.patches) ** 2 / t


def test_a_video_costs_its_encoder_per_temporal_patch() -> None:
    model = CostModel(attn=1.0, lin=0.0, enc_attn=2.0, enc_lin=1.0)
    # a video of 2 temporal patches of 8 × 4 patches: each patch two rows of the image width
    clip = SampleImages(np.zeros((2 * 8 * 4 * 2, 588), np.uint8), ((2, 8, 4),), (True,), 2)
    rows = [[Piece(0, 5, np.full(16, VIDEO.video_token_id, np.int32), images=clip)], []]
    output = pack_rows_video(rows)
    costs = batch_costs(output, model)
    patches = 2 * 8 * 4
    encoder = 2.0 * patches**2 / 2 + patches
    assert costs["cost"] == 16**2 + 4**2 + 20**2 + encoder  # a piece, its row's and a row's pad
    assert costs["max_sequence_cost"] == 16**2 + encoder
    assert (costs["videos"], costs["video_patches"], costs["images"]) == (1, patches, 0)


def pack_rows_video(rows: list[list[Piece]]) -> dict[str, np.ndarray]:
    from benchmarks.dataloader.video_baseline import video_output

    return pack_rows(rows, 20, VISION.image_token_id, 588, video_output(VISION, VIDEO))


def test_msd_accepts_the_recipe(dataset: VideoDataset, tmp_path: Path) -> None:
    setup = Setup(dataset, Settings(cost=VIDEO_COST), VISION, VIDEO, 2, 1e-9)
    doc = recipe_dict(VideoPoint(2, 4, 2), setup, "python -m benchmarks.dataloader.trainer msd")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    recipe = load_recipe(path)
    assert recipe.has_videos and [s.loaders for s in recipe.sources] == [2, 2]
    assert recipe.global_batch_tokens == 4 * SEQ_LEN


def test_points_and_the_report() -> None:
    assert parse_point("2,4,2") == VideoPoint(2, 4, 2)
    assert parse_point("2,4,2,4096,2").global_batch_tokens == 4 * 2 * 4096
    with pytest.raises(Exception, match="S,R,W"):
        parse_point("2,4")
    run = {
        "steps_per_s": 0.5,
        "data_plane_peak_mib": 600.0,
        "cost_max_over_bound": 1.2,
        "cost_max_over_mean": 1.3,
    }
    entry = {
        "key": "video-S2-R4-W2-L2048x1",
        "point": VideoPoint(2, 4, 2).as_dict(),
        "data": {"clips": 64, "video_s": 355.0, "bytes_on_disk": 2**20},
        "msd_loaders_per_source": 1,
        "baseline": run,
        "msd": run | {"steps_per_s": 0.6, "data_plane_peak_mib": 300.0},
    }
    machine = {"platform": "p", "cores": 2, "memory_gib": 1, "python": "3", "torch": "t"}
    settings = {"steps": 4, "warmup": 1, "target_step_s": 1.0, "cost": {}, "video": {}}
    machine |= {"pyarrow": "a", "date": "d"}
    text = markdown({"machine": machine, "settings": settings, "points": [entry]})
    row = next(line for line in text.splitlines() if line.startswith("| video-S2"))
    assert "| 600 / 300 | 2.0 | 0.500 / 0.600 | 1.200 |" in row
