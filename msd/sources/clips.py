"""Cutting a long video into clips, each its own sample (pure: a header in, frame windows out).

A source's ``clip: {length_s, stride_s}`` cuts each video into clips of ``length_s`` seconds,
one starting every ``stride_s`` seconds (default ``length_s``: back to back), as many as fit
whole: a 65 s video cut into 30 s clips gives clips at 0 s and 30 s, and its last 5 s are
not used. A video no longer than one clip is one clip: the whole video. Each clip is then
sampled as a whole video would be (``video.fps``, ``min_frames``, ``max_frames``, ...).

Times are counted in frames at the stream's average rate, as the sampling counts them, so a
clip is the same frames on every machine. The count of clips of a video comes from its header
alone (`clip_count`), which is what lets a source's index know how many samples a file holds
before any frame is decoded (``msd.sources.clip_index``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from msd.sources.video import VideoHeader, Window

# A duration that passes a whole number of strides by less than this is that number: float
# rounding must not cost a video its last clip.
_SLACK = 1e-9


@dataclass(frozen=True)
class ClipRule:
    """Clips of ``length_s`` seconds, one starting every ``stride_s`` seconds."""

    length_s: float
    stride_s: float

    def __post_init__(self) -> None:
        if not (self.length_s > 0 and self.stride_s > 0):
            raise ValueError(
                f"a clip needs a positive length and stride, got {self.length_s}, {self.stride_s}"
            )


def clip_count(header: VideoHeader, rule: ClipRule) -> int:
    """How many clips a video with this header is cut into (at least one)."""
    duration_s = header.frames / header.fps
    if duration_s <= rule.length_s:
        return 1
    return math.floor((duration_s - rule.length_s) / rule.stride_s + _SLACK) + 1


def clip_window(header: VideoHeader, rule: ClipRule, k: int) -> Window:
    """The frames clip ``k`` (0-based, below `clip_count`) of the video samples."""
    count = clip_count(header, rule)
    if not 0 <= k < count:
        raise ValueError(f"clip {k} of a video cut into {count}")
    if count == 1 and header.frames / header.fps <= rule.length_s:
        return Window(0, header.frames)
    first = min(round(k * rule.stride_s * header.fps), header.frames - 1)
    end = min(round((k * rule.stride_s + rule.length_s) * header.fps), header.frames)
    return Window(first, max(end, first + 1))
