"""A store emulator as a child process on loopback: started in its own session (so that it may
outlive the command that started it), waited for until it answers HTTP, stopped, restarted on
the same port with the objects it keeps on disk, and shared between commands through a JSON
state file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HOST = "127.0.0.1"
_READY_TIMEOUT_S = 60.0
_ANSWER_TIMEOUT_S = 2.0
_STOP_TIMEOUT_S = 10.0
_POLL_S = 0.1
_LOG_TAIL_LINES = 25


@dataclass
class Emulator:
    """A running emulator: its command, where it listens, its process, its log and data."""

    argv: list[str]
    port: int
    pid: int
    log: str
    data_dir: str
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def answers(self, timeout_s: float = _ANSWER_TIMEOUT_S) -> bool:
        """Whether the emulator answers an HTTP request (any status) within ``timeout_s``."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"{self.endpoint}/", timeout=timeout_s):
                return True
        except urllib.error.HTTPError:
            return True
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after a while); what it wrote to ``data_dir`` stays."""
        if _runs(self.pid, self.data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            if not _wait_gone(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                _wait_gone(self.pid)
        if self._process is not None:
            self._process.wait(timeout=_STOP_TIMEOUT_S)

    def restart(self) -> None:
        """Start it again on the same port and data (after `stop`)."""
        started = start(self.argv, self.port, Path(self.log), Path(self.data_dir))
        self.pid, self._process = started.pid, started._process


def start(argv: list[str], port: int, log: Path, data_dir: Path) -> Emulator:
    """Run ``argv`` (which listens on ``port``) in ``data_dir``, its output appended to ``log``;
    return once it answers. RuntimeError if it exits or stays silent too long."""
    log.parent.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv,
            cwd=data_dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    emulator = Emulator(argv, port, process.pid, str(log), str(data_dir), process)
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while not emulator.answers():
        code = process.poll()
        if code is not None or time.monotonic() > deadline:
            emulator.stop()
            said = f"exited with code {code}" if code is not None else "did not answer"
            raise RuntimeError(f"{argv[0]} {said} on {emulator.endpoint}{_log_tail(log)}")
        time.sleep(_POLL_S)
    return emulator


def free_port() -> int:
    """A TCP port of loopback that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def save(emulator: Emulator, path: Path) -> None:
    """Write the emulator's command, port, pid, log and data folder to the JSON file ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "argv": emulator.argv,
        "port": emulator.port,
        "pid": emulator.pid,
        "log": emulator.log,
        "data_dir": emulator.data_dir,
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


def load(path: Path) -> Emulator | None:
    """The emulator a state file names; None if the file is missing or damaged, or its process
    no longer runs."""
    try:
        state = json.loads(path.read_text())
        emulator = Emulator(
            argv=[str(a) for a in state["argv"]],
            port=int(state["port"]),
            pid=int(state["pid"]),
            log=str(state["log"]),
            data_dir=str(state["data_dir"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return emulator if _runs(emulator.pid, emulator.data_dir) else None


def _runs(pid: int, data_dir: str) -> bool:
    """Whether ``pid`` is still an emulator of ``data_dir`` (named on its command line), not a
    process that reused the pid."""
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and data_dir in process.cmdline()
    except psutil.Error:
        return False


def _wait_gone(pid: int) -> bool:
    try:
        psutil.Process(pid).wait(timeout=_STOP_TIMEOUT_S)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


def _log_tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    except OSError:
        return ""
    return "; its log ends:\n" + "\n".join(lines) if lines else ""
