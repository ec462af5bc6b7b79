"""examples/hf_llama.py under `msd launch`: four ranks (gloo, CPU) train a tiny Llama.

Two launches of the same recipe run side by side: one uninterrupted, and one whose rank 1 is
killed (SIGKILL) once the step-50 checkpoint is written; the launcher restarts every rank, they
resume from that checkpoint and the data plane goes back to step 50. The run is deterministic
on CPU (one thread a rank, no dropout, gradients summed in rank order), so the resumed run's
loss curve must equal the uninterrupted one's exactly, not within a tolerance.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest
import torch
import yaml

from tests.conftest import (
    LaunchFailed,
    assert_launch_ok,
    base_recipe,
    processes_of_launcher,
    start_launch,
)

# The launches run in the module's fixtures, in its first test's time: a minute or two, more
# on a busy machine.
pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_llama.py"
STEPS = 100
SAVE_EVERY = 50
KILL_AFTER = 55  # the step rank 0 has logged when rank 1 is killed
RANKS = 4
SEQ_LEN = 256
ROWS = 2


def load_example() -> ModuleType:
    """examples/hf_llama.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("hf_llama", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hf_recipe(data: Path) -> dict[str, Any]:
    doc = base_recipe(
        data,
        steps=STEPS,
        seq_len=SEQ_LEN,
        global_batch_tokens=RANKS * ROWS * SEQ_LEN,
        distribute={"dp": RANKS},
        loader={"sources_per_process": 3},  # one loader process: the CPUs go to the ranks
        checkpoint={"every_steps": 25},
    )
    for source in doc["sources"]:
        source["repeat"], source["loaders"] = True, 1
    doc["trainer"] = {"command": f"python {EXAMPLE} --save-every {SAVE_EVERY}"}
    return doc


def rank_pid(launcher: int, rank: int) -> int:
    """The pid of the example's process for ``rank``."""
    for proc in processes_of_launcher(launcher):
        try:
            if str(EXAMPLE) in proc.cmdline() and proc.environ().get("RANK") == str(rank):
                return proc.pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no process of rank {rank}")


def wait_for(folder: Path, pattern: str, launcher: Any, timeout_s: float = 240) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.poll() is None:
        found = sorted(folder.glob(pattern))
        if found:
            return found[0]
        time.sleep(0.02)
    raise LaunchFailed(f"{pattern} did not appear", launcher)


def wait_for_step(folder: Path, step: int, launcher: Any, timeout_s: float = 120) -> None:
    """Until rank 0 has logged ``step``."""
    log = wait_for(folder, "runs/*/trainer/hf-rank-0.jsonl", launcher)
    deadline = time.monotonic() + timeout_s
    while len(log.read_text().splitlines()) <= step:
        if time.monotonic() > deadline or launcher.poll() is not None:
            raise LaunchFailed(f"step {step} was not reached", launcher)
        time.sleep(0.02)


def step_logs(job: Path) -> dict[int, list[dict[str, Any]]]:
    """Every rank's step records, by rank."""
    logs = {}
    for rank in range(RANKS):
        lines = (job / "trainer" / f"hf-rank-{rank}.jsonl").read_text().splitlines()
        logs[rank] = [json.loads(line) for line in lines]
    return logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, small_data: Path) -> dict[str, Path]:
    """The job folders of the uninterrupted run and of the one killed after step 50."""
    launchers = {}
    for name in ("whole", "killed"):
        folder = tmp_path_factory.mktemp(name)
        (folder / "r.yaml").write_text(yaml.safe_dump(hf_recipe(small_data), sort_keys=False))
        launchers[name] = (folder, start_launch(folder, "r.yaml"))
    folder, killed = launchers["killed"]
    try:
        wait_for(folder, f"runs/*/trainer/hf-checkpoints/step-{SAVE_EVERY:08d}.pt", killed)
        # A few steps on, so that every rank has consumed the checkpoint's step: the restarted
        # ranks' Clients must take the data plane back to it (a rewind).
        wait_for_step(folder, KILL_AFTER, killed)
        os.kill(rank_pid(killed.pid, 1), signal.SIGKILL)
        jobs = {}
        for name, (folder, launcher) in launchers.items():
            out, err = launcher.communicate(timeout=300)
            assert_launch_ok(launcher, out, err)
            (jobs[name],) = (folder / "runs").iterdir()
    finally:
        for _, launcher in launchers.values():
            if launcher.poll() is None:
                launcher.kill()
    return jobs


def test_loss_falls_by_a_fifth_within_100_steps(runs: dict[str, Path]) -> None:
    logs = step_logs(runs["whole"])
    for records in logs.values():
        assert [r["step"] for r in records] == list(range(STEPS))
        assert all(r["start_step"] == 0 for r in records)
    losses = [r["loss"] for r in logs[0]]
    # The loss is the global mean over every rank's tokens: the same number on every rank.
    assert all([r["loss"] for r in records] == losses for records in logs.values())
    first, last = losses[0], sum(losses[-10:]) / 10
    assert last <= 0.8 * first, (first, last)
    assert all(r["tokens"] > 0 for records in logs.values() for r in records)


def test_a_rank_killed_after_its_checkpoint_resumes_the_same_loss_curve(
    runs: dict[str, Path],
) -> None:
    # The trainers restarted, and their Clients took the data plane back to step 50.
    recoveries = json.loads((runs["killed"] / "job.json").read_text())["recoveries"]
    causes = [(r["role"], r["cause"]) for r in recoveries]
    assert causes[0] == ("trainer", "was killed by SIGKILL"), causes
    assert set(causes[1:]) == {("planner", "rewind")}, causes
    whole, resumed = step_logs(runs["whole"]), step_logs(runs["killed"])
    for rank in range(RANKS):
        records = resumed[rank]
        assert [r["step"] for r in records] == list(range(STEPS))
        # Steps before the checkpoint come from the first processes, the rest from the
        # restarted ones, which began at the checkpoint's step.
        assert [r["start_step"] for r in records] == [0] * SAVE_EVERY + [SAVE_EVERY] * (
            STEPS - SAVE_EVERY
        )
        for field in ("loss", "tokens", "global_tokens"):
            assert [r[field] for r in records] == [r[field] for r in whole[rank]], field


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_samples_do_not_attend_to_each_other(attention: str) -> None:
    """A row of two packed samples and padding gives each sample the logits it has alone
    (transformers finds the samples from the restarting ``position_ids``)."""
    hf = load_example()
    args = hf.parse_args(["--attn-implementation", attention])
    model = hf.build_model(args, max_positions=64).eval()
    torch.manual_seed(1)
    a, b = torch.randint(0, 256, (13,)), torch.randint(0, 256, (20,))
    lengths = (len(a), len(b), 48 - len(a) - len(b))
    batch = {
        "input_ids": torch.cat([a, b, torch.zeros(lengths[2], dtype=torch.int64)])[None],
        "position_ids": torch.cat([torch.arange(n) for n in lengths])[None],
        "cu_seqlens": torch.tensor([0, 13, 33, 48], dtype=torch.int32),
    }
    with torch.no_grad():
        packed = model(**hf.model_inputs(batch, attention, torch.device("cpu"))).logits[0]
        alone = [model(input_ids=x[None], use_cache=False).logits[0] for x in (a, b)]
    torch.testing.assert_close(packed[:13], alone[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(packed[13:33], alone[1], rtol=0, atol=1e-5)
