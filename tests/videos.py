"""Test videos encoded here with PyAV: real containers and codecs, frames whose content says
which frame they are, and damaged files made from them."""

from __future__ import annotations

import io
import tarfile
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

# (container format, codec, pixel format) per kind of file.
KINDS = {
    "mp4": ("mp4", "libx264", "yuv420p"),
    "webm": ("webm", "libvpx-vp9", "yuv420p"),
    "gif": ("gif", "gif", "rgb8"),
}


def frame_pixels(index: int, height: int, width: int) -> np.ndarray:
    """Frame ``index``: smooth gradients that move with the index (codecs keep them well)."""
    y = np.linspace(0, 1, height, dtype=np.float64)[:, None]
    x = np.linspace(0, 1, width, dtype=np.float64)[None, :]
    r = 255 * ((x + index * 0.07) % 1.0) * np.ones_like(y)
    g = 255 * ((y + index * 0.05) % 1.0) * np.ones_like(x)
    b = np.full((height, width), (index * 37) % 256, dtype=np.float64)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def encode(
    kind: str,
    frames: int,
    height: int,
    width: int,
    fps: Fraction | int = 24,
    pts: list[int] | None = None,
    rotation: int | None = None,
    gop: int | None = None,
) -> bytes:
    """A video of ``frames`` frames; ``pts`` (in 1/fps units) makes the frame rate variable;
    ``gop``: a keyframe at least every ``gop`` frames (else the encoder's default)."""
    fmt, codec, pix_fmt = KINDS[kind]
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if pts is not None:
            stream.codec_context.time_base = Fraction(1, int(fps))
        if rotation is not None:
            stream.set_display_rotation(rotation)
        if gop is not None:
            stream.codec_context.gop_size = gop
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_pixels(i, height, width), format="rgb24")
            if pts is not None:
                frame.pts, frame.time_base = pts[i], Fraction(1, int(fps))
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def no_frames(kind: str = "mp4") -> bytes:
    """A container with a video stream and not one frame in it."""
    fmt, codec, pix_fmt = KINDS[kind]
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=24)
        stream.width, stream.height, stream.pix_fmt = 64, 48, pix_fmt
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def decode_all(data: bytes) -> list[np.ndarray]:
    """Every frame of the first video stream as [h, w, 3] uint8, as Hugging Face's PyAV reader
    takes them (``to_ndarray(format="rgb24")``)."""
    with av.open(io.BytesIO(data)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    """An uncompressed tar of ``members`` (name, bytes) in that order: a WebDataset shard."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
