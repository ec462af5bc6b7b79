"""`msd stop` of a local job: Ctrl-C for its launcher, here a real process standing in for one
(tests/integration/test_ls.py stops real jobs), said as a sentence or, with --json, as data."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cli.stop import stop
from tests.conftest import restore_sigint
from tests.unit.test_runs import no_such_pid

# exits 7 on SIGINT, so that the test tells Ctrl-C from any other end
LAUNCHER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGINT, lambda *_: sys.exit(7))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def stop_app() -> typer.Typer:
    app = typer.Typer()
    app.command()(stop)
    return app


def job_folder(root: Path, launcher_pid: int) -> Path:
    folder = root / "t-20240501-120000"
    folder.mkdir()
    info = {"name": "t", "cluster": "local", "state": "running", "launcher_pid": launcher_pid}
    (folder / "job.json").write_text(json.dumps(info))
    return folder


@pytest.fixture
def launcher() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=restore_sigint,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("json_out", [False, True])
def test_stop_sends_the_launcher_ctrl_c(tmp_path, launcher, json_out):
    folder = job_folder(tmp_path, launcher.pid)
    args = [str(folder), *(["--json"] if json_out else [])]
    result = CliRunner().invoke(stop_app(), args)
    assert result.exit_code == 0, result.output
    assert launcher.wait(timeout=30) == 7
    if json_out:
        assert json.loads(result.stdout) == {
            "job": str(folder.resolve()),
            "cluster": "local",
            "outcome": "stopping",
            "slurm_jobs": [],
            "launcher_pid": launcher.pid,
        }
    else:
        assert result.stdout == f"asked the launcher (pid {launcher.pid}) to stop the job\n"


def test_stop_json_of_a_job_whose_launcher_is_gone(tmp_path):
    pid = no_such_pid()
    folder = job_folder(tmp_path, pid)
    result = CliRunner().invoke(stop_app(), [str(folder), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["outcome"] == "not_running"
    human = CliRunner().invoke(stop_app(), [str(folder)])
    assert human.stdout == "the job's launcher is not running; nothing to stop\n"


def test_stop_json_of_a_folder_that_is_no_job_exits_1_with_one_line(tmp_path):
    result = CliRunner().invoke(stop_app(), [str(tmp_path), "--json"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "error:" in result.stderr and "no job.json" in result.stderr
    assert "Traceback" not in result.output
