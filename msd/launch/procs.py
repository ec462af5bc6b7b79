"""Child processes of a launch: start them so they cannot outlive the launcher, stop them all."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_SHELL_CHARS = set("|&;<>()$`\\\"'*?[]#~=%{}")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def die_with_parent_deaf_to_usr2() -> None:
    """Also ignore SIGUSR2 (kept across exec): SLURM sends it to every process of a job near its
    time limit, and only the supervisor should act on it (submitit checkpoints and requeues)."""
    _die_with_parent()
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


_LIST_CHARS = set("|&;()`\n")  # a pipeline or a list: more than one process
_ASSIGNS = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*")


def command_argv(command: str) -> list[str]:
    """Exec simple commands directly (so the death signal reaches them); others via the shell,
    which replaces itself with the command (``exec``) unless it is a pipeline or a list."""
    if not any(c in _SHELL_CHARS for c in command):
        return shlex.split(command)
    if any(c in _LIST_CHARS for c in command):
        return ["/bin/sh", "-c", command]
    assigns = _ASSIGNS.match(command.lstrip())
    prefix = assigns.group(0) if assigns else ""  # NAME=value words stay in front of `exec`
    rest = command.lstrip()[len(prefix) :]
    return ["/bin/sh", "-c", f"{prefix}exec {rest}"]


def signal_name(code: int) -> str:
    """The signal that killed a process that ended with ``code`` (< 0), e.g. SIGKILL."""
    with contextlib.suppress(ValueError):
        return signal.Signals(-code).name
    return f"signal {-code}"


@dataclass
class Child:
    role: str
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def label(self) -> str:
        return f"{self.role} {self.name}" if self.name != self.role else self.role

    def describe_exit(self) -> str:
        code = self.popen.returncode
        if code is not None and code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"


def start(
    role: str,
    name: str,
    argv: list[str],
    env: dict[str, str],
    log: Path,
    cwd: Path | None = None,
    deaf_to_usr2: bool = False,
) -> Child:
    out = open(log, "ab")  # noqa: SIM115 - the child owns it for its whole life
    try:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            preexec_fn=die_with_parent_deaf_to_usr2 if deaf_to_usr2 else _die_with_parent,
        )
    finally:
        out.close()
    return Child(role, name, popen, log)


def role_argv(role: str, job: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "msd.roles", role, "--job", str(job), *extra]


def stop_all(children: list[Child], grace_s: float = 3.0) -> None:
    """SIGTERM every child's process group, then SIGKILL whatever is left after ``grace_s``."""
    for child in children:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.popen.wait(max(0.0, deadline - time.monotonic()))
    for child in children:
        _signal_group(child, signal.SIGKILL)
        child.popen.wait()


def _signal_group(child: Child, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.popen.pid, sig)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
