"""examples/torchrun_ddp.py as its docstring runs it: `msd launch` of a recipe without a
``trainer:`` section (attach mode), then `torchrun --nproc-per-node 4` with ``MSD_JOB`` set.

Every rank must read the stream the demo trainer reads on the same recipe (one demo run for the
file is the reference), also across a stop and a resume from the example's checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import (
    Launcher,
    assert_launch_ok,
    base_recipe,
    processes_of_launcher,
    read_rank_logs,
    run_msd,
    start_launch,
    wait_for_file,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torchrun_ddp.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
STEPS = 40  # at most: the sources do not repeat, and end a few steps before
STOP_AT = 15  # where the resume test stops its first run
RANKS = 4
TORCHRUN_TIMEOUT_S = 180


def recipe(data: Path) -> dict[str, Any]:
    """The attach recipe: the shared test recipe without its ``trainer:`` section."""
    doc = base_recipe(data, steps=STEPS, distribute={"dp": RANKS})
    del doc["trainer"]
    return doc


@pytest.fixture(scope="module")
def reference(small_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[str]]:
    """Each rank's batch digests when the demo trainer reads the same recipe."""
    root = tmp_path_factory.mktemp("demo")
    doc = {**recipe(small_data), "trainer": {"command": "demo", "demo": {"step_ms": 0}}}
    (root / "demo.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = run_msd("launch", "demo.yaml", cwd=root, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    (job,) = (root / "runs").iterdir()
    logs = read_rank_logs(job)
    assert sorted(logs) == list(range(RANKS))
    assert all(STOP_AT < len(lines) <= STEPS for lines in logs.values())
    return {rank: [line["digest"] for line in lines] for rank, lines in logs.items()}


def attach(cwd: Path, data: Path) -> tuple[Launcher, Path]:
    """`msd launch` in attach mode, and its job folder as a user finds it (`msd ls --json`)."""
    (cwd / "attach.yaml").write_text(yaml.safe_dump(recipe(data), sort_keys=False))
    launcher = start_launch(cwd, "attach.yaml")
    try:
        wait_for_file(cwd, "runs/*/job.json", launcher)
        listed = run_msd("ls", "--json", cwd=cwd)
        assert listed.returncode == 0, listed.stderr
        (run,) = json.loads(listed.stdout)
    except BaseException:
        launcher.kill()
        raise
    return launcher, Path(run["path"])


def torchrun(
    job: Path, cwd: Path, *args: str, ranks: int = RANKS
) -> subprocess.CompletedProcess[str]:
    """The example under real torchrun (``--standalone``: a free rendezvous port)."""
    command = [str(TORCHRUN), "--standalone", f"--nproc-per-node={ranks}", str(EXAMPLE), *args]
    return subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, "MSD_JOB": str(job)},
        capture_output=True,
        text=True,
        timeout=TORCHRUN_TIMEOUT_S,
    )


def digests(folder: Path) -> dict[int, list[tuple[int, str]]]:
    """What ``--digests`` wrote: each rank's (step, digest) in the order received."""
    found = {}
    for path in sorted(folder.glob("rank-*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        found[int(path.stem.split("-")[1])] = [(d["step"], d["digest"]) for d in lines]
    return found


def stop(launcher: Launcher, job: Path) -> None:
    """A failed test's launcher: `msd stop` (which stops its roles too), else killed."""
    if launcher.poll() is None:
        run_msd("stop", str(job), cwd=job.parent.parent, timeout=30)
        try:
            launcher.wait(timeout=20)
        except subprocess.TimeoutExpired:
            launcher.kill()


def finish(launcher: Launcher, job: Path) -> None:
    """The launcher ends by itself once the stream is consumed, with code 0 and no process."""
    try:
        out, err = launcher.communicate(timeout=60)
    finally:
        stop(launcher, job)
    assert_launch_ok(launcher, out, err)
    assert processes_of_launcher(launcher.pid) == []


def assert_stream(got: dict[int, list[tuple[int, str]]], reference: dict[int, list[str]]) -> None:
    assert sorted(got) == list(range(RANKS))
    for rank, steps in got.items():
        assert [step for step, _ in steps] == list(range(len(reference[rank]))), rank
        assert [digest for _, digest in steps] == reference[rank], rank


def test_torchrun_ranks_read_the_demo_trainers_stream(
    small_data: Path, tmp_path: Path, reference: dict[int, list[str]]
) -> None:
    launcher, job = attach(tmp_path, small_data)
    try:
        # First the mistake users make: fewer ranks than the recipe's. msd's one sentence, at
        # once, and the job goes on unharmed. (torchrun stops a rank's siblings as soon as it
        # exits, so a sibling still importing torch may be stopped before it says it too.)
        started = time.monotonic()
        wrong = torchrun(job, tmp_path, ranks=2)
        took_s = time.monotonic() - started
        run = torchrun(job, tmp_path, "--digests", "digests", "--log-every", "10")
    except BaseException:
        stop(launcher, job)
        raise
    assert wrong.returncode != 0
    sentence = f"error: WORLD_SIZE is 2 but the job's recipe has {RANKS} ranks"
    assert 1 <= wrong.stderr.count(sentence) <= 2, wrong.stderr
    assert 'torchrun_ddp.py", line' not in wrong.stderr  # no traceback from the example
    assert took_s < 120  # no hang: a rank left waiting would wait for minutes
    assert run.returncode == 0, run.stdout + run.stderr
    finish(launcher, job)
    assert_stream(digests(tmp_path / "digests"), reference)
    assert "rank 0: step 9 loss" in run.stderr  # the loop trained, and logged


def test_a_stopped_run_resumes_from_its_checkpoint_with_the_same_stream(
    small_data: Path, tmp_path: Path, reference: dict[int, list[str]]
) -> None:
    launcher, job = attach(tmp_path, small_data)
    options = ("--digests", "digests", "--checkpoint", "ckpt.pt")
    try:
        first = torchrun(job, tmp_path, *options, "--max-steps", str(STOP_AT))
        assert first.returncode == 0, first.stdout + first.stderr
        second = torchrun(job, tmp_path, *options)
        assert second.returncode == 0, second.stdout + second.stderr
    except BaseException:
        stop(launcher, job)
        raise
    finish(launcher, job)
    assert f"resumed from ckpt.pt at step {STOP_AT}" in second.stderr
    assert_stream(digests(tmp_path / "digests"), reference)
