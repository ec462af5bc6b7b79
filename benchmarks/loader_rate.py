"""A loader's cost, read from ``msd status`` as a user can: a job whose only source is the one to
measure, one loader, repeating; the tokens its loader read and the CPU and busy seconds
(reading and tokenizing, wall) it spent between its reports, over back-to-back windows of
``window_s`` once it reads; then the job is stopped as ``msd stop`` stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from msd.control.job_status import fetch_view
from msd.errors import LaunchError
from msd.jobdir import JobDir
from msd.wire.views import StatusView

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.2

Reading = tuple[float, float, int]  # the loader's CPU seconds, busy seconds, tokens read


def loader_reading(view: StatusView) -> Reading | None:
    """The job's one loader's last report; None before it has reported reading anything."""
    if len(view.loaders) != 1 or view.loaders[0].tokens_read == 0:
        return None
    loader = view.loaders[0]
    return loader.cpu_seconds, loader.busy_s, loader.tokens_read


def per_million(seconds: float, tokens: int) -> float:
    return 1e6 * seconds / tokens if tokens else float("nan")


def windows(readings: Sequence[tuple[float, Reading]], window_s: float) -> list[dict[str, Any]]:
    """Back-to-back windows over the reports (``(when seen, reading)`` pairs), each from a
    report to the first one ``window_s`` or more after it that read more: the tokens read in it
    and the seconds spent, per 1M tokens too."""
    found = []
    start = 0
    while start < len(readings):
        at, first = readings[start]
        later = range(start + 1, len(readings))
        end = next(
            (i for i in later if readings[i][0] - at >= window_s and readings[i][1][2] > first[2]),
            None,
        )
        if end is None:
            break
        found.append(_spent(first, readings[end][1]))
        start = end
    return found


def _spent(first: Reading, last: Reading) -> dict[str, Any]:
    cpu_s, busy_s, read = (b - a for a, b in zip(first, last, strict=True))
    return {
        "tokens": int(read),
        "cpu_s": round(cpu_s, 3),
        "busy_s": round(busy_s, 3),
        "cpu_s_per_1m_tokens": round(per_million(cpu_s, int(read)), 3),
        "busy_s_per_1m_tokens": round(per_million(busy_s, int(read)), 3),
    }


def measure(
    workdir: Path,
    doc: dict[str, Any],
    window_s: float,
    count: int = 3,
    timeout_s: float = 300,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``msd launch`` the recipe ``doc`` (one source, repeating, ``loaders: 1``) in ``workdir``,
    with ``env`` added to its environment, and stop it once its loader's reports span
    ``count`` `windows` of ``window_s``: the one of least CPU per token (as a benchmark keeps
    its least time: the others were slowed by something else), and all of them."""
    import yaml

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "recipe.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "MSD_CACHE_DIR": str(workdir / "cache"),
    }
    output = workdir / "launch.out"
    with open(output, "w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "msd.cli", "launch", "recipe.yaml", "--run-dir", "runs"],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_default_sigint,
        )
    try:
        found = _watch(launcher, workdir / "runs", window_s, count, time.monotonic() + timeout_s)
    except (RuntimeError, TimeoutError) as exc:
        raise RuntimeError(f"{exc}; msd launch said: {output.read_text()[-2000:]}") from None
    finally:
        _stop(launcher)
    best = min(found, key=lambda w: w["cpu_s_per_1m_tokens"])
    return {**best, "windows": found}


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(launcher: subprocess.Popen[bytes]) -> None:
    if launcher.poll() is not None:
        return
    launcher.send_signal(signal.SIGINT)  # as `msd stop` does: the launcher stops its roles
    try:
        launcher.wait(timeout=60)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()


def _watch(
    launcher: subprocess.Popen[bytes], runs: Path, window_s: float, count: int, deadline: float
) -> list[dict[str, Any]]:
    """Polls the job's status, keeping each new report of its loader (once it reads), until
    they span ``count`` `windows`."""
    readings: list[tuple[float, Reading]] = []
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            raise RuntimeError("the job ended before its loader was measured")
        time.sleep(POLL_S)
        job = _job_of(runs, launcher.pid)
        try:
            reading = loader_reading(fetch_view(job)) if job else None
        except LaunchError:  # its Planner is not answering yet
            continue
        if reading is not None and (not readings or reading != readings[-1][1]):
            readings.append((time.monotonic(), reading))
        found = windows(readings, window_s)
        if len(found) >= count:
            return found[:count]
    raise TimeoutError("the loader did not report over the windows in time")


def _job_of(runs: Path, launcher_pid: int) -> JobDir | None:
    """The job folder under ``runs`` that the launcher with this pid made, once it has."""
    for path in runs.glob("*/job.json"):
        job = JobDir(path.parent)
        try:
            if job.read_json(path).get("launcher_pid") == launcher_pid:
                return job
        except (OSError, ValueError):  # being written
            continue
    return None
