"""benchmarks.video_decode's msd side: a job whose only source is the clips, and what its loader
says it did.

The job: one WebDataset source (the shards, ``video_exts: [mp4]``, one epoch), one loader
process, the recipe's ``video:`` defaults (Qwen2-VL's), DP 1, the demo trainer without compute
(``step_ms: 0``), so the loader decodes as fast as it can. While it runs, the Planner's status is
read every ``POLL_S`` (`msd.control.job_status.fetch_view`, as ``msd status`` reads it): a loader's
``Stats`` carries its process's CPU seconds and, in the same message, its source's seconds of
video decoded and the CPU time of its probe and decode calls (``videos_by_source``). The rates
are taken from the first status after its first videos to the first that shows them all: the
loader's start-up and its idling after the last clip are left out. (The run summary holds the
loaders' last ``Stats``, sent once a second: it can miss the last clips of a short job.)"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from msd.control.job_status import fetch_view
from msd.errors import MsdError
from msd.jobdir import JobDir
from msd.sources.video import VideoSpec, plan_video, probe
from msd.sources.vision import DecodeFailure

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "clips"
POLL_S = 0.5
TIMEOUT_S = 600.0
CAPTION_TOKENS = 64  # room for a caption beside its video


def seq_len_for(first_clip: bytes) -> int:
    """A power of two holding the clip's placeholders and its caption."""
    header = probe(first_clip)
    if isinstance(header, DecodeFailure):
        raise RuntimeError(f"the benchmark's own clip does not probe: {header.reason}")
    tokens = plan_video(header).tokens(VideoSpec().merge_size)
    return 1 << (tokens + CAPTION_TOKENS - 1).bit_length()


def recipe(shards: list[Path], seq_len: int, step_ms: float = 0.0) -> dict[str, Any]:
    return {
        "name": "video-decode",
        "seed": 0,
        "seq_len": seq_len,
        "global_batch_tokens": seq_len,
        "distribute": {"dp": 1},
        "video": {},
        "sources": [
            {
                "name": SOURCE,
                "path": str(shards[0].parent.resolve() / "*.tar"),
                "format": "webdataset",
                "text_column": "txt",
                "video_exts": ["mp4"],
                "weight": 1.0,
                "repeat": False,
                "loaders": 1,
            }
        ],
        "trainer": {"command": "demo", "demo": {"step_ms": step_ms}},
    }


class Reading(NamedTuple):
    """One status: when, the source's seconds of video decoded and the CPU time of those
    decode calls, the loader process's CPU seconds, the videos read (one loader's ``Stats``)."""

    time: float
    video_s: float
    decode_cpu_s: float
    loader_cpu_s: float
    videos: int


class StatusPoller:
    """Reads the job's status every ``POLL_S`` on a thread, a `Reading` each time it shows the
    loader."""

    def __init__(self, jobs: Path) -> None:
        self.jobs = jobs
        self.readings: list[Reading] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._done.wait(POLL_S):
            folders = [p.parent for p in self.jobs.glob("*/job.json")]
            if not folders:
                continue
            try:
                view = fetch_view(JobDir(folders[0]), timeout_s=2.0)
            except (MsdError, OSError, ValueError):
                continue  # not up yet, or done
            sources = [s for s in view.sources if s.name == SOURCE]
            if view.loaders and sources:
                cpu_s = sum(loader.cpu_seconds for loader in view.loaders)
                s = sources[0]
                reading = Reading(time.time(), s.video_s, s.video_cpu_s, cpu_s, s.videos_read)
                self.readings.append(reading)


def rates(readings: list[Reading]) -> dict[str, float]:
    """Video-s per CPU-s of the loader process and of its decode calls, from the first reading
    with videos to the first with them all (the loader idle after its last left out)."""
    nan = float("nan")
    with_videos = [r for r in readings if r.videos > 0]
    if not with_videos:
        return {"loader_video_s_per_cpu_s": nan, "decode_video_s_per_cpu_s": nan, "videos": 0}
    first = with_videos[0]
    last = next(r for r in with_videos if r.video_s == max(x.video_s for x in with_videos))
    video_s = last.video_s - first.video_s
    loader_s, decode_s = (
        last.loader_cpu_s - first.loader_cpu_s,
        last.decode_cpu_s - first.decode_cpu_s,
    )
    return {
        "loader_video_s_per_cpu_s": video_s / loader_s if loader_s > 0 else nan,
        "decode_video_s_per_cpu_s": video_s / decode_s if decode_s > 0 else nan,
        "window_video_s": video_s,
        "window_loader_cpu_s": loader_s,
        "window_decode_cpu_s": decode_s,
        "window_videos": last.videos - first.videos,
        "videos": last.videos,
        "video_s": last.video_s,
    }


def run_job(shards: list[Path], run_dir: Path, step_ms: float = 0.0) -> dict[str, Any]:
    """One epoch of the shards through msd (the demo trainer computing ``step_ms`` a step); the
    loader's rates (raises if the job fails)."""
    from benchmarks.video_decode import clip_members

    run_dir.mkdir(parents=True, exist_ok=True)
    doc = recipe(shards, seq_len_for(clip_members(shards[:1])[0]), step_ms)
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    poller = StatusPoller(run_dir / "jobs")
    argv = [sys.executable, "-m", "msd.cli", "launch", "recipe.yaml", "--json"]
    argv += ["--run-dir", str(run_dir / "jobs")]
    poller.start()
    try:
        done = subprocess.run(argv, cwd=run_dir, capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        poller.stop()
    if done.returncode != 0:
        raise RuntimeError(f"msd launch failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    return rates(poller.readings) | {"readings": len(poller.readings), "job": summary["job"]}
