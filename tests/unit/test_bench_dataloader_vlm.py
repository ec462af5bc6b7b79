"""The VLM mode of benchmarks.dataloader: its data, its baseline's dataset and its cost math.

Tiny data (2 sources, a few dozen small images), no job launches, no DataLoader processes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks.dataloader.cost import CostModel
from benchmarks.dataloader.vlm import VlmPoint, parse_point, ratios
from benchmarks.dataloader.vlm_baseline import (
    MixedImageStream,
    VlmStreamConfig,
)
from benchmarks.dataloader.vlm_cost import batch_costs, mean_rank_cost, sample_shapes
from benchmarks.dataloader.vlm_data import VlmDataset, VlmDataSpec, ensure_vlm_data
from msd.batch.pack import Piece, pack_rows
from msd.batch.sample import SampleImages
from msd.recipe.schema import Vision
from msd.sources.fuse import geometry_of
from msd.sources.vision import DecodedImage, decode

VISION = Vision(max_pixels=14 * 14 * 4 * 64)
SEQ_LEN = 4096  # no image of the tiny data is cut at seq_len
SPEC = VlmDataSpec(2, images=24, rg_images=6, median_side=96, max_side=256)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> VlmDataset:
    return ensure_vlm_data(SPEC, tmp_path_factory.mktemp("vlm-bench"))


def config(dataset: VlmDataset, **overrides: object) -> VlmStreamConfig:
    fields: dict[str, object] = {
        "paths": tuple(s.path for s in dataset.sources),
        "image_columns": tuple(s.image_column for s in dataset.sources),
        "weights": dataset.weights,
        "seq_len": SEQ_LEN,
        "rows": 2,
        "patience": 4,
        "vision": VISION,
    }
    return VlmStreamConfig(**(fields | overrides))  # type: ignore[arg-type]


def source_images(dataset: VlmDataset) -> dict[tuple[int, int], list[bytes]]:
    """(source, row) -> its images' bytes, straight from the files."""
    found = {}
    for s, source in enumerate(dataset.sources):
        cells = pq.read_table(source.path).column(source.image_column).to_pylist()
        for row, cell in enumerate(cells):
            found[(s, row)] = [c["bytes"] for c in (cell if isinstance(cell, list) else [cell])]
    return found


def batches(dataset: VlmDataset, rank: int, world: int, worker: int, workers: int, n: int):
    stream = MixedImageStream(config(dataset), rank, world).stream(worker, workers)
    return [{k: v.numpy() for k, v in next(stream).items()} for _ in range(n)]


def test_the_data_is_reused_and_its_manifest_matches_the_files(
    dataset: VlmDataset, tmp_path: Path
) -> None:
    assert [s.kind for s in dataset.sources] == ["captions", "interleaved"]
    again = ensure_vlm_data(SPEC, dataset.folder.parent)
    assert again.sources == dataset.sources
    images = source_images(dataset)
    for s, source in enumerate(dataset.sources):
        assert source.samples == pq.ParquetFile(source.path).metadata.num_rows
        for row, sizes in enumerate(source.image_sizes):
            assert len(images[(s, row)]) == len(sizes)
    other = ensure_vlm_data(VlmDataSpec(2, 24, 6, 96, 256, seed=1), tmp_path)
    assert source_images(other)[(0, 0)] != images[(0, 0)]


def test_real_images_are_drawn_from_the_folder_as_they_are(tmp_path: Path) -> None:
    from PIL import Image

    folder = tmp_path / "photos"
    (folder / "nested").mkdir(parents=True)
    sizes = {"a.jpg": (40, 60), "nested/b.png": (50, 33), "c.webp": (64, 64)}
    files = {}
    for name, (w, h) in sizes.items():
        path = folder / name
        Image.new("RGB", (w, h), (len(name) * 20, 90, 30)).save(path)
        files[path.read_bytes()] = (h, w)
    Image.new("RGB", (8, 80)).save(folder / "too-thin.jpg")  # a side under MIN_SIDE: left out
    (folder / "notes.jpg").write_bytes(b"not an image")  # msd would not decode it: left out
    spec = VlmDataSpec(2, images=12, rg_images=4, real_images=str(folder))
    real = ensure_vlm_data(spec, tmp_path / "data")
    assert "real" in real.folder.name and real.folder.name != SPEC.folder_name
    drawn = source_images(real)
    for s, source in enumerate(real.sources):
        seen = [b for row in range(source.samples) for b in drawn[(s, row)]]
        assert len(seen) >= 12 and set(seen) == set(files)  # a pass over the pool, then again
        for row, hws in enumerate(source.image_sizes):
            assert list(hws) == [files[b] for b in drawn[(s, row)]]
    assert len({drawn[(0, row)][0] for row in range(3)}) == 3  # captions: a shuffled pass first


def test_workers_read_disjoint_samples(dataset: VlmDataset) -> None:
    """Over one epoch's worth of draws, no (source, sample) comes from two of the 4 workers
    (2 ranks × 2), and the ids are those of the files' rows (epoch 0)."""
    seen: dict[tuple[int, int], set[int]] = {}
    for rank in range(2):
        for worker in range(2):
            for batch in batches(dataset, rank, 2, worker, 2, 3):
                for key in zip(
                    batch["source_ids"].tolist(), batch["sample_ids"].tolist(), strict=True
                ):
                    seen.setdefault(key, set()).add(rank * 2 + worker)
    epoch = {s: src.samples for s, src in enumerate(dataset.sources)}
    assert all(len(w) == 1 for (s, i), w in seen.items() if i < epoch[s])
    assert len(seen) > 10


def test_pixels_match_decode_and_placeholders_match_patches(dataset: VlmDataset) -> None:
    files = source_images(dataset)
    epoch = {s: src.samples for s, src in enumerate(dataset.sources)}
    images = {(s, i + e * epoch[s]): v for (s, i), v in files.items() for e in range(4)}
    checked = 0
    for batch in batches(dataset, 0, 1, 0, 1, 4):
        bounds, grids = batch["vision_cu_seqlens"], batch["image_grid_thw"]
        assert batch["pixel_values"].dtype == np.uint8
        assert batch["pixel_values"].shape[1] == geometry_of(VISION).patch_values
        assert np.array_equal(np.diff(bounds), grids.prod(axis=1))
        placeholders = int(np.count_nonzero(batch["input_ids"] == VISION.image_token_id))
        assert placeholders == int(grids.prod(axis=1).sum()) // VISION.merge_size**2
        nth: Counter[tuple[int, int]] = Counter()
        owners = zip(
            batch["image_source_ids"].tolist(), batch["image_sample_ids"].tolist(), strict=True
        )
        for k, key in enumerate(owners):
            expected = decode(images[key][nth[key]], geometry_of(VISION))
            nth[key] += 1
            assert isinstance(expected, DecodedImage)
            assert np.array_equal(
                batch["pixel_values"][bounds[k] : bounds[k + 1]], expected.patches
            )
            checked += 1
        # Every sample of the batch has all its images.
        for key in zip(batch["source_ids"].tolist(), batch["sample_ids"].tolist(), strict=True):
            assert nth[key] == len(images[key])
    assert checked > 8


def test_batch_costs_add_the_encoder_and_name_the_costliest_sample() -> None:
    model = CostModel(attn=1.0, lin=0.0, enc_attn=2.0, enc_lin=1.0)
    image = SampleImages(np.zeros((8, 588), np.uint8), ((1, 2, 4),))  # 8 patches
    rows = [
        [Piece(0, 7, np.full(5, 151655, np.int32), images=image), Piece(1, 3, np.arange(1, 4))],
        [Piece(0, 9, np.arange(1, 7))],
    ]
    batch = pack_rows(rows, 10, 151655)
    costs = batch_costs(batch, model)
    backbone = 5**2 + 3**2 + 2**2 + 6**2 + 4**2  # pieces and padding runs
    assert costs["cost"] == backbone + 2 * 8**2 + 8
    assert costs["max_sequence_cost"] == 5**2 + 2 * 8**2 + 8  # the sample with the image
    assert (costs["images"], costs["patches"]) == (1, 8)
    text = pack_rows(rows[1:], 10)
    assert batch_costs(text, model) == {
        "cost": 6**2 + 4**2,
        "max_sequence_cost": 6**2,
        "images": 0,
        "patches": 0,
    }


def test_sample_shapes_follow_the_geometry_and_the_calibration_is_positive(
    dataset: VlmDataset,
) -> None:
    source = dataset.sources[1]
    shapes = sample_shapes(source, geometry_of(VISION), SEQ_LEN)
    images = source_images(dataset)
    for row, (length, patches) in enumerate(shapes[:5]):
        decoded = [decode(b, geometry_of(VISION)) for b in images[(1, row)]]
        assert list(patches) == [len(d.patches) for d in decoded]  # type: ignore[union-attr]
        assert length == min(SEQ_LEN, source.text_tokens[row] + sum(patches) // 4)
    cost = mean_rank_cost(dataset.sources, geometry_of(VISION), SEQ_LEN, 2, 4, CostModel(), 20)
    assert cost > 2 * SEQ_LEN  # at least the padding runs' linear cost


def test_points_and_ratios() -> None:
    assert parse_point("16,8,2") == VlmPoint(16, 8, 2)
    assert parse_point("16,8,2,4096,1").global_batch_tokens == 8 * 4096
    entry = {
        "baseline": {
            "steps_per_s": 1.0,
            "data_plane_peak_mib": 1400.0,
            "cost_max_over_bound": 1.25,
            "cost_max_over_mean": 1.3,
        },
        "msd": {"steps_per_s": 1.2, "data_plane_peak_mib": 100.0},
    }
    r = ratios(entry)
    assert r["memory_ratio"] == 14.0
    assert r["speedup_over_allowed"] == pytest.approx(1.2 / 1.25)
    assert ratios({"baseline": {"error": "x"}})["memory_ratio"] is None
