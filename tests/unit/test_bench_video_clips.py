"""benchmarks.video_clips on a tiny video: both ways decode every clip, and the figures add up."""

from __future__ import annotations

from benchmarks.video_clips import run


def test_the_clip_benchmark_decodes_every_clip_both_ways() -> None:
    result = run(seconds=6, clip_s=1.5, keyframe_s=0.5, size=(48, 64))
    assert result["clips"] == 4
    assert result["seeking_cpu_s"] > 0 and result["from_start_cpu_s"] > 0
    assert result["seeking_video_s_per_cpu_s"] > 0 and result["from_start_over_seeking"] > 0
