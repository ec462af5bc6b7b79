"""What cutting a long video into clips costs a loader: each clip decoded from the keyframe
before it (`msd.sources.video.decode` with a clip's window) against decoding from the video's
first frame up to the clip's end (what a reader without the container's index pays), in the
same run, on the same bytes.

    python -m benchmarks.video_clips [--seconds 120] [--clip-s 8] [--keyframe-s 2] [--out DIR]

Data: one H.264 MP4 of ``--seconds`` seconds of 720p at 30 fps with a keyframe every
``--keyframe-s`` seconds (moving gradients, encoded here with PyAV's libx264), cut into clips
of ``--clip-s`` seconds back to back (``clip: {length_s: clip_s}``), each sampled at Qwen2-VL's
2 frames a second. One decode thread; CPU time is ``time.process_time()``.

Reported: CPU-seconds to decode every clip both ways, their ratio, and each way's seconds of
video per CPU-second.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import av
import numpy as np
from PIL import Image

from msd.sources.clips import ClipRule, clip_count, clip_window
from msd.sources.video import (
    DecodedVideo,
    VideoHeader,
    VideoSpec,
    Window,
    decode,
    plan_video,
    probe,
)

SPEC = VideoSpec()
FPS = 30


def long_video(seconds: float, keyframe_s: float, height: int = 720, width: int = 1280) -> bytes:
    """An H.264 MP4 of moving gradients with a keyframe every ``keyframe_s`` seconds."""
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = max(1, round(keyframe_s * FPS))
        for i in range(round(seconds * FPS)):
            rgb = np.concatenate(
                [
                    (x + 3 * i) % 256 + 0 * y,
                    (y + 2 * i) % 256 + 0 * x,
                    np.full_like(x + y, i % 256),
                ],
                axis=2,
            )
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb.astype(np.uint8))):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def from_start(data: bytes, header: VideoHeader, window: Window) -> int:
    """A clip's sampled frames decoded from the first frame, resized as msd resizes them."""
    plan = plan_video(header, SPEC, window)
    wanted, (h, w), kept = set(plan.indices), plan.size, 0
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        for ordinal, frame in enumerate(container.decode(stream)):
            if ordinal in wanted:
                still = Image.fromarray(frame.to_ndarray(format="rgb24"))
                still.resize((w, h), Image.Resampling.BICUBIC)
                kept += 1
            if ordinal >= plan.indices[-1]:
                break
    return kept


def run(
    seconds: float, clip_s: float, keyframe_s: float, size: tuple[int, int] = (720, 1280)
) -> dict[str, float]:
    data = long_video(seconds, keyframe_s, *size)
    header = probe(data, SPEC)
    assert isinstance(header, VideoHeader)
    rule = ClipRule(clip_s, clip_s)
    windows = [clip_window(header, rule, k) for k in range(clip_count(header, rule))]
    started = time.process_time()
    for window in windows:
        assert isinstance(decode(data, SPEC, header, window), DecodedVideo)
    seeking_s = time.process_time() - started
    started = time.process_time()
    for window in windows:
        assert from_start(data, header, window) == len(plan_video(header, SPEC, window).indices)
    start_s = time.process_time() - started
    covered_s = sum(w.end - w.first for w in windows) / header.fps
    return {
        "video_s": seconds,
        "clip_s": clip_s,
        "keyframe_s": keyframe_s,
        "clips": len(windows),
        "seeking_cpu_s": round(seeking_s, 3),
        "from_start_cpu_s": round(start_s, 3),
        "from_start_over_seeking": round(start_s / seeking_s, 2),
        "seeking_video_s_per_cpu_s": round(covered_s / seeking_s, 2),
        "from_start_video_s_per_cpu_s": round(covered_s / start_s, 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--clip-s", type=float, default=8.0)
    parser.add_argument("--keyframe-s", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    result = run(args.seconds, args.clip_s, args.keyframe_s)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "video_clips.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
