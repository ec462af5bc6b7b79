"""Failures survived while training runs: kill -9 of a loader, the Planner, a Constructor that
relays payloads to another node's, a trainer rank, or a loader and the Planner together, at
several points of a run. Every rank's stream must equal the run without failure, byte for byte,
and no process may be left behind.
A trainer that goes back to an earlier checkpoint of its own gets the same batches again."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

import msd
from tests.conftest import (
    LaunchFailed,
    assert_launch_ok,
    base_recipe,
    processes_of_launcher,
    read_rank_logs,
    start_launch,
)

STEPS = 100


def recipe(data: Path, **overrides: Any) -> dict[str, Any]:
    doc = base_recipe(data, steps=STEPS, checkpoint={"every_steps": 25})
    doc["trainer"]["demo"]["step_ms"] = 10
    for s in doc["sources"]:
        s["repeat"] = True
    doc.update(overrides)
    return doc


def digests(job: Path) -> dict[tuple[int, int], str]:
    return {(rank, r["step"]): r["digest"] for rank, rs in read_rank_logs(job).items() for r in rs}


# The run summary's per-run counts: a recovered run's must equal the run's without failure.
COUNTS = (
    "steps",
    "tokens",
    "split_samples",
    "truncated_samples",
    "dropped_samples",
    "truncated_tokens",
    "sources",
)


def counts(out: str) -> dict[str, Any]:
    """The counts of ``msd launch --json``'s summary."""
    summary = json.loads(out[out.index("{") :])
    return {key: summary[key] for key in COUNTS}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, small_data: Path) -> dict:
    """Every rank's digests of the run without failure, and its summary's counts (``counts``)."""
    root = tmp_path_factory.mktemp("reference")
    (root / "r.yaml").write_text(yaml.safe_dump(recipe(small_data), sort_keys=False))
    proc = start_launch(root, "r.yaml", "--json")
    out, err = proc.communicate(timeout=180)
    assert_launch_ok(proc, out, err)
    (job,) = (root / "runs").iterdir()
    found: dict[Any, Any] = digests(job)
    assert len(found) == 4 * STEPS
    found["counts"] = counts(out)
    assert found["counts"]["split_samples"] > 0  # the recipe has long samples to count
    return found


def role_pids(launcher: int, role: str) -> list[int]:
    """The launcher's processes of one role (by their command line)."""
    marks = {  # the role argument, not a path: a test's folder may be named after a role
        "planner": "msd.roles planner",
        "loader": "msd.roles loader",
        "constructor": "msd.roles constructor",
        "trainer": "msd.trainer.demo",
    }
    pids = []
    for p in processes_of_launcher(launcher):
        try:
            if marks[role] in " ".join(p.cmdline()):
                pids.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(pids)


def peak_rss_until_exit(
    launcher: subprocess.Popen[str], role: str, timeout_s: float = 300
) -> tuple[str, str, int]:
    """Wait for ``launcher`` to exit, sampling its ``role`` processes' RSS every 50 ms: its
    output and the largest RSS one of them had (the launcher killed if this fails)."""
    peak = 0
    try:
        while launcher.poll() is None:
            for pid in role_pids(launcher.pid, role):
                with contextlib.suppress(psutil.NoSuchProcess):
                    peak = max(peak, psutil.Process(pid).memory_info().rss)
            time.sleep(0.05)
        out, err = launcher.communicate(timeout=timeout_s)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return out, err, peak


def victim_pids(launcher: int, victim: str, job: Path) -> list[int]:
    """The processes of role ``victim``; for ``forwarding constructor``, that of the
    Constructor that relays payloads now (its log's latest Welcome says so)."""
    if victim != "forwarding constructor":
        return role_pids(launcher, victim)
    relaying = re.compile(r"constructor \d+ of \d+; relays to \[\d")
    nodes = []
    for log in job.glob("logs/constructor-*.log"):
        said = [line for line in log.read_text().splitlines() if "relays to" in line]
        if said and relaying.search(said[-1]):
            nodes.append(log.stem.removeprefix("constructor-"))
    assert len(nodes) == 1, nodes
    pids = []
    for pid in role_pids(launcher, "constructor"):
        with contextlib.suppress(psutil.NoSuchProcess):
            if f"--node {nodes[0]}" in " ".join(psutil.Process(pid).cmdline()):
                pids.append(pid)
    return pids


def wait_for_step(job_glob: Path, step: int, proc: subprocess.Popen[str]) -> Path:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        for log in job_glob.glob("runs/*/trainer/rank-0.jsonl"):
            if len(log.read_text().splitlines()) > step:
                return log.parents[1]
        time.sleep(0.02)
    raise LaunchFailed(f"step {step} was not reached", proc)


@pytest.mark.parametrize(
    ("victims", "at_steps"),
    [
        (("loader",), (10, 60)),
        (("planner",), (30, 75)),
        (("forwarding constructor",), (20, 85)),
        (("trainer",), (40, 80)),
        (("loader", "planner"), (55,)),
    ],
    ids=["loader", "planner", "forwarding-constructor", "trainer", "loader+planner"],
)
def test_a_killed_role_is_recovered_and_the_stream_is_unchanged(
    tmp_path: Path,
    small_data: Path,
    reference: dict,
    victims: tuple[str, ...],
    at_steps: tuple[int, ...],
) -> None:
    """Each role killed at two points of one run (or a loader and the Planner together); the
    run summary's counts are those of the run without failure (nothing counted twice). The
    Constructor killed is one that relays payloads to another node's (2 simulated nodes,
    fan-out 1): the stream is still that of the one-node run."""
    doc = recipe(small_data)
    if victims == ("forwarding constructor",):
        doc["trainer"]["nodes"] = 2
        doc["constructor"] = {"fanout": 1}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml", "--json")
    try:
        for at_step in at_steps:
            job = wait_for_step(tmp_path, at_step, proc)
            for role in victims:
                pids = victim_pids(proc.pid, role, job)
                assert pids, role
                os.kill(pids[at_step % len(pids)], signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_launch_ok(proc, out, err)
    # One restart per kill (a loader and the Planner killed together are restarted together);
    # after a trainer's, ranks a step apart may go back to the step they all finished (a
    # rewind).
    recoveries = json.loads((job / "job.json").read_text())["recoveries"]
    killed = [r for r in recoveries if r["cause"] != "rewind"]
    assert len(killed) == len(at_steps), recoveries
    roles = {v.split()[-1] for v in victims}
    assert all(r["role"] in roles and r["cause"] == "was killed by SIGKILL" for r in killed)
    assert len(recoveries) - len(killed) <= len(at_steps), recoveries
    assert digests(job) == {k: v for k, v in reference.items() if k != "counts"}
    assert counts(out) == reference["counts"]
    assert processes_of_launcher(proc.pid) == []


def test_with_recovery_off_a_killed_role_stops_the_job(tmp_path: Path, small_data: Path) -> None:
    doc = recipe(small_data, recovery={"restarts": 0})
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml")
    wait_for_step(tmp_path, 10, proc)
    os.kill(role_pids(proc.pid, "loader")[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "loader" in err and "SIGKILL" in err, out + err
    assert processes_of_launcher(proc.pid) == []


def test_a_trainer_going_back_to_its_own_earlier_checkpoint_gets_the_same_batches(
    tmp_path: Path, small_data: Path
) -> None:
    """The data plane has run ahead of the step a trainer restores: it restarts there."""
    doc = recipe(small_data, steps=60, distribute={"dp": 2}, checkpoint={"every_steps": 10})
    del doc["trainer"]  # attached: this test's Clients are the trainers
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml")
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("runs/*/endpoints/planner")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        (job,) = (tmp_path / "runs").iterdir()
        first = read_all(job, steps=(0, 40))
        saved = {rank: {**state, "step": 13} for rank, (_, state) in first.items()}
        again = read_all(job, steps=(13, 60), states=saved)
        for rank in (0, 1):
            assert again[rank][0][: 40 - 13] == first[rank][0][13:40]
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_launch_ok(proc, out, err)
    state = json.loads((job / "job.json").read_text())
    assert [r["cause"] for r in state["recoveries"]] == ["rewind"]


def read_all(
    job: Path, steps: tuple[int, int], states: dict[int, dict[str, Any]] | None = None
) -> dict[int, tuple[list[bytes], dict[str, Any]]]:
    """Both ranks' batches of ``steps`` (each rank in a thread, as two trainers would)."""
    results: dict[int, tuple[list[bytes], dict[str, Any]]] = {}

    def rank(r: int) -> None:
        client = msd.Client(job=job, rank=r, world_size=2, local_rank=r, timeout_s=120)
        if states is not None:
            client.load_state_dict(states[r])
        assert client.step == steps[0]
        got = []
        while client.step < steps[1]:
            batch = client.next_batch()
            assert batch is not None
            got.append(batch["input_ids"].numpy().tobytes())
        results[r] = (got, client.state_dict())
        if client.step >= 60:
            assert client.next_batch() is None  # the end: the launcher may finish
        client.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    assert sorted(results) == [0, 1]
    return results


def shadowed(data: Path) -> dict[str, Any]:
    doc = recipe(data)
    for s in doc["sources"]:
        s["shadows"] = 1
    doc["loader"] = {"heartbeat_s": 2}
    return doc


@pytest.mark.parametrize(
    ("victim", "sig", "at_steps"),
    [
        ("loader", signal.SIGKILL, (15, 60)),
        ("loader", signal.SIGSTOP, (35,)),  # hung: found by its silence
        ("shadow", signal.SIGKILL, (25,)),
    ],
)
def test_a_shadow_takes_a_lost_loaders_place_and_the_stream_is_unchanged(
    tmp_path: Path,
    small_data: Path,
    reference: dict,
    victim: str,
    sig: int,
    at_steps: tuple[int, ...],
) -> None:
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(shadowed(small_data), sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml")
    try:
        for at_step in at_steps:
            job = wait_for_step(tmp_path, at_step, proc)
            loaders = role_pids(proc.pid, "loader")
            shadows = [p for p in loaders if "~shadow" in " ".join(psutil.Process(p).cmdline())]
            pool = shadows if victim == "shadow" else [p for p in loaders if p not in shadows]
            os.kill(pool[at_step % len(pool)], sig)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_launch_ok(proc, out, err)
    assert digests(job) == {k: v for k, v in reference.items() if k != "counts"}
    recoveries = json.loads((job / "job.json").read_text())["recoveries"]
    if sig == signal.SIGKILL:  # the launcher saw it die: handed to a shadow, nothing restarted
        assert [r["how"] for r in recoveries] == ["shadow"] * len(at_steps), recoveries
    takeovers = (
        json.loads((job / "shadows.json").read_text())["takeovers"]
        if (job / "shadows.json").exists()
        else []
    )
    assert len(takeovers) == (0 if victim == "shadow" else len(at_steps)), takeovers
    assert processes_of_launcher(proc.pid) == []


def test_without_a_shadow_a_loader_silent_past_its_heartbeat_is_waited_for(
    tmp_path: Path, small_data: Path, reference: dict
) -> None:
    """A loader stopped for twice its heartbeat (as one starved of CPU is) and then continued:
    with no shadow to take its place it is waited for, not dropped, and the run ends with the
    stream of the run without failure and nothing restarted."""
    doc = recipe(small_data)
    doc["loader"] = {"heartbeat_s": 2}
    doc["trainer"]["demo"]["step_ms"] = 60  # still running when the loader is continued
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = start_launch(tmp_path, "r.yaml", "--json")
    try:
        job = wait_for_step(tmp_path, 30, proc)
        victim = role_pids(proc.pid, "loader")[0]
        os.kill(victim, signal.SIGSTOP)
        time.sleep(4.5)
        os.kill(victim, signal.SIGCONT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_launch_ok(proc, out, err)
    assert digests(job) == {k: v for k, v in reference.items() if k != "counts"}
    assert counts(out) == reference["counts"]
    assert json.loads((job / "job.json").read_text())["recoveries"] == []
    planner_log = (job / "logs" / "planner-planner.log").read_text()
    assert "no shadow stands by; waiting for it" in planner_log
    assert "is heard from again" in planner_log
    assert processes_of_launcher(proc.pid) == []
