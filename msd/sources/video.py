"""Videos from bytes to Qwen2-VL patches, as uint8, without torch (pure: bytes in, arrays out).

A video is planned from its header and decoded later: `probe` reads the container's header and
packet index (duration, frame rate, frame count, size) without decoding a frame, and
`plan_video` turns that into the frames to sample and the patch grid, so the Planner can know a
video's patch count before any pixel is decoded. `decode` then decodes the stream once with
PyAV, keeps only the sampled frames, resizes each as it arrives and writes it straight into the
video's patch array: a decoded video is never held whole. A `Window` (a clip of the video)
samples only its own frames; when it starts past the first frame the decode seeks to the
keyframe before it by the container's index and decodes from there.

The conventions are those of Hugging Face's Qwen2-VL video processor: frames sampled uniformly
at ``fps`` per second of the stream (between ``min_frames`` and ``max_frames``, a multiple of
``temporal_patch_size``), each frame resized by Qwen2-VL's rule (`msd.sources.vision.fit`)
within ``min_pixels`` .. ``max_pixels`` (further capped by an even share of ``total_pixels``,
as qwen-vl-utils does), the last frame repeated to fill a temporal patch, and patches of
``3 × temporal_patch_size × patch_size²`` values in the processor's order. As in Hugging Face's
PyAV reader, frames are taken as stored: display-rotation metadata is not applied.

The bytes are untrusted: every failure (not a container, no video stream, a truncated or
corrupt stream, an unknown codec, zero frames, absurd sizes or durations) comes back as a
`DecodeFailure` value, never an exception. The same bytes always give the same pixels.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from msd.sources.vision import DecodeFailure, ImageGeometry, fit

log = logging.getLogger(__name__)

Pixels = npt.NDArray[np.uint8]
MAX_ASPECT_RATIO = 200
_T = TypeVar("_T")


@dataclass(frozen=True)
class VideoSpec:
    """How a video becomes patches; the defaults are Qwen2-VL's video processor's.

    ``min_pixels`` / ``max_pixels`` bound one resized frame's area; ``total_pixels`` (None: no
    cap) bounds the whole video's, by capping each frame at ``total_pixels × temporal_patch_size
    / frames`` (never under ``1.05 × min_pixels``). ``max_frame_pixels``, ``max_duration_s`` and
    ``max_stream_frames`` refuse what a header declares before anything is decoded, as does
    ``max_decode_pixels``: the pixels the decode would pass through (every frame up to the last
    sampled one, sampled or not), which bounds a decode's work by the header alone.
    ``threads``: FFmpeg decode threads per video (0: FFmpeg's choice).
    """

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 768 * 28 * 28
    total_pixels: int | None = None
    max_frame_pixels: int = 1 << 26
    max_duration_s: float = 24 * 3600.0
    max_stream_frames: int = 10_000_000
    max_decode_pixels: int = 1 << 36  # about 18 minutes of 1080p at 30 fps
    threads: int = 1

    def __post_init__(self) -> None:
        if not self.fps > 0:
            raise ValueError(f"VideoSpec.fps must be positive, got {self.fps}")
        for name in ("min_frames", "max_frames", "patch_size", "merge_size", "temporal_patch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"VideoSpec.{name} must be at least 1, got {getattr(self, name)}")
        if self.min_frames > self.max_frames:
            raise ValueError(
                "VideoSpec needs min_frames <= max_frames, "
                f"got {self.min_frames} > {self.max_frames}"
            )
        if self.max_decode_pixels < 1:
            raise ValueError(
                f"VideoSpec.max_decode_pixels must be at least 1, got {self.max_decode_pixels}"
            )
        if self.threads < 0:
            raise ValueError(f"VideoSpec.threads must be 0 or more, got {self.threads}")
        # The frame geometry checks its own bounds.
        self.frame_geometry(self.max_pixels)

    @property
    def patch_values(self) -> int:
        """The length of one flattened patch: channels × temporal_patch_size × patch_size²."""
        return 3 * self.temporal_patch_size * self.patch_size**2

    def frame_geometry(self, max_pixels: int) -> ImageGeometry:
        """One frame's resize rule with this per-frame area cap."""
        return ImageGeometry(
            patch_size=self.patch_size,
            merge_size=self.merge_size,
            min_pixels=self.min_pixels,
            max_pixels=max_pixels,
            temporal_patch_size=self.temporal_patch_size,
            max_source_pixels=self.max_frame_pixels,
        )


DEFAULT_SPEC = VideoSpec()


@dataclass(frozen=True)
class VideoHeader:
    """What a container declares of its first video stream, read without decoding."""

    frames: int
    fps: float  # frames per second of the stream (its average rate)
    duration_s: float
    height: int
    width: int
    codec: str


@dataclass(frozen=True)
class Window:
    """Frames ``first`` up to ``end`` (exclusive) of a stream, in display order: the part of a
    video one clip samples."""

    first: int
    end: int


@dataclass(frozen=True)
class VideoPlan:
    """Which stream frames a video samples and the patches they make: ``indices`` (ascending,
    into the stream's decoded frames), ``size`` each frame's resized (height, width), ``grid``
    (temporal patches, patch rows, patch columns)."""

    indices: tuple[int, ...]
    size: tuple[int, int]
    grid: tuple[int, int, int]

    @property
    def patches(self) -> int:
        t, h, w = self.grid
        return t * h * w

    def tokens(self, merge_size: int) -> int:
        """Placeholder tokens the video takes in the text: one per merged group of patches."""
        return self.patches // merge_size**2


@dataclass(frozen=True, eq=False)
class DecodedVideo:
    """A video as patches: ``patches`` [t·gh·gw, patch_values] uint8, ``grid`` (t, gh, gw)."""

    patches: Pixels
    grid: tuple[int, int, int]
    tokens: int
    frames: int  # frames sampled from the stream (before the last is repeated to fill)
    original_hw: tuple[int, int]


def sample_count(header_frames: int, stream_fps: float, spec: VideoSpec = DEFAULT_SPEC) -> int:
    """How many frames a video of ``header_frames`` at ``stream_fps`` samples (Qwen2-VL's rule:
    ``fps`` a second, within ``min_frames`` .. ``max_frames`` and the stream's frames, rounded
    down to a multiple of ``temporal_patch_size``); a video shorter than one temporal patch
    samples all its frames (the last is repeated to fill)."""
    tps = spec.temporal_patch_size
    most = math.floor(min(spec.max_frames, header_frames) / tps) * tps
    wanted = header_frames / stream_fps * spec.fps
    n = min(max(wanted, spec.min_frames), most, header_frames)
    n = math.floor(n / tps) * tps
    return int(n) if n >= 1 else header_frames


def sample_indices(total: int, count: int) -> tuple[int, ...]:
    """``count`` frame indices spread uniformly over ``total`` frames from the first, as
    the first ``count`` of ``torch.arange(0, total, total / count).int()`` (each product in
    double precision, rounded to single, then truncated)."""
    if count <= 0 or total <= 0:
        return ()
    values = np.arange(count, dtype=np.float64) * (total / count)
    return tuple(int(v) for v in values.astype(np.float32).astype(np.int64))


def plan_video(
    header: VideoHeader, spec: VideoSpec = DEFAULT_SPEC, window: Window | None = None
) -> VideoPlan:
    """The frames and patch grid of a video with this header (``window``: of that clip of it,
    sampled as if it were the whole video; None: the whole video)."""
    first, end = (0, header.frames) if window is None else (window.first, window.end)
    if not 0 <= first < end <= header.frames:
        raise ValueError(f"a window of frames {first}..{end} of a video of {header.frames}")
    count = sample_count(end - first, header.fps, spec)
    indices = tuple(first + i for i in sample_indices(end - first, count))
    max_pixels = spec.max_pixels
    if spec.total_pixels is not None:
        share = spec.total_pixels * spec.temporal_patch_size // max(count, 1)
        max_pixels = max(min(max_pixels, share), int(spec.min_pixels * 1.05))
    h, w = fit(header.height, header.width, spec.frame_geometry(max_pixels))
    t = -(-len(indices) // spec.temporal_patch_size)
    return VideoPlan(indices, (h, w), (t, h // spec.patch_size, w // spec.patch_size))


def probe(data: bytes, spec: VideoSpec = DEFAULT_SPEC) -> VideoHeader | DecodeFailure:
    """The header of the video in ``data``, or why it cannot be used; never raises.

    The frame count is the container's (an MP4's sample table) or, where it declares none
    (WebM, Matroska, GIF), the number of its video packets, counted without decoding them.
    """
    if not data:
        return DecodeFailure("empty")
    return _guarded("probed", lambda: _probe(data, spec))


def decode(
    data: bytes,
    spec: VideoSpec = DEFAULT_SPEC,
    header: VideoHeader | None = None,
    window: Window | None = None,
) -> DecodedVideo | DecodeFailure:
    """The video in ``data`` (``window``: that clip of it) as patches, sampled as `plan_video`
    says for its header (``header``: one `probe` already gave), or why not; never raises. A
    stream that ends before the last sampled frame is damage ("fewer frames than declared"),
    never a shorter video."""
    if header is None:
        probed = probe(data, spec)
        if isinstance(probed, DecodeFailure):
            return probed
        header = probed
    plan = plan_video(header, spec, window)
    known = header
    return _guarded("decoded", lambda: _decode(data, spec, known, plan))


def patchify_frames(frames: Pixels, spec: VideoSpec = DEFAULT_SPEC) -> Pixels:
    """Cut [T, h, w, 3] uint8 frames (T a multiple of ``temporal_patch_size``) into
    [T/tps · gh · gw, 3·tps·p·p] patches, in Qwen2-VL's order: temporal patch, then merge
    group, then the patch within its group; a row is (channel, frame, py, px)."""
    t, h, w = _check_frames(frames, spec)
    p, m, tps = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    blocks = frames.reshape(t // tps, tps, h // p // m, m, p, w // p // m, m, p, 3)
    ordered = blocks.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    return np.ascontiguousarray(ordered).reshape(-1, spec.patch_values)


def rgb_image(frame: Any, reformatter: Any, threads: int) -> Any:
    """A decoded PyAV frame as an RGB Pillow image: FFmpeg's conversion, as
    ``frame.to_ndarray(format="rgb24")`` makes it, copied once, straight into Pillow's memory.
    ``reformatter``: a ``VideoReformatter`` kept for the video's frames, run on ``threads``
    threads (``frame.reformat`` sets one up for every frame, on as many threads as CPUs)."""
    from PIL import Image

    plane = reformatter.reformat(frame, format="rgb24", threads=threads).planes[0]
    size, stride = (plane.width, plane.height), plane.line_size
    return Image.frombuffer("RGB", size, plane, "raw", "RGB", stride, 1)


def put_frame(
    patches: Pixels, grid: tuple[int, int, int], slot: int, rgb: Pixels, spec: VideoSpec
) -> None:
    """Write frame ``slot`` ([h, w, 3] uint8, resized) into a video's ``patches`` where
    `patchify_frames` puts it: no array of the whole video's frames is made."""
    p, m, tps = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    t, gh, gw = grid
    places = patches.reshape(t, gh // m, gw // m, m, m, 3, tps, p, p)
    blocks = rgb.reshape(gh // m, m, p, gw // m, m, p, 3).transpose(0, 3, 1, 4, 6, 2, 5)
    places[slot // tps, :, :, :, :, :, slot % tps] = blocks


def _guarded(what: str, work: Callable[[], _T]) -> _T | DecodeFailure:
    """What ``work`` returns, or why it failed: untrusted bytes fail as data, not a crash."""
    try:
        return work()
    except Exception as exc:
        reason = _reason(exc)
        log.debug("video not %s: %s (%s: %s)", what, reason, type(exc).__name__, exc)
        return DecodeFailure(reason)


def _probe(data: bytes, spec: VideoSpec) -> VideoHeader | DecodeFailure:
    import av  # the loaders of video sources alone pay for FFmpeg's import

    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.video:
            return DecodeFailure("no video stream")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        height, width = int(ctx.height), int(ctx.width)
        rejected = _rejection(height, width, spec)
        if rejected is not None:
            return rejected
        frames = int(stream.frames or 0)
        if frames <= 0:
            frames = sum(1 for packet in container.demux(stream) if packet.size)
        if frames <= 0:
            return DecodeFailure("no frames")
        if frames > spec.max_stream_frames:
            return DecodeFailure("too many frames")
        duration_s = _duration_s(stream, container)
        fps = _fps(stream, frames, duration_s)
        if fps is None:
            return DecodeFailure("no frame rate")
        if frames / fps > spec.max_duration_s:
            return DecodeFailure("too long")
        header = VideoHeader(frames, fps, duration_s, height, width, str(ctx.name))
        if decode_pixels(header, spec) > spec.max_decode_pixels:
            return DecodeFailure("too costly to decode")
        return header


def decode_pixels(header: VideoHeader, spec: VideoSpec = DEFAULT_SPEC) -> int:
    """The pixels decoding a video with this header passes through: every frame up to its last
    sampled one (the codec decodes them all), at the stream's frame size."""
    last = sample_indices(header.frames, sample_count(header.frames, header.fps, spec))[-1]
    return (last + 1) * header.height * header.width


def _duration_s(stream: object, container: object) -> float:
    duration, time_base = getattr(stream, "duration", None), getattr(stream, "time_base", None)
    if duration and time_base:
        return float(duration * time_base)
    total = getattr(container, "duration", None)  # in microseconds
    return float(total) / 1e6 if total else 0.0


def _fps(stream: object, frames: int, duration_s: float) -> float | None:
    """The stream's average rate; else frames over duration; None when neither is usable."""
    for rate in (getattr(stream, "average_rate", None), getattr(stream, "guessed_rate", None)):
        if rate and 0 < float(rate) < 10_000:
            return float(rate)
    if duration_s > 0:
        return frames / duration_s
    return None


def _decode(
    data: bytes, spec: VideoSpec, header: VideoHeader, plan: VideoPlan
) -> DecodedVideo | DecodeFailure:
    import av

    patches = np.empty((plan.patches, spec.patch_values), dtype=np.uint8)
    take = _Taker(plan, header, patches, spec)
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = spec.threads
        sought = _seek(container, stream, plan) if plan.indices[0] > 0 else None
        if sought is None:  # from the first frame, counting frames as they come
            wanted = {index: slot for slot, index in enumerate(plan.indices)}
            got = take(enumerate(container.decode(stream)), wanted)
        else:  # from a keyframe before the clip, knowing frames by their timestamps
            wanted = {sought[index]: slot for slot, index in enumerate(plan.indices)}
            timed = ((frame.pts, frame) for frame in container.decode(stream))
            got = take(timed, wanted)
    if isinstance(got, DecodeFailure):
        return got
    found, last = got
    if found < len(plan.indices) or last is None:
        return DecodeFailure("fewer frames than declared")
    for slot in range(found, plan.grid[0] * spec.temporal_patch_size):  # the last fills its patch
        put_frame(patches, plan.grid, slot, last, spec)
    return DecodedVideo(
        patches,
        plan.grid,
        plan.tokens(spec.merge_size),
        len(plan.indices),
        (header.height, header.width),
    )


def _seek(container: Any, stream: Any, plan: VideoPlan) -> list[int] | None:
    """Seek to the keyframe at or before the plan's first frame; the display timestamps of the
    stream's frames, in display order, to know frames by (from its packets, not decoded). None,
    not sought: the stream's packets do not time every frame once, so frames are counted from
    the first instead."""
    found = [packet.pts for packet in container.demux(stream) if packet.size]
    stamps = sorted(pts for pts in found if pts is not None)
    timed_once = len(stamps) == len(found) == len(set(stamps))
    if not timed_once or len(stamps) <= plan.indices[-1]:
        container.seek(0, stream=stream, backward=True, any_frame=False)
        return None
    container.seek(stamps[plan.indices[0]], stream=stream, backward=True, any_frame=False)
    return stamps


class _Taker:
    """Resizes the wanted frames of a stream into a video's patches, converting each to RGB
    with one FFmpeg reformatter on ``spec.threads`` threads (``frame.to_ndarray`` would set one
    up for every frame, on as many threads as there are CPUs)."""

    def __init__(self, plan: VideoPlan, header: VideoHeader, patches: Pixels, spec: VideoSpec):
        from av.video.reformatter import VideoReformatter

        self.plan, self.header, self.patches, self.spec = plan, header, patches, spec
        self.reformatter = VideoReformatter()

    def __call__(
        self, frames_in: Iterable[tuple[int | None, Any]], wanted: dict[int, int]
    ) -> tuple[int, Pixels | None] | DecodeFailure:
        """Each wanted frame of ``frames_in`` ((its ordinal or timestamp, the frame)) into its
        slot, up to the last one wanted; how many were found, and the last sampled frame
        resized (what fills its temporal patch)."""
        from PIL import Image

        plan, spec = self.plan, self.spec
        (h, w), final, got = plan.size, max(wanted), 0
        last: Pixels | None = None
        for at, frame in frames_in:
            if at is None:
                continue
            slot = wanted.get(at)
            if slot is not None:
                if (frame.height, frame.width) != (self.header.height, self.header.width):
                    return DecodeFailure("frame size changes mid-stream")
                still = rgb_image(frame, self.reformatter, spec.threads)
                rgb = np.asarray(still.resize((w, h), Image.Resampling.BICUBIC))
                put_frame(self.patches, plan.grid, slot, rgb, spec)
                got += 1
                if slot == len(plan.indices) - 1:
                    last = rgb
            if at >= final:
                break
        return got, last


def _rejection(height: int, width: int, spec: VideoSpec) -> DecodeFailure | None:
    """Why a video of this declared frame size is refused before decoding, if it is."""
    if height < 1 or width < 1:
        return DecodeFailure("no pixels")
    if height * width > spec.max_frame_pixels:
        return DecodeFailure("too many pixels")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        return DecodeFailure(f"aspect ratio over {MAX_ASPECT_RATIO}")
    return None


def _reason(exc: Exception) -> str:
    """A short reason for a failure, the same for the same bytes."""
    import av

    if isinstance(exc, av.error.InvalidDataError):
        return "not a video"
    if isinstance(exc, av.error.DecoderNotFoundError):
        return "unknown codec"
    if isinstance(exc, av.error.EOFError) or "truncat" in str(exc).lower():
        return "truncated"
    return f"cannot decode ({type(exc).__name__})"


def _check_frames(frames: Pixels, spec: VideoSpec) -> tuple[int, int, int]:
    f, tps = spec.patch_size * spec.merge_size, spec.temporal_patch_size
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise ValueError(
            f"patchify_frames needs [T, h, w, 3] uint8, got {frames.dtype} {frames.shape}"
        )
    t, h, w = frames.shape[:3]
    if t % tps or h % f or w % f or not t:
        raise ValueError(
            f"patchify_frames needs frames a positive multiple of {tps} and sides multiples of "
            f"{f}, got {t} frames of {h}×{w}"
        )
    return t, h, w
