"""How a trainer command becomes a process: one process, so the launcher's death signal and
its group signals reach the trainer itself, not a shell in front of it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from msd.launch.procs import command_argv


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("python train.py --lr 3", ["python", "train.py", "--lr", "3"]),
        ("python train.py --lr=3e-4", ["/bin/sh", "-c", "exec python train.py --lr=3e-4"]),
        (
            'A=1 B=x python t.py --k="a  b"',
            ["/bin/sh", "-c", 'A=1 B=x exec python t.py --k="a  b"'],
        ),
        ("python a.py && python b.py", ["/bin/sh", "-c", "python a.py && python b.py"]),
        ("cat f | python t.py", ["/bin/sh", "-c", "cat f | python t.py"]),
    ],
)
def test_commands_become_one_process_where_they_can(command: str, argv: list[str]) -> None:
    assert command_argv(command) == argv


def test_a_command_with_assignments_runs_as_the_shells_own_process() -> None:
    popen = subprocess.Popen(command_argv("MSD_T=1 sleep 5"))
    try:
        deadline = time.monotonic() + 5
        cmdline = b""
        while time.monotonic() < deadline and not cmdline.startswith(b"sleep"):
            cmdline = Path(f"/proc/{popen.pid}/cmdline").read_bytes()
            time.sleep(0.01)
        assert cmdline.split(b"\0")[:2] == [b"sleep", b"5"]
        environ = Path(f"/proc/{popen.pid}/environ").read_bytes().split(b"\0")
        assert b"MSD_T=1" in environ
    finally:
        popen.kill()
        popen.wait()
