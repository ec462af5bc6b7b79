"""Video decode cost: seconds of video per CPU-second of `msd.sources.video.decode` (probe,
sample at ``fps``, resize, patchify), against one process decoding the same files with PyAV,
in the same run, at 360p, 720p and 1080p.

    python -m benchmarks.video_decode [--seconds 6] [--repeats 3] [--out benchmarks/results]

Data: for each resolution, one H.264 MP4 of ``--seconds`` seconds at 30 fps (moving gradients,
encoded here with PyAV's libx264). Each way runs ``--repeats`` times over the same bytes in
memory, one decode thread, and the best CPU time (``time.process_time()``) is kept:

- ``pyav_decode``: every frame decoded, nothing converted (what any reader of the stream pays);
- ``pyav_rgb``: every frame decoded and converted to RGB (``to_ndarray(format="rgb24")``: what
  Hugging Face's PyAV reader hands its video processor, before sampling);
- ``msd``: `msd.sources.video.decode` with the Qwen2-VL video defaults (2 frames a second,
  ``min_pixels`` 100,352, ``max_pixels`` 602,112).

Reported per resolution: seconds of video per CPU-second of each, msd's over each reference,
and msd's core-seconds per second of video (the decode cost a loader pays).
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np

from msd.sources.video import DecodedVideo, VideoSpec, decode

RESOLUTIONS = {"360p": (360, 640), "720p": (720, 1280), "1080p": (1080, 1920)}
FPS = 30


def clip(height: int, width: int, seconds: float, fps: int = FPS) -> bytes:
    """An H.264 MP4 of moving gradients."""
    frames = max(1, round(seconds * fps))
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            rgb = np.concatenate(
                [
                    (x + 3 * i) % 256 + 0 * y,
                    (y + 2 * i) % 256 + 0 * x,
                    np.full_like(x + y, (7 * i) % 256),
                ],
                axis=2,
            )
            frame = av.VideoFrame.from_ndarray(rgb.astype(np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def pyav_decode(data: bytes, rgb: bool) -> int:
    """Decode every frame (and convert it to RGB); the frames decoded."""
    n = 0
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        for frame in container.decode(stream):
            if rgb:
                frame.to_ndarray(format="rgb24")
            n += 1
    return n


def cpu_s(work: Callable[[], object], repeats: int) -> float:
    """The least CPU time of ``repeats`` runs of ``work``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def measure(data: bytes, seconds: float, spec: VideoSpec, repeats: int) -> dict[str, float]:
    """Seconds of video per CPU-second of each way, and msd's ratios and cost."""
    video = decode(data, spec)
    if not isinstance(video, DecodedVideo):
        raise RuntimeError(f"the benchmark's own clip did not decode: {video.reason}")
    cpu = {
        "pyav_decode": cpu_s(lambda: pyav_decode(data, rgb=False), repeats),
        "pyav_rgb": cpu_s(lambda: pyav_decode(data, rgb=True), repeats),
        "msd": cpu_s(lambda: decode(data, spec), repeats),
    }
    out = {f"{k}_video_s_per_cpu_s": seconds / max(v, 1e-9) for k, v in cpu.items()}
    out["msd_vs_pyav_decode"] = cpu["pyav_decode"] / max(cpu["msd"], 1e-9)
    out["msd_vs_pyav_rgb"] = cpu["pyav_rgb"] / max(cpu["msd"], 1e-9)
    out["msd_core_s_per_video_s"] = cpu["msd"] / seconds
    out["grid_t"], out["grid_h"], out["grid_w"] = (float(g) for g in video.grid)
    return out


def run(seconds: float, repeats: int, resolutions: dict[str, tuple[int, int]]) -> dict[str, object]:
    spec = VideoSpec()
    points = {}
    for name, (h, w) in resolutions.items():
        points[name] = measure(clip(h, w, seconds), seconds, spec, repeats)
    return {"seconds": seconds, "fps": FPS, "repeats": repeats, "points": points}


def table(result: dict[str, object]) -> str:
    points = result["points"]
    assert isinstance(points, dict)
    lines = [
        "| resolution | PyAV decode | PyAV decode + RGB | msd | msd / decode | msd / decode + RGB "
        "| msd core-s per video-s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, p in points.items():
        lines.append(
            f"| {name} | {p['pyav_decode_video_s_per_cpu_s']:.1f} | "
            f"{p['pyav_rgb_video_s_per_cpu_s']:.1f} | {p['msd_video_s_per_cpu_s']:.1f} | "
            f"{p['msd_vs_pyav_decode']:.2f} | {p['msd_vs_pyav_rgb']:.2f} | "
            f"{p['msd_core_s_per_video_s']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    result = run(args.seconds, args.repeats, RESOLUTIONS)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "video_decode.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
