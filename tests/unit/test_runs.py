import json
import os
from datetime import datetime, timezone

import pytest
import typer
from typer.testing import CliRunner

import msd.jobdir.runs as runs_module
from cli.ls import ls
from msd.errors import LaunchError
from msd.jobdir.runs import (
    LOST,
    UNREADABLE,
    human_age,
    job_state,
    last_step,
    launcher_alive,
    list_runs,
    pid_alive,
)

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc).timestamp()


def no_such_pid():
    pid = 2**22 + 1  # above the largest pid_max Linux allows; the loop is for other systems
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid += 1


def job(root, name, info=None, raw=None, steps=()):
    folder = root / name
    folder.mkdir()
    (folder / "job.json").write_text(raw if raw is not None else json.dumps(info))
    if steps:
        lines = "".join(json.dumps({"time": 0.0, "step": s}) + "\n" for s in steps)
        (folder / "metrics.jsonl").write_text(lines)
    return folder


def info(cluster, state, pid):
    return {"name": "t", "cluster": cluster, "state": state, "launcher_pid": pid}


@pytest.fixture
def runs(tmp_path, monkeypatch):
    # This test process stands for a live launcher, though it started after the stamps here.
    monkeypatch.setattr(runs_module, "launcher_alive", lambda pid, started: pid_alive(pid))
    job(tmp_path, "live-20240501-115955", info("local", "running", os.getpid()), steps=(1, 2, 3))
    job(tmp_path, "gone-20240501-110000", info("local", "running", no_such_pid()))
    job(tmp_path, "gone-20240501-110000-2", info("local", "done", no_such_pid()), steps=(9,))
    job(tmp_path, "big-20240430-120000", info("slurm", "running", no_such_pid()))
    job(tmp_path, "broken-20240501-100000", raw="{half")
    (tmp_path / "notes").mkdir()  # no job.json: not a job
    (tmp_path / "notes" / "x.txt").write_text("hi")
    (tmp_path / "stray.txt").write_text("a file, not a folder")
    return tmp_path


def test_list_runs_newest_first_with_state_age_and_step(runs):
    listed = list_runs(runs, NOW)
    assert [r.name for r in listed] == [
        "live-20240501-115955",
        "gone-20240501-110000-2",
        "gone-20240501-110000",
        "broken-20240501-100000",
        "big-20240430-120000",
    ]
    by_name = {r.name: r for r in listed}
    live, dead = by_name["live-20240501-115955"], by_name["gone-20240501-110000"]
    assert (live.state, live.cluster, live.step, live.age_s) == ("running", "local", 3, 5.0)
    assert (dead.state, dead.step, dead.age_s) == (LOST, None, 3600.0)
    assert by_name["gone-20240501-110000-2"].state == "done"  # a finished job is not dead
    assert by_name["big-20240430-120000"].state == LOST  # SLURM: its launcher is gone too
    assert by_name["big-20240430-120000"].age_s == 86400.0
    broken = by_name["broken-20240501-100000"]
    assert (broken.state, broken.cluster) == (UNREADABLE, "-")
    assert live.path == (runs / "live-20240501-115955").resolve()


def test_a_folder_without_a_stamp_is_aged_by_its_ctime(tmp_path):
    folder = job(tmp_path, "handmade", info("local", "done", 1))
    (only,) = list_runs(tmp_path, NOW)
    assert only.started == folder.stat().st_ctime


def test_a_missing_run_folder_is_a_user_error(tmp_path):
    with pytest.raises(LaunchError, match="--runs"):
        list_runs(tmp_path / "nope", NOW)


@pytest.mark.parametrize(
    ("state", "cluster", "alive", "shown"),
    [
        ("running", "local", False, LOST),
        ("starting", "local", False, LOST),
        ("running", "local", True, "running"),
        ("failed", "local", False, "failed"),
        ("stopped", "local", False, "stopped"),
        ("running", "slurm", False, LOST),
        ("running", "slurm", True, "running"),
    ],
)
def test_job_state(state, cluster, alive, shown):
    assert job_state(info(cluster, state, 123), lambda pid: alive) == shown


def test_a_slurm_job_whose_launcher_is_gone_is_lost_once_none_of_its_jobs_is_queued():
    doc = {**info("slurm", "running", 123), "slurm_jobs": {"planner planner": "7"}}
    assert job_state(doc, lambda pid: False, lambda ids: ids == ["7"]) == "running"
    assert job_state(doc, lambda pid: False, lambda ids: False) == LOST
    assert job_state(doc, lambda pid: False, lambda ids: None) == LOST  # no squeue here


def test_a_process_that_started_after_the_job_is_not_its_launcher():
    import time

    assert launcher_alive(os.getpid(), time.time())
    assert not launcher_alive(os.getpid(), time.time() - 3 * 86400)  # the pid was reused
    assert not launcher_alive(no_such_pid(), None)


def test_a_launcher_on_another_machine_is_not_checked_here():
    doc = {**info("local", "running", 123), "launcher_host": "elsewhere.invalid"}
    assert job_state(doc, lambda pid: False) == "running"


def test_the_step_is_the_checkpoint_logs_when_the_metrics_lag(tmp_path):
    from msd.checkpoint.format import Delta, encode_delta
    from msd.jobdir.runs import consumed_step

    folder = job(tmp_path, "j-20240501-110000", info("local", "done", 1), steps=(831,))
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "step-00000800.json").write_text("{}")
    lines = [encode_delta(Delta(s, (), ())) for s in range(801, 895)]
    (folder / "checkpoints" / "log-00000800.jsonl").write_bytes(b"".join(lines) + b'{"step": 8')
    assert consumed_step(folder) == 894
    (folder / "checkpoints" / "log-00000800.jsonl").write_bytes(b"")
    assert consumed_step(folder) == 831  # the metrics, then


def test_job_state_without_a_usable_pid_keeps_the_recorded_state():
    assert job_state(info("local", "running", None), lambda pid: False) == "running"
    assert job_state(None, lambda pid: True) == UNREADABLE


def test_last_step_skips_a_line_being_written(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 4}\n{"step": 5}\n{"step": 6, "tok')
    assert last_step(path) == 5
    assert last_step(tmp_path / "absent.jsonl") is None


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (59.9, "59s"), (60, "1m"), (7200, "2h"), (4 * 86400, "4d")]
)
def test_human_age(seconds, text):
    assert human_age(seconds) == text


def ls_app():
    app = typer.Typer()
    app.command()(ls)
    return app


def test_cli_ls_json_and_table(runs):
    result = CliRunner().invoke(ls_app(), ["--runs", str(runs), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 5
    assert set(rows[0]) == {"name", "path", "cluster", "state", "age_s", "step"}
    states = {r["name"]: r["state"] for r in rows}
    assert states["gone-20240501-110000"] == "lost"
    assert states["broken-20240501-100000"] == "unreadable"

    table = CliRunner().invoke(ls_app(), ["--run-dir", str(runs)])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split() == ["name", "cluster", "state", "age", "step"]
    assert lines[1].split()[:3] == ["live-20240501-115955", "local", "running"]
    assert lines[1].split()[-1] == "3"


def test_cli_ls_on_a_missing_folder_lists_no_jobs(tmp_path):
    missing = str(tmp_path / "nope")
    as_json = CliRunner().invoke(ls_app(), ["--runs", missing, "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output) == []
    table = CliRunner().invoke(ls_app(), ["--runs", missing])
    assert table.exit_code == 0, table.output
    assert table.output.strip() == f"no jobs in {missing}"


def test_cli_ls_on_a_file_for_a_folder_exits_1_with_one_line(tmp_path):
    (tmp_path / "runs").write_text("not a folder")
    result = CliRunner().invoke(ls_app(), ["--runs", str(tmp_path / "runs"), "--json"])
    assert result.exit_code == 1
    assert "error:" in result.output and "Traceback" not in result.output
    assert "--runs" in result.output
