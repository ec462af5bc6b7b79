"""The video mode: msd against per-rank DataLoaders decoding the same clips in every rank's workers.

    python -m benchmarks.dataloader --video [--quick] [--point S,R,W[,L[,ROWS]]] [--steps N] ...

The VLM mode's method (``vlm.py``) on S WebDataset sources of captioned H.264 clips
(``video_data.py``: a long-tailed length mix, most clips a few seconds, a tail to tens of
seconds; equal weights), every clip decoded once with PyAV by ``msd.sources.video`` under the
same ``video:`` rules (2 frames a second, at most ``MAX_FRAMES``, frames of at most ``MAX_PIXELS``
pixels: ``VIDEO``) by both systems:

* baseline (``video_baseline.py``): ``DataLoader(num_workers=W)`` per rank, every worker
  reading its share of every source's shards, decoding and fusing its own samples, packing its
  rank's micro-batch; no balancing;
* msd: the same shards as a recipe (``video_exts: [mp4]``, ``video:``, ``cost`` with the
  encoder's terms, ``balance.objective: sum``, ``long_samples: truncate``, ``--msd-loaders``
  loader processes per source) through ``msd launch``.

Both feed ``trainer.py``, whose cost for a batch is the backbone's ``attn·Σlen² + lin·Σlen``
plus the encoder's ``enc_attn·p²/t + enc_lin·p`` per video of ``p`` patches in ``t`` temporal
patches (``vlm_cost.py``, as msd's balance weighs a video); an average rank computes
``--target-step-ms`` a step. Per point: steps/s, data-wait p50/p99, peak data-plane PSS
(DataLoader workers, or msd's Planner, loaders and Constructor, plus the ranks' growth),
videos/s, data-plane CPU seconds per 100 videos, and on the baseline's batches the speed-up
perfect balancing allows. Writes ``dataloader-video.json`` / ``.md`` (``--quick``:
``dataloader-video-quick.*``) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.dataloader.config import Settings
from benchmarks.dataloader.cost import CostModel, seconds_per_cost
from benchmarks.dataloader.data import DATA_ROOT, ROOT
from benchmarks.dataloader.metrics import read_rank_logs, steps_by_rank
from benchmarks.dataloader.packing import patience_of
from benchmarks.dataloader.report import machine
from benchmarks.dataloader.sweep import msd_digest
from benchmarks.dataloader.video_baseline import VideoStreamConfig
from benchmarks.dataloader.video_data import VideoDataset, VideoDataSpec, VideoSource
from benchmarks.dataloader.vlm import TRAINER_MODULE, ratios, run_launcher, run_ranks, trainer_argv
from benchmarks.dataloader.vlm_cost import packed_mean_cost
from msd.recipe.schema import Video, Vision
from msd.sources.fuse import video_spec_of
from msd.sources.video import VideoHeader, plan_video

SYSTEMS = ("baseline", "msd")
STEPS, WARMUP, QUICK_STEPS = 24, 6, 12
TARGET_STEP_S = 2.0  # the data plane keeps up: what it costs, not how fast 2 cores decode
MAX_FRAMES, MAX_PIXELS = 64, 50176  # recipes/video.yaml's: 64 tokens a temporal patch at most
VISION = Vision()
VIDEO = Video(max_frames=MAX_FRAMES, min_pixels=3136, max_pixels=MAX_PIXELS)
VIDEO_COST = CostModel(attn=1.0, lin=256.0, enc_attn=1.0, enc_lin=256.0)


@dataclass(frozen=True)
class VideoPoint:
    sources: int
    ranks: int
    workers: int
    seq_len: int = 2048
    rows: int = 1

    @property
    def key(self) -> str:
        return f"video-S{self.sources}-R{self.ranks}-W{self.workers}-L{self.seq_len}x{self.rows}"

    @property
    def global_batch_tokens(self) -> int:
        return self.ranks * self.rows * self.seq_len

    def as_dict(self) -> dict[str, int]:
        return {
            "S": self.sources,
            "R": self.ranks,
            "W": self.workers,
            "seq_len": self.seq_len,
            "rows": self.rows,
        }


def video_points() -> list[VideoPoint]:
    return [VideoPoint(2, 4, 2)]


def quick_points() -> list[VideoPoint]:
    return [VideoPoint(2, 2, 1)]


def sample_units(
    source: VideoSource, vision: Vision, video: Video, seq_len: int, model: CostModel
) -> list[tuple[int, float]]:
    """(fused length, encoder cost) of every sample of ``source``, from its manifest: the clip's
    plan (`plan_video` on its declared frames, rate and size) and its caption; a clip whose
    placeholders do not fit ``seq_len`` is left out, as ``truncate`` leaves it out."""
    spec = video_spec_of(video, vision)
    units = []
    for clip, text in zip(source.clips, source.caption_tokens, strict=True):
        plan = plan_video(
            VideoHeader(clip.frames, clip.fps, 0.0, clip.height, clip.width, ""), spec
        )
        tokens = plan.tokens(spec.merge_size)
        if tokens > seq_len:
            units.append((min(seq_len, text), 0.0))
            continue
        cost = model.encoder([plan.patches], [plan.grid[0]])
        units.append((min(seq_len, tokens + text), cost))
    return units


def mean_rank_cost(
    dataset: VideoDataset, point: VideoPoint, settings: Settings, vision: Vision, video: Video
) -> float:
    units = [sample_units(s, vision, video, point.seq_len, settings.cost) for s in dataset.sources]
    patience = patience_of(point.ranks * point.rows)
    return packed_mean_cost(
        units, point.seq_len, point.rows, patience, settings.cost, seed=settings.seed
    )


def videos_per_s(log_dir: Path, warmup: int, elapsed_s: float) -> dict[str, float]:
    """Videos and their patches delivered per second in the warm window (all ranks)."""
    warm = steps_by_rank(read_rank_logs(log_dir))[warmup:]
    videos = sum(r.get("videos", 0) for step in warm for r in step)
    patches = sum(r.get("video_patches", 0) for step in warm for r in step)
    return {
        "videos_per_s": videos / elapsed_s,
        "video_patches_per_s": patches / elapsed_s,
        "videos_per_step": videos / max(1, len(warm)),
    }


def finish(result: dict[str, Any], log_dir: Path, warmup: int) -> dict[str, Any]:
    """Add videos/s and data-plane CPU seconds per 100 videos to ``measure``'s result."""
    result |= videos_per_s(log_dir, warmup, result["warm_elapsed_s"])
    result["cpu_s_per_100_videos"] = result["cpu_cores_busy"] / result["videos_per_s"] * 100
    return result


def stream_config(
    point: VideoPoint, dataset: VideoDataset, settings: Settings, vision: Vision, video: Video
) -> VideoStreamConfig:
    return VideoStreamConfig(
        shards=tuple(s.shards for s in dataset.sources),
        weights=dataset.weights,
        seq_len=point.seq_len,
        rows=point.rows,
        patience=patience_of(point.ranks * point.rows),
        vision=vision,
        video=video,
        seed=settings.seed,
        workers=point.workers,
        steps=settings.steps,
        sharing_strategy=settings.sharing_strategy,
    )


@dataclass(frozen=True)
class Setup:
    """What every run of a point shares: the data, the settings, the rules, msd's loaders."""

    dataset: VideoDataset
    settings: Settings
    vision: Vision
    video: Video
    msd_loaders: int
    seconds_per_cost: float
    msd_buffer_bytes: int | None = None  # loader.buffer_bytes (None: msd's default)


def run_baseline(point: VideoPoint, setup: Setup, run_dir: Path) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    s = setup.settings
    config = stream_config(point, setup.dataset, s, setup.vision, setup.video)
    config.save(run_dir / "stream.json")
    argv = [sys.executable, "-m", TRAINER_MODULE, "baseline-video"]
    argv += trainer_argv("baseline", run_dir / "ranks", s.cost, setup.seconds_per_cost)
    argv += ["--config", str(run_dir / "stream.json")]
    result = run_ranks(point, run_dir, argv, s)
    return result if "error" in result else finish(result, run_dir / "ranks", s.warmup)


def recipe_dict(point: VideoPoint, setup: Setup, command: str) -> dict[str, Any]:
    s, model = setup.settings, setup.settings.cost
    return {
        "name": f"dl-{point.key}",
        "seed": s.seed,
        "steps": s.steps,
        "seq_len": point.seq_len,
        "global_batch_tokens": point.global_batch_tokens,
        "micro_batch_size": point.rows,
        "distribute": {"dp": point.ranks},
        "vision": msgspec.to_builtins(setup.vision),
        "video": msgspec.to_builtins(setup.video),
        "sources": [
            {
                "name": source.name,
                "path": str(Path(source.folder) / "*.tar"),
                "format": "webdataset",
                "text_column": "txt",
                "video_exts": ["mp4"],
                "transform": {"kind": "bytes"},
                "weight": source.weight,
                "repeat": True,
                "loaders": setup.msd_loaders,
            }
            for source in setup.dataset.sources
        ],
        "cost": {
            "attn": model.attn,
            "lin": model.lin,
            "enc_attn": model.enc_attn,
            "enc_lin": model.enc_lin,
        },
        "balance": {"method": "greedy", "long_samples": "truncate", "objective": "sum"},
        "loader": {"buffer_bytes": setup.msd_buffer_bytes} if setup.msd_buffer_bytes else {},
        "trainer": {"command": command, "ranks": point.ranks},
    }


SUMMARY_KEYS = ("steps", "tokens", "truncated_samples", "left_out_by_source", "videos_by_source")


def run_msd(point: VideoPoint, setup: Setup, run_dir: Path) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir, s = run_dir / "ranks", setup.settings
    argv = trainer_argv("msd", log_dir, s.cost, setup.seconds_per_cost)
    command = " ".join(["python", "-m", TRAINER_MODULE, "msd", *argv])
    result, summary = run_launcher(recipe_dict(point, setup, command), run_dir, s)
    if "error" in result:
        return result
    return finish(result, log_dir, s.warmup) | {
        "msd_loaders_per_source": setup.msd_loaders,
        "msd_summary": {k: summary.get(k) for k in SUMMARY_KEYS},
    }


def run_point(point: VideoPoint, setup: Setup, systems: tuple[str, ...]) -> dict[str, Any]:
    d = setup.dataset
    entry: dict[str, Any] = {
        "key": point.key,
        "point": point.as_dict(),
        "data": {
            "spec": d.spec.__dict__,
            "bytes_on_disk": d.bytes_on_disk,
            "clips": sum(s.samples for s in d.sources),
            "video_s": d.video_s,
        },
        "video": msgspec.to_builtins(setup.video),
        "steps": setup.settings.steps,
        "warmup": setup.settings.warmup,
        "msd_loaders_per_source": setup.msd_loaders,
        "msd_buffer_bytes": setup.msd_buffer_bytes,
        "msd_source_digest": msd_digest(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds_per_cost": setup.seconds_per_cost,
    }
    run_dir = setup.settings.run_root / time.strftime("%Y%m%d-%H%M%S") / point.key
    for system in systems:
        print(f"[{point.key}] {system}: running", flush=True)
        load_before = os.getloadavg()[0]
        run = run_baseline if system == "baseline" else run_msd
        entry[system] = run(point, setup, run_dir / system)
        entry[system]["load_average_1m"] = [load_before, os.getloadavg()[0]]
        print(f"[{point.key}] {system}: {brief(entry[system])}", flush=True)
    return entry


def brief(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED: {result['error'][:400]}"
    return (
        f"{result['steps_per_s']:.3f} steps/s, {result['videos_per_s']:.1f} videos/s, "
        f"wait p50 {result['wait_p50_ms']:.1f} / p99 {result['wait_p99_ms']:.1f} ms, "
        f"data plane {result['data_plane_peak_mib']:.0f} MiB, "
        f"{result['cpu_s_per_100_videos']:.2f} CPU s/100 videos, "
        f"max/mean cost {result['cost_max_over_mean']:.3f}"
    )


# ----------------------------------------------------------------------------- the report

COLUMNS = (
    "point",
    "S",
    "R",
    "W",
    "seq_len × rows",
    "memory MiB base / msd",
    "mem ratio",
    "steps/s base / msd",
    "msd speed-up",
    "perfect-balance speed-up base (max/bound)",
    "wait p50 ms base / msd",
    "wait p99 ms base / msd",
    "videos/s base / msd",
    "CPU s / 100 videos base / msd",
    "CPU cores busy base / msd",
    "start-up s base / msd",
)

LEGEND = (
    "Memory: peak summed PSS of the data processes (DataLoader workers; or msd's Planner, "
    "loaders and Constructor) plus each rank's growth over its idle PSS; ratio = baseline / msd. "
    "Steps/s after the warm-up steps. A rank's simulated compute: attn·Σlen² + lin·Σlen over its "
    "sequences (padding included) + enc_attn·p²/t + enc_lin·p per video of p patches in t "
    "temporal patches. Perfect-balance speed-up on the baseline's own batches: Σ_steps max-rank "
    "cost / Σ_steps max(mean-rank cost, costliest sample). Wait: time a rank blocked getting its "
    "batch, all ranks' warm steps. CPU: the data processes' CPU seconds per second in the warm "
    "window, per 100 videos delivered. W applies to the baseline only; msd runs "
    "`loaders` processes per source. Weights: all sources equal."
)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def table_row(entry: dict[str, Any]) -> str:
    b = entry.get("baseline") if "steps_per_s" in (entry.get("baseline") or {}) else None
    m = entry.get("msd") if "steps_per_s" in (entry.get("msd") or {}) else None
    p, r = entry["point"], ratios(entry)

    def pair(key: str, digits: int = 2) -> str:
        got = [None if x is None else x.get(key) for x in (b, m)]
        return f"{_fmt(got[0], digits)} / {_fmt(got[1], digits)}"

    cells = [
        entry["key"],
        str(p["S"]),
        str(p["R"]),
        str(p["W"]),
        f"{p['seq_len']} × {p['rows']}",
        pair("data_plane_peak_mib", 0),
        _fmt(r["memory_ratio"], 1),
        pair("steps_per_s", 3),
        _fmt(r["speedup"], 3),
        _fmt(None if b is None else b.get("cost_max_over_bound"), 3),
        pair("wait_p50_ms", 1),
        pair("wait_p99_ms", 1),
        pair("videos_per_s", 1),
        pair("cpu_s_per_100_videos"),
        pair("cpu_cores_busy"),
        pair("startup_s", 0),
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(results: dict[str, Any]) -> str:
    m, s = results["machine"], results["settings"]
    lines = [
        "# msd vs per-rank DataLoaders: video sources",
        "",
        f"Machine: {m['platform']}, {m['cores']} cores, {m['memory_gib']} GiB; Python "
        f"{m['python']}, torch {m['torch']}, pyarrow {m['pyarrow']}; {m['date']}.",
        "",
        f"Runs: {s['steps']} steps ({s['warmup']} warm-up), an average rank computing "
        f"{s['target_step_s'] * 1000:.0f} ms a step; cost {s['cost']}; video {s['video']}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *[table_row(e) for e in results["points"]],
    ]
    failed = [
        (e["key"], name, e[name]["error"])
        for e in results["points"]
        for name in SYSTEMS
        if "error" in (e.get(name) or {})
    ]
    if failed:
        lines += ["", "Failed:", ""] + [f"- {k} {n}: {why[:300]}" for k, n, why in failed]
    data = [
        f"- {e['key']}: {e['data']['clips']} clips, {e['data']['video_s']:.0f} s of video, "
        f"{e['data']['bytes_on_disk'] / 2**20:.1f} MiB on disk; an average rank computing "
        f"{e.get('target_step_s', s['target_step_s']) * 1000:.0f} ms a step; msd loaders per "
        f"source {e['msd_loaders_per_source']}, loader.buffer_bytes "
        f"{e.get('msd_buffer_bytes') or 'default'}"
        for e in results["points"]
    ]
    lines += ["", "Data:", "", *data, "", LEGEND, ""]
    return "\n".join(lines)


def write(results: dict[str, Any], out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for entry in results["points"]:
        entry["ratios"] = ratios(entry)
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(results, indent=1))
    paths[1].write_text(markdown(results))
    return paths


# ----------------------------------------------------------------------------- the CLI


def parse_point(text: str) -> VideoPoint:
    numbers = [int(x) for x in text.split(",")]
    if len(numbers) not in (3, 4, 5) or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"a video point is S,R,W[,seq_len[,rows]], got {text!r}")
    return VideoPoint(*numbers)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.dataloader --video",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--video", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--point", type=parse_point, action="append", dest="points")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--target-step-ms", type=float, default=TARGET_STEP_S * 1000)
    parser.add_argument("--clips", type=int, default=VideoDataSpec.clips, help="per source")
    parser.add_argument("--clips-per-shard", type=int, default=VideoDataSpec.clips_per_shard)
    parser.add_argument("--median-s", type=float, default=VideoDataSpec.median_s)
    parser.add_argument("--max-s", type=float, default=VideoDataSpec.max_s)
    parser.add_argument("--max-pixels", type=int, default=MAX_PIXELS, help="per video frame")
    parser.add_argument("--msd-loaders", type=int, default=1, help="msd loaders per source")
    parser.add_argument("--buffer-bytes", type=int, help="msd's loader.buffer_bytes")
    parser.add_argument("--tag", default="", help="appended to each point's key")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--data-root", type=Path, default=DATA_ROOT)
    parser.add_argument("--report-only", action="store_true")
    return parser.parse_args(argv)


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings(
        steps=args.steps or (QUICK_STEPS if args.quick else STEPS),
        warmup=min(args.warmup, 3) if args.quick else args.warmup,
        target_step_s=args.target_step_ms / 1000,
        cost=VIDEO_COST,
        timeout_s=args.timeout_s,
    )


def main(argv: list[str] | None = None) -> None:
    from benchmarks.dataloader.video_data import ensure_video_data

    args = parse_args(argv)
    stem = "dataloader-video-quick" if args.quick else "dataloader-video"
    path = args.out / f"{stem}.json"
    if args.report_only:
        print("wrote " + ", ".join(map(str, write(json.loads(path.read_text()), args.out, stem))))
        return
    settings = settings_of(args)
    video = msgspec.structs.replace(VIDEO, max_pixels=args.max_pixels)
    results: dict[str, Any] = {
        "machine": machine(),
        "settings": {
            "steps": settings.steps,
            "warmup": settings.warmup,
            "target_step_s": settings.target_step_s,
            "cost": VIDEO_COST.__dict__,
            "video": msgspec.to_builtins(video),
            "seed": settings.seed,
            "weights": "equal (1.0 per source)",
        },
        "points": [],
    }
    if not args.quick and path.exists():
        results["points"] = json.loads(path.read_text()).get("points", [])
    for point in args.points or (quick_points() if args.quick else video_points()):
        spec = VideoDataSpec(
            point.sources, args.clips, args.clips_per_shard, args.median_s, args.max_s
        )
        dataset = ensure_video_data(spec, args.data_root)
        cost = mean_rank_cost(dataset, point, settings, VISION, video)
        spc = seconds_per_cost(settings.target_step_s, cost)
        setup = Setup(dataset, settings, VISION, video, args.msd_loaders, spc, args.buffer_bytes)
        entry = run_point(point, setup, tuple(args.systems))
        entry["mean_rank_cost"] = cost
        entry["target_step_s"] = settings.target_step_s
        if args.tag:
            entry["key"] += f"-{args.tag}"
        results["points"] = [e for e in results["points"] if e["key"] != entry["key"]] + [entry]
        write(results, args.out, stem)
    print("wrote " + ", ".join(map(str, write(results, args.out, stem))))
    print(path.with_suffix(".md").read_text())
