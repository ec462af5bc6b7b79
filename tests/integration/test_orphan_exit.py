"""A role whose launcher dies (kill -9) gets SIGTERM and drains; a drain that never ends is cut
after ``ORPHAN_EXIT_S`` by the kernel, so no role outlives its launcher by more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from msd.roles.common import ORPHAN_EXIT_S

# A role's start-up and a drain that never ends (it only says that it began).
ROLE = """
import sys, time
from msd.roles.common import StopRequested, die_with_parent, stop_on_signals
die_with_parent()
stop_on_signals()
try:
    print("up", flush=True)  # in the try: the SIGTERM may come before print returns
    while True:
        time.sleep(0.05)
except StopRequested:
    open(sys.argv[1], "w").close()
    while True:
        time.sleep(0.05)
"""

# The launcher: starts the role with its own pid in MSD_LAUNCHER_PID, says the role's pid once
# it is up, then waits to be killed.
LAUNCHER = """
import os, subprocess, sys, time
env = {**os.environ, "MSD_LAUNCHER_PID": str(os.getpid())}
role = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env,
                        stdout=subprocess.PIPE, text=True)
assert role.stdout is not None and role.stdout.readline() == "up\\n"
print(role.pid, flush=True)
time.sleep(3600)
"""

# Time for the role to be scheduled and run its SIGTERM handler on a busy machine (the bound
# itself is the kernel's timer).
SCHEDULING_S = 30


def test_a_role_whose_launcher_died_ends_within_the_orphan_bound_even_mid_drain(
    tmp_path: Path,
) -> None:
    draining = tmp_path / "draining"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, ROLE, str(draining)], stdout=subprocess.PIPE, text=True
    )
    role: psutil.Process | None = None
    try:
        assert launcher.stdout is not None
        role = psutil.Process(int(launcher.stdout.readline()))
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + ORPHAN_EXIT_S + SCHEDULING_S
        while role.is_running() and role.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the role outlived its launcher's death"
            time.sleep(0.1)
        assert draining.exists()  # it got SIGTERM and drained: the bound ended it, not the signal
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if role is not None and role.is_running():
            role.kill()
