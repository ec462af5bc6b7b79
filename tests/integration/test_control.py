"""Operating a running local job: `msd status`, `msd mix`, and who may ask.

Each test launches a real job (`msd launch`, subprocess) with repeating sources and a slow demo
trainer, talks to it with the real CLI or the real control socket, and stops it; the tests that
only watch a job (and change nothing) share one (``TestAWatchedJob``), and the tests that compare
a stream with the same recipe's under fixed loaders share one reference run (``reference``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
import zmq

from msd.control.planner_connection import request
from msd.jobdir import JobDir
from msd.wire import transport
from msd.wire.keys import create_keys
from msd.wire.protocol import SetMix, Status, StatusRequest, Stop
from tests.conftest import (
    base_recipe,
    processes_of_launcher,
    read_rank_logs,
    restore_sigint,
    run_msd,
)

STARTUP_S = 90.0


def msd_popen(*args: str, cwd: Path, **kwargs: Any) -> subprocess.Popen[str]:
    """`msd ARGS` in the background, stoppable with Ctrl-C (SIGINT) as from a terminal."""
    return subprocess.Popen(
        [sys.executable, "-m", "msd.cli", *args],
        cwd=cwd,
        text=True,
        preexec_fn=restore_sigint,
        **kwargs,
    )


def _running_recipe(data: Path, **overrides: Any) -> dict[str, Any]:
    recipe = base_recipe(data, steps=100000, **overrides)
    for s in recipe["sources"]:
        s["repeat"] = True
    recipe["trainer"]["demo"]["step_ms"] = 30
    recipe["metrics"] = {"every_s": 0.5}
    return recipe


@contextmanager
def running_job(
    tmp_path: Path, recipe: dict[str, Any]
) -> Iterator[tuple[JobDir, subprocess.Popen[str]]]:
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    proc = msd_popen(
        "launch", "recipe.yaml", cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        job = JobDir(_wait_job(tmp_path, proc))
        yield job, proc
    finally:
        stop_job(proc)


def stop_job(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C the launcher (if it still runs); kill it and what it started if that does not
    end them."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(20)
    if proc.poll() is None:
        proc.kill()
    proc.communicate()
    for child in processes_of_launcher(proc.pid):
        with suppress(psutil.NoSuchProcess):
            child.kill()


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait_job(tmp_path: Path, proc: subprocess.Popen[str]) -> Path:
    """The job folder once rank 0 has received a few steps."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"launcher ended early: {proc.communicate()}"
        logs = list(tmp_path.glob("runs/*/trainer/rank-0.jsonl"))
        if logs and len(logs[0].read_text().splitlines()) >= 3:
            return logs[0].parent.parent
        time.sleep(0.2)
    raise AssertionError("the job did not start")


msd = run_msd


class Watched:
    """The shared job: its folder, its launcher, the folder it was launched in, and when it
    had started (rank 0 received its first steps)."""

    def __init__(self, job: JobDir, proc: subprocess.Popen[str], cwd: Path) -> None:
        self.job, self.proc, self.cwd = job, proc, cwd
        self.started = time.monotonic()

    def running_for(self, seconds: float) -> None:
        """Until the job has run ``seconds`` since it started (no wait if it has already:
        a test after the first finds it warm)."""
        time.sleep(max(0.0, self.started + seconds - time.monotonic()))


@pytest.fixture(scope="class")
def watched(tmp_path_factory: pytest.TempPathFactory, small_data: Path) -> Iterator[Watched]:
    """One running job for the tests of a class; stopped after the class's last test."""
    cwd = tmp_path_factory.mktemp("watched")
    with running_job(cwd, _running_recipe(small_data)) as (job, proc):
        yield Watched(job, proc, cwd)


class TestAWatchedJob:
    """Tests that only watch a running job, or ask it what it must refuse, share one job (one
    launch, not four): none changes it, and each checks it still runs as launched (weights,
    loaders, state) where that matters."""

    def test_status_json_agrees_with_what_the_trainers_received(self, watched: Watched) -> None:
        job = watched.job
        watched.running_for(2.0)
        result = msd("status", str(job.root), "--json", cwd=watched.cwd)
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        logs = read_rank_logs(job.root)
        assert data["version"] == 1 and data["cluster"] == "local"
        step = data["job"]["step"]
        assert step >= 3 and data["job"]["state"] == "running"
        # every step before `step` was consumed by every rank: the trainers' counts must agree
        received = sum(r["tokens"] for rank in logs.values() for r in rank if r["step"] < step)
        assert data["job"]["tokens"] == received
        assert sum(s["tokens"] for s in data["sources"]) == received
        assert data["job"]["tokens_per_s"] > 0 and data["job"]["steps_per_s"] > 0
        assert {r["rank"] for r in data["ranks"]} == {0, 1, 2, 3}
        # ranks as their Constructor last reported (once a second)
        assert all(0 < r["step"] <= step + 1 and r["ahead"] >= 0 for r in data["ranks"])
        names = {lo["name"] for lo in data["loaders"]}
        assert names == {"web/0", "web/1", "code/0", "code/1", "books/0", "books/1"}
        assert all(lo["state"] == "running" and lo["pss_bytes"] > 0 for lo in data["loaders"])
        assert [s["loaders"] for s in data["sources"]] == [2, 2, 2]
        assert data["planner"]["balance_max_over_mean"] >= 1.0

    def test_status_screen_and_watch_render(self, tmp_path: Path, watched: Watched) -> None:
        screen = msd("status", str(watched.job.root), cwd=watched.cwd)
        with open(tmp_path / "watch.out", "w") as out_file:
            # no job named: the one job under the folder it runs in
            watch = msd_popen(
                "status",
                "--watch",
                "--json",
                "--interval",
                "0.3",
                cwd=watched.cwd,
                stdout=out_file,
            )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(_lines(tmp_path / "watch.out")) < 3:
                time.sleep(0.2)
            watch.send_signal(signal.SIGINT)
            watch.wait(30)
        out = (tmp_path / "watch.out").read_text()
        assert screen.returncode == 0, screen.stderr
        for word in ("sources", "loaders", "ranks", "tokens/s", "data-wait", "web/0"):
            assert word in screen.stdout
        steps = [json.loads(line)["job"]["step"] for line in out.splitlines()]
        assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] > steps[0]
        assert watch.returncode == 0

    def test_a_request_without_the_job_key_is_refused_and_changes_nothing(
        self, tmp_path: Path, watched: Watched
    ) -> None:
        job, proc = watched.job, watched.proc
        endpoint = job.wait_endpoint("planner")
        ctx = transport.context()
        strangers = [
            transport.connect(ctx, zmq.DEALER, endpoint),  # no key at all
            transport.connect(ctx, zmq.DEALER, endpoint, keys=create_keys(tmp_path / "other.key")),
        ]
        for sock in strangers:
            # Once the Planner has refused a stranger's handshake, ZeroMQ may hold no pipe to
            # queue on until it reconnects: a send waits at most 2 s, and what does not go out
            # is nothing the Planner could act on either.
            sock.sndtimeo = 2000
            for msg in (
                StatusRequest(),
                SetMix(weights={"web": 0.0}, at_step=0),
                Stop(reason="let me in"),
            ):
                try:
                    transport.send(sock, msg)
                except zmq.Again:
                    break
        # both watched at once for 2 s (the Planner answers its key's holders in milliseconds)
        poller = zmq.Poller()
        for sock in strangers:
            poller.register(sock, zmq.POLLIN)
        replied = dict(poller.poll(2000))
        answered = [replied.get(sock, 0) for sock in strangers]
        for sock in strangers:
            sock.close(linger=0)
        before = after = request(job, StatusRequest(), Status).view
        deadline = time.monotonic() + 20  # a loaded machine may take seconds for a step
        while after.job.step <= before.job.step and time.monotonic() < deadline:
            time.sleep(0.5)
            after = request(job, StatusRequest(), Status).view
        history_exists = job.mix_history.exists()
        still_running = proc.poll() is None
        assert answered == [0, 0]  # nothing came back
        assert still_running and after.job.step > before.job.step  # the Stop did nothing
        assert not history_exists  # nor did the mix change
        assert after.sources[0].weight == pytest.approx(0.5)

    def test_a_refused_rescale_with_json_prints_nothing_and_says_why(
        self, watched: Watched
    ) -> None:
        job = str(watched.job.root)
        result = msd(
            "rescale", job, "--source", "nosuch", "--loaders", "2", "--json", cwd=watched.cwd
        )
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.count("error:") == 1
        assert "no source named 'nosuch'" in result.stderr and "Traceback" not in result.stderr
        assert not watched.job.rescales.exists()  # no generation was recorded

    def test_metrics_endpoint_serves_prometheus_text(self, watched: Watched) -> None:
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        job = watched.job
        url = job.wait_endpoint("metrics")
        watched.running_for(1.5)
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        lines = [json.loads(x) for x in job.metrics.read_text().splitlines()]
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["msd_steps"].samples[0].value > 0  # the parser drops _total
        weights = {s.labels["source"]: s.value for s in families["msd_source_weight"].samples}
        assert weights == pytest.approx({"web": 0.5, "code": 0.3, "books": 0.2})
        waits = families["msd_data_wait_seconds"].samples
        assert sum(s.value for s in waits if s.name.endswith("_count")) > 0
        assert lines and lines[-1]["step"] > 0
        assert set(lines[-1]["sources"]) == {"web", "code", "books"}


def _unpaced(recipe: dict[str, Any]) -> dict[str, Any]:
    return {**recipe, "trainer": {**recipe["trainer"], "demo": {"step_ms": 0}}}


def _wait_steps(
    job: JobDir, proc: subprocess.Popen[str], steps: int, timeout_s: float = 120
) -> None:
    """Until every rank has logged ``steps`` steps."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"launcher ended early: {proc.communicate()}"
        logs = read_rank_logs(job.root)
        if len(logs) == 4 and all(len(lines) >= steps for lines in logs.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"the job did not reach step {steps}")


def _digests(job: JobDir, steps: int) -> dict[int, list[str]]:
    return {
        rank: [r["digest"] for r in lines[:steps]]
        for rank, lines in read_rank_logs(job.root).items()
    }


def test_mix_at_step_changes_shares_from_that_step_and_replays(
    tmp_path: Path, small_data: Path
) -> None:
    recipe = _running_recipe(small_data)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    with running_job(first, recipe) as (job, proc):
        planned = request(job, StatusRequest(), Status).view.job.planned
        at = planned + 200  # the command takes seconds to start (more on a busy machine)
        result = msd(
            "mix",
            str(job.root),
            "--set",
            "web=0",
            "--set",
            "books=2",
            "--at-step",
            str(at),
            cwd=first,
        )
        assert result.returncode == 0, result.stderr
        assert f"from step {at}" in result.stdout
        # a change long after the steps compared below, asked for as a script would
        later = msd(
            "mix",
            str(job.root),
            "--set",
            "code=0.7",
            "--at-step",
            str(at + 1000),
            "--json",
            cwd=first,
        )
        late = msd("mix", str(job.root), "--set", "web=1", "--at-step", "0", "--json", cwd=first)
        _wait_steps(job, proc, at + 12)
        view = request(job, StatusRequest(), Status).view
    assert later.returncode == 0, later.stderr
    assert json.loads(later.stdout) == {
        "at_step": at + 1000,
        "weights": {"code": 0.7},
        "history": str(job.mix_history),
    }
    assert late.returncode == 1 and "already planned" in late.stderr and late.stdout == ""
    history = json.loads(job.mix_history.read_text())
    assert history["changes"] == [
        {"step": at, "weights": {"books": 2.0, "web": 0.0}},
        {"step": at + 1000, "weights": {"code": 0.7}},
    ]
    assert view.sources[0].weight == 0.0 and view.sources[2].weight == pytest.approx(2 / 2.3)
    rows = read_rank_logs(job.root)
    # Steps draw by their own weights; a step may still place what earlier steps drew and
    # could not fit (carried over), so web (weight 0.5) vanishes within two steps of `at`.
    has_web = {s: any(0 in rows[k][s]["source_ids"] for k in rows) for s in range(at + 12)}
    assert all(has_web[s] for s in range(at))
    assert not any(has_web[s] for s in range(at + 2, at + 12))
    books = {s: sum(rows[k][s]["source_ids"].count(2) for k in rows) for s in range(at + 12)}
    # books (long samples) fill the steps' tokens now: about twice the samples per step
    assert sum(books[s] for s in range(at + 2, at + 12)) > 1.5 * sum(
        books[s] for s in range(at - 10, at)
    )

    # a fresh run that replays the recorded history gives the same stream, byte for byte (it
    # needs no pace: the stream does not depend on how fast trainers take it)
    (second / "history.json").write_text(job.mix_history.read_text())
    (second / "recipe.yaml").write_text(yaml.safe_dump(_unpaced(recipe), sort_keys=False))
    proc2 = msd_popen(
        "launch",
        "recipe.yaml",
        "--mix-history",
        "history.json",
        cwd=second,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        replay = JobDir(_wait_job(second, proc2))
        _wait_steps(replay, proc2, at + 12)
    finally:
        proc2.send_signal(signal.SIGINT)
        proc2.communicate(timeout=30)
    assert _digests(replay, at + 12) == _digests(job, at + 12)
    assert json.loads(replay.mix_history.read_text()) == history


def _finite_recipe(data: Path) -> dict[str, Any]:
    recipe = _running_recipe(data)
    recipe["steps"] = 500
    recipe["trainer"]["demo"]["step_ms"] = 60
    return recipe


class Reference:
    """The stream of ``_finite_recipe`` under its fixed loaders (2 a source): one run for the
    module, started by the first test that needs it (``start``), taken by each (``job``).

    It runs without a pace: the stream does not depend on how fast trainers take it. A run of
    the same recipe with fewer steps gives its first steps: a test of 40 steps compares those."""

    def __init__(self, folder: Path, data: Path) -> None:
        self.folder, self.data = folder, data
        self.proc: subprocess.Popen[str] | None = None
        self.done: JobDir | None = None

    def start(self) -> None:
        if self.proc is None:
            recipe = _unpaced(_finite_recipe(self.data))
            (self.folder / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
            self.proc = msd_popen(
                "launch",
                "recipe.yaml",
                cwd=self.folder,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )

    def job(self) -> JobDir:
        """The reference's job folder, once its run has ended."""
        if self.done is None:
            self.start()
            assert self.proc is not None
            try:
                _, err = self.proc.communicate(timeout=300)
            finally:
                stop_job(self.proc)
            assert self.proc.returncode == 0, err
            (root,) = self.folder.glob("runs/*")
            self.done = JobDir(root)
        return self.done


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, small_data: Path) -> Iterator[Reference]:
    ref = Reference(tmp_path_factory.mktemp("reference"), small_data)
    try:
        yield ref
    finally:
        if ref.proc is not None:
            stop_job(ref.proc)


def test_rescale_up_and_down_leaves_the_stream_unchanged(
    tmp_path: Path, small_data: Path, reference: Reference
) -> None:
    recipe = _finite_recipe(small_data)
    with running_job(tmp_path, recipe) as (job, proc):
        up = msd("rescale", str(job.root), "--source", "web", "--loaders", "3", cwd=tmp_path)
        down = msd("rescale", str(job.root), "--source", "web", "--loaders", "1", cwd=tmp_path)
        code = msd(
            "rescale", str(job.root), "--source", "code", "--loaders", "1", "--json", cwd=tmp_path
        )
        mid_run = request(job, StatusRequest(), Status).view
        # The reference runs while this run takes its last paced steps: started only now, so
        # that it takes no CPU from the rescales (they must land before the run ends).
        reference.start()
        assert proc.wait(300) == 0, proc.communicate()
        left = processes_of_launcher(proc.pid)
    for result in (up, down, code):
        assert result.returncode == 0, result.stderr
    assert mid_run.job.step < 500, "the rescales finished after the run: make it longer"
    assert _digests(job, 500) == _digests(reference.job(), 500)
    assert all(len(v) == 500 for v in _digests(job, 500).values())
    generations = json.loads(job.rescales.read_text())["generations"]
    assert [(g["source"], g["generation"], g["loaders"]) for g in generations] == [
        ("web", 1, 3),
        ("web", 2, 1),
        ("code", 1, 1),
    ]
    assert all(g["start"] is not None for g in generations)
    assert json.loads(code.stdout) == {
        "source": "code",
        "loaders": 1,
        "generation": 1,
        "start": generations[2]["start"],
    }
    retired = {p.name for p in (job.root / "retired").iterdir()}
    assert {"web-0", "web-1", "code-0", "code-1"} <= retired
    assert left == []


def test_loaders_auto_is_planned_from_measured_cost_and_keeps_the_stream(
    tmp_path: Path, small_data: Path, reference: Reference
) -> None:
    # The reference's recipe, 40 steps, its loaders planned: its stream must be the
    # reference's (fixed loaders) first 40 steps.
    reference.start()  # (run by an earlier test already, or now, beside this one's)
    auto = _unpaced(_finite_recipe(small_data))
    auto["steps"] = 40
    for s in auto["sources"]:
        s["loaders"] = "auto"
    auto["loader"] = {"cpus": 2}
    (tmp_path / "auto.yaml").write_text(yaml.safe_dump({**auto, "name": "auto"}))
    planned = msd("plan", "auto.yaml", "--json", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["cpus"] == 2 and [r["source"] for r in plan["sources"]] == ["web", "code", "books"]
    assert all(r["us_per_token"] > 0 and r["profiled_samples"] > 0 for r in plan["sources"])
    assert sum(r["loader_time_share"] for r in plan["sources"]) == pytest.approx(1.0, abs=1e-3)
    result = msd("launch", "auto.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "loaders (auto, 2 CPUs)" in result.stdout
    (auto_job,) = tmp_path.glob("runs/auto-*")
    resolved = json.loads((auto_job / "recipe.json").read_text())
    assert all(isinstance(s["loaders"], int) for s in resolved["sources"])
    assert _digests(JobDir(auto_job), 40) == _digests(reference.job(), 40)
