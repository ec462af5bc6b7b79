"""Hybrid balance quality: how slow the slowest rank is when a VLM's encoder cost is weighed.

    python -m benchmarks.hybrid_balance [--mix image|video] [--steps 40] [--enc-attn A]
        [--enc-lin L]

A long-tailed image-text mixture: 50 % captioned images (caption ~30 tokens, one image), 20 %
interleaved documents (~600 tokens, 1-5 images), 30 % text only (the `msd synth` demo lengths).
``--mix video`` makes a quarter of the samples captioned videos instead (caption ~40 tokens;
durations log-normal around 8 s, 1 s to 10 min, at 24-30 fps, 360p to 1080p), sampled and
patched by the recipe's default ``video:`` rules with a ``total_pixels`` cap of 8,192 tokens a
video (``msd.sources.video.plan_video``); a video's patches attend within each of its temporal
patches, so its encoder term is ``enc_attn·p²/t + enc_lin·p``.
Image sizes are `msd synth --kind vlm`'s (log-logistic long side 32-2,048 px, aspect ratios
1:4 to 4:1), resized and cut into 14-px patches by Qwen2-VL's rule (``msd.sources.vision``);
an image takes patches/4 placeholder tokens in the fused sequence. Each global batch fills 95 %
of DP ranks × 2 rows of 16,384 tokens.

Every sample costs its backbone term (``len² + 256·len`` over the fused length) plus its
encoder term (per image ``enc_attn·p² + enc_lin·p`` over its ``p`` patches; the defaults model a
2B-parameter ViT beside a 12B backbone: a sixth of the per-position work, on 4× as many
positions as there are placeholder tokens). Three splits of the same batches are judged by that
sum: ``none`` (in order, what per-rank loaders give), ``backbone`` (``greedy`` weighing the
backbone term only: text-only balancing) and ``sum`` (what the Planner does: ``greedy``
weighing both, or the backbone-only split when that one is faster). Reported: Σ
over steps of the slowest rank's cost, against the lower bound Σ max(mean rank cost, largest
sample), and the implied speed-ups of ``sum`` over the other two.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.quickstart import machine
from msd.plan.balance import hybrid_placement, lower_bound, placement
from msd.plan.cost import CostModel
from msd.plan.hybrid_cost import HybridCost
from msd.plan.placement import Shape, rank_loads
from msd.sources.video import VideoHeader, VideoSpec, plan_video
from msd.sources.vision import grid_thw
from msd.synth.text import DEFAULT_SOURCES, sample_lengths
from msd.synth.vlm import image_specs

ROOT = Path(__file__).resolve().parents[1]
SEQ_LEN = 16_384
ROWS_PER_RANK = 2
FILL = 0.95
KINDS = ("caption", "interleaved", "text", "video")
MIXES = {"image": (0.5, 0.2, 0.3, 0.0), "video": (0.35, 0.1, 0.3, 0.25)}
VIDEO = VideoSpec(total_pixels=8192 * 28 * 28)
SIZES = ((360, 640), (480, 854), (720, 1280), (1080, 1920))
ENC_ATTN = 0.4  # a ViT-2B's attention per patch pair, in the backbone's units
ENC_LIN = 256.0 / 6  # its dense work per patch: a sixth of the 12B backbone's per token


Item = tuple[int, int]  # (patches, temporal patches) of one image or video


def draw_video(rng: np.random.Generator) -> Item:
    """One video's patches and temporal patches, planned from a header as the loaders plan."""
    duration = float(np.clip(rng.lognormal(np.log(8.0), 1.0), 1.0, 600.0))
    fps = float(rng.choice((24.0, 25.0, 30.0)))
    height, width = SIZES[int(rng.integers(len(SIZES)))]
    header = VideoHeader(round(duration * fps), fps, duration, height, width, "h264")
    plan = plan_video(header, VIDEO)
    return plan.patches, plan.grid[0]


def draw_sample(
    rng: np.random.Generator, text_pool: np.ndarray, shares: tuple[float, ...]
) -> tuple[int, list[Item]]:
    """(text tokens, (patches, temporal patches) per image or video) of one sample."""
    kind = KINDS[rng.choice(len(KINDS), p=shares)]
    if kind == "text":
        return int(min(SEQ_LEN, rng.choice(text_pool))), []
    if kind == "video":
        return int(np.clip(rng.lognormal(np.log(40), 0.6), 4, 1024)), [draw_video(rng)]
    images = 1 if kind == "caption" else int(rng.integers(1, 6))
    median = 30 if kind == "caption" else 600
    text = int(np.clip(rng.lognormal(np.log(median), 0.6), 4, SEQ_LEN // 2))
    items = []
    for spec in image_specs(rng, images):
        t, gh, gw = grid_thw(spec.height, spec.width)
        items.append((t * gh * gw, t))
    return text, items


def draw_step(
    rng: np.random.Generator, text_pool: np.ndarray, dp: int, shares: tuple[float, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A global batch: fused lengths, and each image's or video's patches, temporal patches
    and sample."""
    budget = FILL * dp * ROWS_PER_RANK * SEQ_LEN
    lengths: list[int] = []
    items: list[Item] = []
    owner: list[int] = []
    while True:
        text, own = draw_sample(rng, text_pool, shares)
        fused = text + sum(p // 4 for p, _ in own)
        if fused > SEQ_LEN:
            continue  # long_samples' business; not what is measured here
        if sum(lengths) + fused > budget:
            break
        owner += [len(lengths)] * len(own)
        items += own
        lengths.append(fused)
    patches = np.array([p for p, _ in items], dtype=np.int64)
    frames = np.array([t for _, t in items], dtype=np.int64)
    return np.array(lengths), patches, frames, np.array(owner, dtype=np.int64)


def split(lengths: np.ndarray, weigh: np.ndarray, dp: int, method: str) -> np.ndarray:
    return placement(lengths, weigh, dp, 1, ROWS_PER_RANK, SEQ_LEN, method)  # type: ignore[arg-type]


def run(dp: int, steps: int, model: HybridCost, seed: int, mix: str = "image") -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    shares = MIXES[mix]
    text_pool = np.concatenate([sample_lengths(s) for s in DEFAULT_SOURCES])
    totals = {"none": 0.0, "backbone": 0.0, "sum": 0.0, "bound": 0.0}
    leftover = {"none": 0, "backbone": 0, "sum": 0}
    encoder_share = []
    shape = Shape(dp, 1, ROWS_PER_RANK, SEQ_LEN)
    for _ in range(steps):
        lengths, patches, frames, owner = draw_step(rng, text_pool, dp, shares)
        backbone = model.costs(lengths, patches, owner, "backbone")
        total = backbone + model.encoder(patches, owner, len(lengths), frames)
        encoder_share.append(1 - backbone.sum() / total.sum())
        chosen = {
            "none": split(lengths, total, dp, "none"),
            "backbone": split(lengths, backbone, dp, "greedy"),
            # what the Planner does under ``objective: sum``
            "sum": hybrid_placement(
                lengths, backbone, total - backbone, dp, 1, ROWS_PER_RANK, SEQ_LEN, "greedy"
            ),
        }
        for name, row_of in chosen.items():
            totals[name] += float(rank_loads(shape, row_of, total).max())
            leftover[name] += int(np.count_nonzero(row_of < 0))
        totals["bound"] += lower_bound(total, dp)
    return {
        "mix": mix,
        "dp": dp,
        "steps": steps,
        "encoder_share": float(np.mean(encoder_share)),
        "slowest_rank_cost": totals,
        "leftover_samples": leftover,
        "sum_over_bound": totals["sum"] / totals["bound"],
        "speedup_over_none": totals["none"] / totals["sum"],
        "speedup_over_backbone": totals["backbone"] / totals["sum"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mix", choices=sorted(MIXES), default="image")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--dp", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--enc-attn", type=float, default=ENC_ATTN)
    parser.add_argument("--enc-lin", type=float, default=ENC_LIN)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    model = HybridCost(CostModel(), args.enc_attn, args.enc_lin)
    results = [run(dp, args.steps, model, args.seed, args.mix) for dp in args.dp]
    print("| DP | encoder share | none | backbone | sum | sum / bound | vs none | vs backbone |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        c = r["slowest_rank_cost"]
        print(
            f"| {r['dp']} | {r['encoder_share']:.0%} | {c['none'] / c['bound']:.3f} | "
            f"{c['backbone'] / c['bound']:.3f} | {c['sum'] / c['bound']:.3f} | "
            f"{r['sum_over_bound']:.3f} | {r['speedup_over_none']:.2f}× | "
            f"{r['speedup_over_backbone']:.2f}× |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / (
        "hybrid_balance.json" if args.mix == "image" else "hybrid_balance_video.json"
    )
    settings = {"enc_attn": args.enc_attn, "enc_lin": args.enc_lin, "seed": args.seed}
    path.write_text(
        json.dumps({"machine": machine(), "settings": settings, "points": results}, indent=2) + "\n"
    )
    print(f"written: {path}  (none/backbone/sum columns: Σ slowest rank ÷ Σ bound)")


if __name__ == "__main__":
    main()
