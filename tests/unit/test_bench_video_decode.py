"""benchmarks.video_decode on tiny clips: the plain reference does msd's decode work (the same
frames, the same pixels), the data is reused, the rates are read as the loader reports them,
and one real job reports the seconds it decoded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.video_decode import (
    ClipSet,
    clip,
    clip_members,
    ensure_clips,
    plain_decode,
    plain_run,
    summarize,
    table,
)
from benchmarks.video_decode_job import CAPTION_TOKENS, Reading, rates, run_job, seq_len_for
from msd.sources.video import DecodedVideo, VideoSpec, decode, patchify_frames

TINY = ClipSet("tiny", 56, 112, clips=5, seconds=1.0, fps=10)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return ensure_clips(TINY, tmp_path_factory.mktemp("clips"))


def test_the_plain_reference_samples_and_resizes_as_msd_decodes() -> None:
    spec = VideoSpec()
    for data, length_s in ((clip(56, 112, 1.0, fps=10), 1.0), (clip(72, 128, 2.5, 24, 1), 2.5)):
        seconds, frames = plain_decode(data, spec)
        assert seconds == pytest.approx(length_s)
        decoded = decode(data, spec)
        assert isinstance(decoded, DecodedVideo)
        frames += [frames[-1]] * (-len(frames) % spec.temporal_patch_size)
        assert np.array_equal(patchify_frames(np.stack(frames), spec), decoded.patches)


def test_the_clips_are_written_once_and_read_back(shards: list[Path]) -> None:
    assert len(shards) == 2  # 4 clips a shard
    members = clip_members(shards)
    assert len(members) == TINY.clips and members[0] != members[1]
    mtimes = [p.stat().st_mtime_ns for p in shards]
    assert ensure_clips(TINY, shards[0].parent.parent) == shards
    assert [p.stat().st_mtime_ns for p in shards] == mtimes
    result = plain_run(shards, VideoSpec())
    assert result["clips"] == TINY.clips and result["video_s"] == pytest.approx(TINY.video_s)
    assert result["cpu_s"] > 0


def test_the_rates_are_taken_from_the_first_videos_to_the_last() -> None:
    readings = [  # time, video_s, decode CPU s, loader CPU s, videos
        Reading(0.0, 0.0, 0.0, 0.4, 0),
        Reading(1.0, 6.0, 0.2, 1.0, 1),
        Reading(2.0, 18.0, 0.6, 1.5, 3),
        Reading(3.0, 30.0, 1.0, 2.0, 5),
        Reading(4.0, 30.0, 1.0, 2.1, 5),  # idle after the last: left out
    ]
    got = rates(readings)
    assert got["loader_video_s_per_cpu_s"] == pytest.approx(24.0 / 1.0)
    assert got["decode_video_s_per_cpu_s"] == pytest.approx(24.0 / 0.8)
    assert (got["window_videos"], got["videos"], got["video_s"]) == (4, 5, 30.0)
    assert np.isnan(rates(readings[:1])["loader_video_s_per_cpu_s"])


def test_a_summary_keeps_the_best_of_each_and_its_ratio() -> None:
    plain = [{"video_s": 60.0, "cpu_s": 2.0}, {"video_s": 60.0, "cpu_s": 1.5}]
    msd = [
        {"loader_video_s_per_cpu_s": 30.0, "decode_video_s_per_cpu_s": 36.0},
        {"loader_video_s_per_cpu_s": 32.0, "decode_video_s_per_cpu_s": 35.0},
    ]
    point = summarize(TINY, plain, msd)
    assert point["plain_video_s_per_cpu_s"] == 40.0
    assert point["loader_over_plain"] == pytest.approx(0.8)
    assert point["decode_over_plain"] == pytest.approx(0.9)
    assert "| tiny | 5 × 1 | 40.0 | 32.0 | 0.80 | 36.0 | 0.90 |" in table({"tiny": point})


def test_a_job_of_the_clips_reports_what_its_loader_decoded(
    shards: list[Path], tmp_path: Path
) -> None:
    first = clip_members(shards)[0]
    decoded = decode(first)
    assert isinstance(decoded, DecodedVideo)
    room = decoded.tokens + CAPTION_TOKENS
    assert room <= seq_len_for(first) < 2 * room  # a power of two
    # Steps of about 0.8 s (a clip each, 300 ms scaled by its cost): the loader reports, once
    # a second, while the job runs.
    result = run_job(shards, tmp_path / "job", step_ms=300.0)
    assert result["videos"] == TINY.clips
    assert result["video_s"] == pytest.approx(TINY.video_s)
    assert Path(result["job"]).parent == tmp_path / "job" / "jobs"
