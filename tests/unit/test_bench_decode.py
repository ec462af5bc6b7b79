"""benchmarks.decode's pure parts, and its in-process baseline on a tiny data set: every image
of the three sources is read from the files and decoded once; no job is launched."""

from __future__ import annotations

import io
import math
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks import decode_modes
from benchmarks.decode import (
    STAGES,
    baseline,
    cpu_at,
    cpu_total,
    image_bytes,
    make_data,
    pace_step_ms,
    percentile,
    rate,
    ratio,
    ready_times,
    recipe,
    stage_profile,
    steady_waits,
    step_interval_ms,
    wait_stats,
)
from msd.recipe.checks import check_recipe
from msd.recipe.load import recipe_from_data
from msd.sources.vision import ImageGeometry, fit

GEOMETRY = ImageGeometry(max_pixels=14 * 14 * 4 * 64)  # small images: a fast test


def test_rates_and_ratios():
    assert rate(300, 2.0) == 150.0
    assert rate(5, 0.0) == 0.0
    assert ratio(105.0, 150.0) == pytest.approx(0.7)
    assert math.isnan(ratio(1.0, 0.0))


def test_percentiles_and_wait_stats():
    values = list(range(1, 101))
    assert percentile(values, 50) == pytest.approx(np.percentile(values, 50))
    assert percentile(values, 99) == pytest.approx(99.01)
    assert math.isnan(percentile([], 99))
    stats = wait_stats([1.0, 2.0, 3.0, 10.0])
    assert stats["n"] == 4 and stats["max_ms"] == 10.0 and stats["mean_ms"] == 4.0
    assert stats["p50_ms"] == 2.5


def test_steady_waits_drop_the_warmup_steps_of_every_rank():
    logs = {
        0: [{"step": s, "wait_ms": 100.0 if s < 2 else 1.0} for s in range(5)],
        1: [{"step": s, "wait_ms": 50.0 if s < 2 else 2.0} for s in range(5)],
    }
    assert sorted(steady_waits(logs, warmup=2)) == [1.0] * 3 + [2.0] * 3
    assert len(steady_waits(logs, warmup=0)) == 10


def test_step_interval_is_rank_0s_mean_gap():
    logs = {0: [{"step": s, "time": 100.0 + 0.2 * s} for s in range(6)]}
    assert step_interval_ms(logs, first=1) == pytest.approx(200.0)
    assert math.isnan(step_interval_ms({0: [{"step": 0, "time": 1.0}]}))


def test_pace_divides_by_the_mean_cost_fraction():
    seq_len, rows = 1024, 2
    full = rows * seq_len**2
    # Steps costing a quarter of a full step on average: step_ms must be 4× the target.
    assert pace_step_ms(50.0, [0.2 * full, 0.3 * full], rows, seq_len) == pytest.approx(200.0)
    assert pace_step_ms(50.0, [], rows, seq_len) == 50.0


def test_cpu_readings():
    assert cpu_total({1: 0.5, 2: 1.25}) == 1.75
    readings = [(10.0, 0.0), (11.0, 0.4), (12.0, 1.0)]
    assert cpu_at(readings, 10.5) == pytest.approx(0.2)
    assert cpu_at(readings, 9.0) == 0.0
    assert cpu_at(readings, 20.0) == 1.0
    assert cpu_at([], 1.0) == 0.0


def test_ready_times_parse_the_loader_log():
    text = (
        "2026-12-01 16:23:29,906 INFO loader[interleaved/0] step=- msd.roles.loader.loop: "
        "loader interleaved/0 (1 sources) ready in 0.06 s\n"
        "2026-12-01 16:23:30,000 INFO loader[interleaved/0] step=3 something else\n"
    )
    found = ready_times(text)
    expected = time.mktime(time.strptime("2026-12-01 16:23:29", "%Y-%m-%d %H:%M:%S")) + 0.906
    assert found == {"interleaved/0": pytest.approx(expected)}


def test_the_recipes_are_valid(tmp_path: Path):
    for doc in (
        recipe(tmp_path, "epoch", loaders=1, step_ms=1),
        recipe(tmp_path, "steady", loaders=2, step_ms=30, steps=40),
    ):
        parsed = recipe_from_data(doc, "test")
        assert check_recipe(parsed) == []
        assert len(parsed.sources) == 3
        assert all(s.repeat == ("steps" in doc) for s in parsed.sources)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("decode")
    return root, make_data(root, samples=4)


def test_the_baseline_reads_and_decodes_every_image_once(tiny: tuple[Path, dict]):
    root, sources = tiny
    total = sum(s["images"] for s in sources.values())
    assert len(list(image_bytes(root))) == total
    result = baseline(root, GEOMETRY)
    assert result["images"] == result["decoded"] == total and result["failed"] == 0
    assert result["cpu_s"] > 0 and result["images_per_cpu_s"] > 0
    assert result["images_per_decode_cpu_s"] >= result["images_per_cpu_s"]
    assert result["patch_bytes"] == result["patches"] * 3 * 14 * 14


def test_the_stage_profile_covers_every_stage(tiny: tuple[Path, dict]):
    spent = stage_profile(tiny[0], GEOMETRY)
    assert list(spent) == list(STAGES)
    assert all(v >= 0 for v in spent.values()) and sum(spent.values()) > 0


def test_the_modes_differ_on_exactly_the_jpegs_fast_decodes_reduced(tiny: tuple[Path, dict]):
    blobs = list(image_bytes(tiny[0]))
    result = decode_modes.on_images(blobs, GEOMETRY)
    assert result["decodes"] == len([b for b in blobs if b])
    assert all(result["images_per_cpu_s"][m] > 0 for m in decode_modes.MODES)
    assert result["jpegs"] >= result["jpegs_decoded_reduced_by_fast"] > 0
    assert result["decodes_with_other_pixels"] == result["jpegs_decoded_reduced_by_fast"]
    assert result["mean_abs_difference"] > 0


@pytest.mark.parametrize(("height", "width"), [(300, 400), (900, 1200), (1500, 700)])
def test_draft_scale_is_the_scale_pillow_decodes_at(height: int, width: int):
    data = decode_modes.photo(height, width)
    h, w = fit(height, width, GEOMETRY)
    scale = decode_modes.draft_scale(height, width, GEOMETRY)
    with Image.open(io.BytesIO(data)) as image:
        image.draft("RGB", (w, h))
        assert image.size == (-(-width // scale), -(-height // scale))


def test_sizes_are_decoded_in_both_modes_under_each_geometry(capsys: pytest.CaptureFixture[str]):
    geometries = [GEOMETRY, ImageGeometry(max_pixels=14 * 14 * 4 * 1024)]
    rows = decode_modes.on_sizes(geometries, sizes=[(600, 800)], min_cpu_s=0.0)
    assert [r["max_pixels"] for r in rows] == [g.max_pixels for g in geometries]
    reduced, full = rows
    assert reduced["draft_scale"] == 2 and full["draft_scale"] == 1
    assert reduced["decodes"] == full["decodes"] == 1
    assert reduced["mean_abs_difference"] > 0 and reduced["decodes_with_other_pixels"] == 1
    assert full["mean_abs_difference"] == 0 and full["decodes_with_other_pixels"] == 0
    demo = decode_modes.on_images([decode_modes.photo(60, 80)], GEOMETRY)
    decode_modes.print_table({"demo": demo, "sizes": rows}, GEOMETRY.max_pixels)
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 + 1 + len(rows) and "| 800×600 JPEG → " in table[3]
