"""benchmarks.video_decode on one tiny clip: every way decodes it, the figures are rates."""

from __future__ import annotations

from benchmarks.video_decode import clip, pyav_decode, run, table


def test_the_clip_has_the_frames_asked_for() -> None:
    assert pyav_decode(clip(48, 64, 1.0, fps=10), rgb=True) == 10


def test_a_run_reports_each_way_per_resolution() -> None:
    result = run(1.0, 1, {"tiny": (56, 112)})
    point = result["points"]["tiny"]  # type: ignore[index]
    for key in ("pyav_decode", "pyav_rgb", "msd"):
        assert point[f"{key}_video_s_per_cpu_s"] > 0
    assert point["msd_core_s_per_video_s"] > 0
    assert point["grid_t"] == 2  # 1 s at 2 fps, min_frames 4: 4 frames, 2 temporal patches
    assert "| tiny |" in table(result)
