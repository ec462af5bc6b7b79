"""Video decode throughput in a real loader: seconds of video decoded per loader CPU-second, against
one plain process decoding the same files with PyAV in the same run, at 360p, 720p and 1080p.

    python -m benchmarks.video_decode [--resolutions 360p 720p 1080p] [--clips N] [--seconds 6]
        [--repeats 2] [--out benchmarks/results]

Data (per resolution, written once under ``benchmarks/runs/video-decode-data`` and reused):
WebDataset shards of ``--clips`` H.264 MP4 clips of ``--seconds`` s at 30 fps (moving
gradients, encoded here with PyAV's libx264; ``DISTINCT`` encodings cycled), each with a
``<video>`` caption. Per resolution and repeat, two processes read the same shards:

- plain PyAV (``plain``, a process of its own): each clip opened with PyAV, one decode
  thread, every frame decoded up to the last sampled one, the sampled frames (Qwen2-VL's rule,
  `msd.sources.video.plan_video`) converted to RGB (``to_ndarray(format="rgb24")``, on one
  thread as the decode) and resized with Pillow's bicubic filter to the processor's size: the
  work of a loader's decode, written plainly; its CPU time is ``time.process_time()`` over its
  loop, reading the shards included;
- msd (``video_decode_job.py``): a job whose only source is the shards (``trainer: {command:
  demo}``, one loader process), the Qwen2-VL video defaults; the loader's CPU time is what its
  own ``Stats`` report (``msd status``: the loader's ``cpu_seconds`` and the source's
  ``video_s``, from the same message), from its first decoded videos to its last, so its
  start-up is left out as the plain process's is; beside it, the loader's decode accounting
  (``videos_by_source``: the CPU time of its probe + decode calls alone).

Reported per resolution (the best of ``--repeats`` of each): video-s per CPU-s of each, and
msd's over plain's (the target: ≥ 0.8).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
from PIL import Image

from msd.sources.video import VideoHeader, VideoSpec, plan_video

ROOT = Path(__file__).resolve().parents[1]
DATA_ROOT = ROOT / "benchmarks" / "runs" / "video-decode-data"
RUN_ROOT = ROOT / "benchmarks" / "runs" / "video-decode"
RESOLUTIONS = {"360p": (360, 640), "720p": (720, 1280), "1080p": (1080, 1920)}
CLIPS = {"360p": 48, "720p": 16, "1080p": 8}  # about 5 CPU-s of decoding each, here
FPS = 30
DISTINCT = 4  # encodings per resolution, cycled through the clips
SHARD_CLIPS = 4
TARGET_RATIO = 0.8


def clip(
    height: int,
    width: int,
    seconds: float,
    fps: int = FPS,
    phase: int = 0,
    preset: str | None = None,
) -> bytes:
    """An H.264 MP4 of moving gradients (``phase`` shifts them: another clip of the same kind;
    ``preset``: libx264's, None for its default)."""
    frames = max(1, round(seconds * fps))
    y = np.linspace(0, 255, height, dtype=np.float32).astype(np.uint8)[:, None]
    x = np.linspace(0, 255, width, dtype=np.float32).astype(np.uint8)[None, :]
    rgb = np.empty((height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if preset is not None:
            stream.codec_context.options = {"preset": preset}
        for n in range(frames):
            i = n + 37 * phase
            rgb[..., 0] = x + np.uint8(3 * i % 256)  # uint8 wraps: (x + 3i) mod 256
            rgb[..., 1] = y + np.uint8(2 * i % 256)
            rgb[..., 2] = 7 * i % 256
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


# ----------------------------------------------------------------------------- the data


@dataclass(frozen=True)
class ClipSet:
    """One resolution's shards: ``clips`` clips of ``seconds`` s, ``DISTINCT`` encodings."""

    name: str
    height: int
    width: int
    clips: int
    seconds: float
    fps: int = FPS

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.clips}x{self.seconds:g}s-{self.fps}fps-d{DISTINCT}"

    @property
    def video_s(self) -> float:
        return self.clips * max(1, round(self.seconds * self.fps)) / self.fps


def ensure_clips(clips: ClipSet, root: Path = DATA_ROOT) -> list[Path]:
    """The shards of ``clips`` under ``root``, written unless a matching manifest is there."""
    folder = root / clips.folder_name
    manifest = folder / "manifest.json"
    if manifest.exists() and json.loads(manifest.read_text()) == asdict(clips):
        return sorted(folder.glob("*.tar"))
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.tar"):
        old.unlink()
    h, w = clips.height, clips.width
    encoded = [clip(h, w, clips.seconds, clips.fps, k) for k in range(DISTINCT)]
    for shard in range(-(-clips.clips // SHARD_CLIPS)):
        with tarfile.open(folder / f"shard-{shard:05d}.tar", "w") as tar:
            for i in range(shard * SHARD_CLIPS, min(clips.clips, (shard + 1) * SHARD_CLIPS)):
                _add(tar, f"{i:06d}.mp4", encoded[i % DISTINCT])
                _add(tar, f"{i:06d}.txt", f"<video> clip {i}".encode())
    manifest.write_text(json.dumps(asdict(clips)))
    return sorted(folder.glob("*.tar"))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def clip_members(paths: list[Path]) -> list[bytes]:
    """Every ``.mp4`` member of the shards, in order."""
    found = []
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                handle = tar.extractfile(member) if member.name.endswith(".mp4") else None
                if handle is not None:
                    found.append(handle.read())
    return found


# ----------------------------------------------------------------------------- plain PyAV


def plain_decode(data: bytes, spec: VideoSpec) -> tuple[float, list[np.ndarray]]:
    """A video's seconds and its sampled frames, RGB, resized: a loader's decode written
    plainly with PyAV (the frames `plan_video` samples, the size it gives)."""
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = spec.threads
        ctx = stream.codec_context
        header = VideoHeader(
            int(stream.frames), float(stream.average_rate or FPS), 0.0, ctx.height, ctx.width, ""
        )
        plan = plan_video(header, spec)
        (h, w), wanted = plan.size, set(plan.indices)
        frames = []
        for ordinal, frame in enumerate(container.decode(stream)):
            if ordinal in wanted:
                still = Image.fromarray(frame.to_ndarray(format="rgb24", threads=spec.threads))
                frames.append(np.asarray(still.resize((w, h), Image.Resampling.BICUBIC)))
            if ordinal >= plan.indices[-1]:
                break
    return header.frames / header.fps, frames


def plain_run(paths: list[Path], spec: VideoSpec) -> dict[str, float]:
    """Every clip of the shards through `plain_decode`: clips, seconds of video, CPU seconds
    (reading the shards included)."""
    started = time.process_time()
    clips, video_s = 0, 0.0
    for data in clip_members(paths):
        video_s += plain_decode(data, spec)[0]
        clips += 1
    return {"clips": clips, "video_s": video_s, "cpu_s": time.process_time() - started}


def plain_process(paths: list[Path]) -> dict[str, float]:
    """`plain_run` in a process of its own (as a loader is), the defaults of ``VideoSpec``."""
    argv = [sys.executable, "-m", "benchmarks.video_decode", "--plain", *map(str, paths)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout)
    return result


# ----------------------------------------------------------------------------- the run


def rate(video_s: float, cpu_s: float) -> float:
    return video_s / cpu_s if cpu_s > 0 else float("nan")


def measure(clips: ClipSet, repeats: int, data_root: Path, run_root: Path) -> dict[str, Any]:
    """Plain PyAV and an msd job on ``clips``, ``repeats`` times each, alternating."""
    from benchmarks.video_decode_job import run_job

    paths = ensure_clips(clips, data_root)
    load_before = os.getloadavg()[0]
    plain, msd = [], []
    for k in range(repeats):
        plain.append(plain_process(paths))
        print(f"[{clips.name}] plain: {rate(plain[-1]['video_s'], plain[-1]['cpu_s']):.1f}")
        msd.append(run_job(paths, run_root / clips.name / f"repeat-{k}"))
        print(f"[{clips.name}] msd: {msd[-1]}", flush=True)
    return summarize(clips, plain, msd) | {"load_average_1m": [load_before, os.getloadavg()[0]]}


def summarize(
    clips: ClipSet, plain: list[dict[str, float]], msd: list[dict[str, Any]]
) -> dict[str, Any]:
    """The best rate of each way over the repeats, and msd's over plain's."""
    plain_rate = max(rate(p["video_s"], p["cpu_s"]) for p in plain)  # nan-free: cpu_s > 0
    loader_rate = max(m["loader_video_s_per_cpu_s"] for m in msd)
    decode_rate = max(m["decode_video_s_per_cpu_s"] for m in msd)
    return {
        "clips": asdict(clips),
        "plain_video_s_per_cpu_s": plain_rate,
        "msd_loader_video_s_per_cpu_s": loader_rate,
        "msd_decode_video_s_per_cpu_s": decode_rate,
        "loader_over_plain": loader_rate / plain_rate,
        "decode_over_plain": decode_rate / plain_rate,
        "plain_runs": plain,
        "msd_runs": msd,
    }


def table(points: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| resolution | clips × s | plain PyAV process | msd loader process | msd / plain "
        "| msd's decode calls | decode calls / plain |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, p in points.items():
        c = p["clips"]
        lines.append(
            f"| {name} | {c['clips']} × {c['seconds']:g} | {p['plain_video_s_per_cpu_s']:.1f} | "
            f"{p['msd_loader_video_s_per_cpu_s']:.1f} | {p['loader_over_plain']:.2f} | "
            f"{p['msd_decode_video_s_per_cpu_s']:.1f} | {p['decode_over_plain']:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.video_decode",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--resolutions", nargs="+", choices=RESOLUTIONS, default=list(RESOLUTIONS))
    parser.add_argument("--clips", type=int, help="clips per resolution (default: CLIPS)")
    parser.add_argument("--seconds", type=float, default=6.0, help="per clip")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--data-root", type=Path, default=DATA_ROOT)
    parser.add_argument("--plain", nargs="+", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.plain:  # the plain process itself
        print(json.dumps(plain_run(args.plain, VideoSpec())))
        return
    from benchmarks.dataloader.sweep import msd_digest

    run_root = RUN_ROOT / time.strftime("%Y%m%d-%H%M%S")
    points = {}
    for name in args.resolutions:
        h, w = RESOLUTIONS[name]
        clips = ClipSet(name, h, w, args.clips or CLIPS[name], args.seconds)
        points[name] = measure(clips, args.repeats, args.data_root, run_root)
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cores": os.cpu_count(),
        "msd_source_digest": msd_digest(),
        "fps": FPS,
        "repeats": args.repeats,
        "target": TARGET_RATIO,
        "points": points,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "video_decode.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(points))


if __name__ == "__main__":
    main()
