"""`msd peek`: the batch it shows is the one a real job's trainer rank receives."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from msd.launch.local import LocalJob
from msd.recipe.load import load_recipe
from msd.sources.vision import RESAMPLE, ImageGeometry, fit
from msd.synth.vlm import write_captions_parquet
from tests.conftest import base_recipe, run_msd

STEP, RANK = 2, 1


def _run(recipe_path: Path, run_root: Path) -> Path:
    job = LocalJob(load_recipe(recipe_path), recipe_path.read_text(), run_root)
    job.start()
    outcome = job.watch(lambda status: None)
    assert outcome.ok, outcome.message
    return outcome.job.root


def _peek_json(*args: str, cwd: Path) -> dict[str, Any]:
    result = run_msd("peek", *args, "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _samples(peeked: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for row in peeked["rows"] for s in row["samples"]]


def test_peek_shows_the_batch_the_jobs_rank_received(small_data, write_recipe, tmp_path):
    recipe = base_recipe(small_data, steps=STEP + 1)
    recipe["trainer"]["demo"]["save_batches"] = True
    recipe_path = write_recipe(recipe)
    job_root = _run(recipe_path, tmp_path / "runs")
    # DP rank 1 is trainer rank 1 here (dp 4 only); what its NumpyClient handed out:
    with np.load(job_root / "trainer" / "rank-1" / f"step-{STEP}.npz") as saved:
        received = {name: saved[name] for name in saved.files}

    peeked = _peek_json(str(recipe_path), "--step", str(STEP), "--rank", str(RANK), cwd=tmp_path)
    samples = _samples(peeked)
    assert [s["sample_id"] for s in samples] == received["sample_ids"].tolist()
    assert [s["source_id"] for s in samples] == received["source_ids"].tolist()
    assert [s["offset"] for s in samples] == received["sample_offsets"].tolist()
    ids = received["input_ids"]
    for row in peeked["rows"]:
        for s in row["samples"]:
            at = s["start"]
            assert s["input_ids"] == ids[row["row"], at : at + s["length"]].tolist()
            assert s["text"].encode() == bytes(s["input_ids"])  # synth text is ASCII
        assert row["padding"] + sum(s["length"] for s in row["samples"]) == ids.shape[1]
    assert peeked["png"] is None and not list(tmp_path.glob("*.png"))

    # the job folder shows the same rows, from what its trainer saved
    assert (
        _peek_json(str(job_root), "--step", str(STEP), "--rank", str(RANK), cwd=tmp_path) == peeked
    )
    shown = run_msd("peek", str(job_root), "--step", str(STEP), "--rank", "1", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert all(f"#{s['sample_id']}" in shown.stdout for s in samples)
    # a step the job never saved: one sentence pointing at the recipe
    missing = run_msd("peek", str(job_root), "--step", "9", cwd=tmp_path)
    assert missing.returncode == 1 and "peek its recipe instead" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_peek_of_images_writes_a_contact_sheet_of_the_sources_images(tmp_path):
    data = tmp_path / "captions"
    write_captions_parquet(data, seed=3, samples=6, files=1, rows_per_group=6)
    max_pixels = 28 * 28 * 64
    recipe = {
        "name": "peek-vlm",
        "seed": 1,
        "steps": 1,
        "seq_len": 512,
        "global_batch_tokens": 1024,
        "vision": {"max_pixels": max_pixels},
        "sources": [
            {
                "name": "captions",
                "path": str(data / "*.parquet"),
                "text_column": "text",
                "image_column": "image",
                "weight": 1.0,
                "repeat": True,
            }
        ],
    }
    recipe_path = tmp_path / "vlm.yaml"
    recipe_path.write_text(json.dumps(recipe))  # JSON is YAML
    sheet = tmp_path / "sheet.png"
    peeked = _peek_json(str(recipe_path), "--png", str(sheet), cwd=tmp_path)
    assert peeked["png"] == str(sheet)

    table = pq.read_table(sorted(data.glob("*.parquet")))
    texts, images = table.column("text").to_pylist(), table.column("image").to_pylist()
    samples = _samples(peeked)
    assert all(s["text"].endswith(texts[s["sample_id"]]) for s in samples)
    # each image as the source holds it, resized the way the recipe's vision says
    geometry = ImageGeometry(max_pixels=max_pixels)
    expected = []
    for s in samples:
        assert s["images"] == 1
        with Image.open(io.BytesIO(images[s["sample_id"]]["bytes"])) as source:
            h, w = fit(source.height, source.width, geometry)
            expected.append(np.asarray(source.convert("RGB").resize((w, h), RESAMPLE)))

    from msd.peek import sheet_layout

    size, corners = sheet_layout([(e.shape[0], e.shape[1]) for e in expected])
    with Image.open(sheet) as png:
        assert png.format == "PNG" and png.size == size
        pixels = np.asarray(png.convert("RGB"))
    for (x, y), want in zip(corners, expected, strict=True):
        got = pixels[y : y + want.shape[0], x : x + want.shape[1]]
        assert np.array_equal(got, want)
