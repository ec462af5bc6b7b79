"""examples/qwen2_vl.py on videos: a tiny Qwen2-VL trained on msd's packed video-text batches.

Under ``msd launch`` (two ranks, gloo, CPU) on the demo's video sources (``msd synth --kind
video``: WebM clips in WebDataset shards, a Parquet video column), image captions and text: the
run ends cleanly, every delivered video and image goes through a vision tower once, and the loss
is finite and falls. Without a launch, for Qwen2-VL and Qwen2.5-VL: the example's per-sample
M-RoPE positions of rows holding videos and images are those the model's own
``get_rope_index`` gives each sample alone (Qwen2.5-VL's spaced by ``second_per_grid_ts``), and a
packed row gives every sample the logits it gets alone.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from msd.batch.pack import Piece, VideoOutput, pack_rows
from msd.batch.sample import SampleImages
from msd.recipe.schema import Video, Vision, from_json
from msd.sources.vision import ImageGeometry, patchify
from msd.synth.text import SynthSource, synth
from msd.synth.video import write_video_sources
from msd.synth.vlm import write_vlm_sources
from tests.conftest import assert_launch_ok, processes_of_launcher, start_launch
from tests.integration.test_example_vlm import EXAMPLE, load_example

# The launch runs in the module fixture, in its first test's time on a shared
# 2-core machine: 20 s here (most of it two ranks importing torch and transformers).
pytestmark = pytest.mark.timeout(600)

RANKS = 2
STEPS = 12
SEQ_LEN = 512
IMAGE_TOKEN, VIDEO_TOKEN = 256, 257  # right after the bytes transform's ids
VISION = Vision(image_token_id=IMAGE_TOKEN, max_pixels=14 * 14 * 4 * 64)
# fps 1.5: a temporal patch spans 4/3 s, so Qwen2.5-VL's temporal positions step by a fraction
# (2 tokens a second × 1.333 = 2.667) and their truncation is checked too.
VIDEO = Video(
    fps=1.5, max_frames=8, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16, video_token_id=257
)
NOTES = SynthSource("notes", median_tokens=60, sigma=0.7, max_tokens=400, num_samples=40)
MODELS = ("qwen2-vl", "qwen2.5-vl")


def video_recipe(data: Path) -> dict[str, Any]:
    """The demo's two video sources, image captions and a little text, one row of SEQ_LEN
    tokens a rank."""
    sources = [
        ("video-captions", "video-captions-wds/*.tar", {"format": "webdataset"}, 0.35),
        ("video-qa", "video-qa-parquet/*.parquet", {"video_column": "video"}, 0.3),
        ("captions", "captions-wds/*.tar", {"format": "webdataset"}, 0.2),
        ("notes", "notes/*.parquet", {}, 0.15),
    ]
    texts = {"video-captions": "txt", "captions": "txt"}
    return {
        "name": "video-example",
        "seed": 3,
        "steps": STEPS,
        "seq_len": SEQ_LEN,
        "global_batch_tokens": RANKS * SEQ_LEN,
        "distribute": {"dp": RANKS},
        "vision": {"image_token_id": IMAGE_TOKEN, "max_pixels": VISION.max_pixels},
        "video": {
            "fps": VIDEO.fps,
            "max_frames": VIDEO.max_frames,
            "min_pixels": VIDEO.min_pixels,
            "max_pixels": VIDEO.max_pixels,
            "video_token_id": VIDEO_TOKEN,
        },
        "loader": {"sources_per_process": 4},  # one loader process: the CPUs go to the ranks
        "sources": [
            {"name": name, "path": str(data / path), "weight": weight}
            | {"text_column": texts.get(name, "text")}
            | options
            | ({"video_exts": ["webm"]} if name == "video-captions" else {})
            | {"repeat": True, "loaders": 1}
            for name, path, options, weight in sources
        ],
        "trainer": {"command": f"python {EXAMPLE}"},
    }


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The job folder and run summary of one finished training run."""
    root = tmp_path_factory.mktemp("video-example")
    write_video_sources(root / "data", seed=3, videos=8, files_per_source=1)
    write_vlm_sources(root / "data", seed=3, samples=8, files_per_source=1, rows_per_row_group=4)
    synth(root / "data", (NOTES,), seed=3, files_per_source=1, rows_per_row_group=16)
    (root / "r.yaml").write_text(yaml.safe_dump(video_recipe(root / "data"), sort_keys=False))
    launcher = start_launch(root, "r.yaml", "--json")
    out, err = launcher.communicate(timeout=500)
    assert_launch_ok(launcher, out, err)
    summary: dict[str, Any] = json.loads(out[out.index("{") :])
    return Path(summary["job"]), summary


def test_trains_on_videos_and_ends_cleanly(job: tuple[Path, dict[str, Any]]) -> None:
    folder, summary = job
    logs = {
        rank: [
            json.loads(line)
            for line in (folder / "trainer" / f"vlm-rank-{rank}.jsonl").read_text().splitlines()
        ]
        for rank in range(RANKS)
    }
    for records in logs.values():
        assert [r["step"] for r in records] == list(range(STEPS))
    losses = [r["loss"] for r in logs[0]]
    assert all(math.isfinite(loss) for loss in losses), losses
    assert all([r["loss"] for r in records] == losses for records in logs.values())
    # Every video and image the data plane delivered (its summary counts both) went through a
    # vision tower, once; some rank fed it a video on every step (65% of the samples come from
    # the video sources).
    rank_steps = [r for records in logs.values() for r in records]
    assert sum(r["images"] + r["videos"] for r in rank_steps) == summary["images"]
    assert all(sum(logs[k][s]["videos"] for k in logs) > 0 for s in range(STEPS))
    assert all((r["videos"] > 0) == (r["video_patches"] > 0) for r in rank_steps)
    assert summary["skipped_images"] == 0
    # From ln(258) = 5.55 at random init; measured: 5.44 over the first 3 steps, 3.77 over the
    # last 3, 31% lower (the run is deterministic on CPU). A fifth is the bar: well below that,
    # far above the step-to-step noise (about 0.1).
    first, last = np.mean(losses[:3]), np.mean(losses[-3:])
    assert last <= 0.8 * first, (first, last, losses)
    assert json.loads((folder / "job.json").read_text())["state"] == "done"
    assert processes_of_launcher(os.getpid()) == []


# -- without a launch: positions and packing ----------------------------------------------------
Part = int | tuple[str, int, int, int]  # text tokens, or ("image" | "video", t, h, w)
# Clips first (captions), images and videos amid text, an image right before a video, text
# alone, and videos with more temporal patches than patch rows or columns.
SAMPLES: list[list[Part]] = [
    [("video", 4, 4, 6), 7],
    [5, ("image", 1, 6, 2), 3, ("video", 2, 2, 4), 4],
    [9],
    [3, ("video", 6, 2, 2), 2],
    [("image", 1, 2, 2), ("video", 1, 2, 2), 1],
    [6, ("video", 3, 4, 4), 2],
]
PATCH = 3 * VISION.patch_size**2  # an image patch's values (msd's vision.temporal_patch_size 1)
Made = list[tuple[int, np.ndarray, list[tuple[str, int, int, int]]]]


def sample_tokens(rng: np.random.Generator, parts: list[Part]) -> tuple[np.ndarray, list[Any]]:
    """A sample's token ids and its images and videos in order (t·h·w / merge² placeholders
    each, as msd writes them)."""
    ids: list[int] = []
    items = []
    for part in parts:
        if isinstance(part, int):
            ids += rng.integers(0, 256, part).tolist()
        else:
            kind, t, h, w = part
            items.append(part)
            token = VIDEO_TOKEN if kind == "video" else IMAGE_TOKEN
            ids += [token] * (t * h * w // VISION.merge_size**2)
    return np.array(ids, dtype=np.int64), items


def packed_batch(rng: np.random.Generator, seq_len: int) -> tuple[dict[str, torch.Tensor], Made]:
    """msd's batch of SAMPLES (``msd.batch.pack.pack_rows``, as the Constructor builds it), packed
    into rows of ``seq_len`` in order; and each sample's start in the flattened rows, tokens and
    items. A video patch takes two image-patch rows on the way, as from a loader."""
    rows: list[list[Piece]] = [[]]
    made: Made = []
    used = 0
    for index, parts in enumerate(SAMPLES):
        ids, items = sample_tokens(rng, parts)
        if used + len(ids) > seq_len:
            rows.append([])
            used = 0
        is_video = tuple(kind == "video" for kind, *_ in items)
        grids = tuple((t, h, w) for _, t, h, w in items)
        patch_rows = sum(t * h * w * (1 + v) for (t, h, w), v in zip(grids, is_video, strict=True))
        values = rng.integers(0, 256, (patch_rows, PATCH), dtype=np.uint8)
        images = SampleImages(values, grids, is_video, video_rows=2) if items else None
        rows[-1].append(Piece(source=0, sample_id=index, tokens=ids, images=images))
        made.append(((len(rows) - 1) * seq_len + used, ids, items))
        used += len(ids)
    output = VideoOutput(VIDEO_TOKEN, 2 * PATCH, VIDEO.seconds_per_grid)
    arrays = pack_rows(rows, seq_len, IMAGE_TOKEN, PATCH, output)
    return {name: torch.from_numpy(array) for name, array in arrays.items()}, made


def kinds_of(tokens: torch.Tensor) -> torch.Tensor:
    """``mm_token_type_ids`` as Qwen2-VL's processor writes them: 1 image, 2 video, 0 text."""
    return ((tokens == IMAGE_TOKEN).int() + 2 * (tokens == VIDEO_TOKEN).int()).int()


def grids_of(items: list[Any], kind: str) -> torch.Tensor:
    return torch.tensor([item[1:] for item in items if item[0] == kind]).reshape(-1, 3)


def visual_arguments(model: str, items: list[Any]) -> dict[str, Any]:
    """One sample's grids (and Qwen2.5-VL's seconds per temporal patch) as the model takes
    them."""
    found: dict[str, Any] = {
        "image_grid_thw": grids_of(items, "image"),
        "video_grid_thw": grids_of(items, "video"),
    }
    if model == "qwen2.5-vl":
        videos = len(found["video_grid_thw"])
        found["second_per_grid_ts"] = torch.full((videos,), VIDEO.seconds_per_grid)
    return found


def build(example: ModuleType, model: str, attention: str = "sdpa") -> Any:
    torch.set_num_threads(1)
    args = example.parse_args(["--model", model, "--attn-implementation", attention])
    return example.build_model(args, VISION, 258, 128, VIDEO).eval()


def tokens_per_second(example: ModuleType, model: str) -> int | None:
    return example.parse_args([]).tokens_per_second if model == "qwen2.5-vl" else None


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example()


@pytest.mark.parametrize("model", MODELS)
def test_positions_of_packed_videos_are_get_rope_index_of_each_sample_alone(
    example: ModuleType, model: str
) -> None:
    qwen = build(example, model)
    batch, made = packed_batch(np.random.default_rng(0), seq_len=64)
    assert len(batch["input_ids"]) > 1 and len(made) > len(batch["input_ids"])  # rows of several
    placed = example.placed_in(batch, VISION, VIDEO, tokens_per_second(example, model))
    mrope = example.mrope_position_ids(
        batch["input_ids"], batch["cu_seqlens"], placed, VISION.merge_size
    ).flatten(1)
    in_sample = torch.zeros(mrope.shape[1], dtype=torch.bool)
    for start, ids, items in made:
        tokens = torch.from_numpy(ids)[None]
        alone, _ = qwen.model.get_rope_index(
            tokens, mm_token_type_ids=kinds_of(tokens), **visual_arguments(model, items)
        )
        assert torch.equal(mrope[:, start : start + len(ids)], alone[:, 0]), (start, items)
        in_sample[start : start + len(ids)] = True
    assert not in_sample.all()  # padding counts from 0 on all three axes, as msd's positions
    padding = batch["position_ids"].flatten()[~in_sample]
    assert torch.equal(mrope[:, ~in_sample], padding.expand(3, -1))
    # A video's temporal patches take temporal positions: Qwen2-VL's one apart, Qwen2.5-VL's
    # 2 tokens a second × 4/3 s apart (truncated), from where the text before it stopped.
    first = mrope[0, : 4 * 2 * 3]  # the first sample's video: 4 temporal patches of 2×3 tokens
    steps = [0, 1, 2, 3] if model == "qwen2-vl" else [0, 2, 5, 8]
    assert first.tolist() == [s for s in steps for _ in range(6)]


@pytest.mark.parametrize("model", MODELS)
def test_a_packed_row_of_videos_gives_each_sample_its_logits_alone(
    example: ModuleType, model: str
) -> None:
    """msd's rows through the example's inputs: each sample's logits are those of a forward
    pass of the sample alone, where the model numbers its positions itself."""
    qwen = build(example, model)
    assert (qwen.config.image_token_id, qwen.config.video_token_id) == (IMAGE_TOKEN, VIDEO_TOKEN)
    assert qwen.config.vision_config.temporal_patch_size == VIDEO.temporal_patch_size
    batch, made = packed_batch(np.random.default_rng(2), seq_len=64)
    for name in ("pixel_values", "pixel_values_videos"):  # as pixels="float" gives
        batch[name] = torch.randn(batch[name].shape)
    rate = tokens_per_second(example, model)
    inputs = example.model_inputs(batch, VISION, torch.device("cpu"), VIDEO, rate)
    assert ("second_per_grid_ts" in inputs) == (model == "qwen2.5-vl")
    with torch.no_grad():
        packed = qwen(**inputs).logits.flatten(0, 1)
    images = iter(torch.split(batch["pixel_values"], batch["image_grid_thw"].prod(-1).tolist()))
    clips = iter(
        torch.split(batch["pixel_values_videos"], batch["video_grid_thw"].prod(-1).tolist())
    )
    for start, ids, items in made:
        tokens = torch.from_numpy(ids)[None]
        alone: dict[str, Any] = {"input_ids": tokens, "use_cache": False}
        if items:
            found = visual_arguments(model, items)
            mine = [next(images) for _ in found["image_grid_thw"]]
            theirs = [next(clips) for _ in found["video_grid_thw"]]
            alone |= {"mm_token_type_ids": kinds_of(tokens)}
            if mine:
                pixels = example.image_patches(torch.cat(mine), VISION, 2)
                alone |= {"pixel_values": pixels, "image_grid_thw": found["image_grid_thw"]}
            if theirs:
                alone |= {"pixel_values_videos": torch.cat(theirs)}
                alone |= {k: v for k, v in found.items() if k != "image_grid_thw"}
        with torch.no_grad():
            expected = qwen(**alone).logits[0]
        torch.testing.assert_close(packed[start : start + len(ids)], expected, rtol=0, atol=1e-4)
    assert next(images, None) is None and next(clips, None) is None


def test_image_patches_are_repeated_to_the_video_temporal_patch(example: ModuleType) -> None:
    """An image patch of one frame, repeated to two: the patch msd cuts with a temporal patch of
    two frames (Qwen2-VL's image processor repeats a still image so)."""
    rgb = np.random.default_rng(4).integers(0, 256, (56, 84, 3), dtype=np.uint8)
    one, two = (patchify(rgb, ImageGeometry(temporal_patch_size=t)) for t in (1, 2))
    repeated = example.image_patches(torch.from_numpy(one), VISION, 2)
    assert torch.equal(repeated, torch.from_numpy(two))


def test_the_vocabulary_holds_the_video_token(example: ModuleType) -> None:
    doc = video_recipe(Path("data"))
    recipe = from_json(json.dumps(doc).encode())
    assert example.vocab_size(recipe, None) == 258  # bytes, the image token, the video token
    assert example.videos_of(recipe) == recipe.video
    del doc["video"], doc["sources"][:2]
    assert example.videos_of(from_json(json.dumps(doc).encode())) is None
