"""msd.integrations.transformers.MsdTrainer (examples/hf_trainer.py) under `msd launch`: two
ranks (gloo, CPU) train a tiny Llama with transformers' Trainer.

Three launches of one recipe: the demo trainer's (each rank's reference stream of batch
digests), an uninterrupted Trainer run, and one whose rank 1 is killed (SIGKILL) a few steps
after the Trainer's step-50 checkpoint; the launcher restarts both ranks, and they resume from
that checkpoint with ``resume_from_checkpoint``. On CPU the run is deterministic (one thread a
rank, no dropout, and with two ranks DDP's sum of gradients is a + b whatever the bucket
layout), so the resumed losses must equal the uninterrupted ones exactly.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

from msd.batch.pack import IGNORE_INDEX
from msd.errors import CheckpointError, LaunchError
from msd.integrations.transformers import MsdTrainer, load_data_state, next_token_loss
from tests.conftest import (
    LaunchFailed,
    assert_launch_ok,
    base_recipe,
    processes_of_launcher,
    read_rank_logs,
    run_msd,
    start_launch,
)

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_trainer.py"
STEPS = 100
SAVE_EVERY = 50
KILL_AFTER = 55  # the step rank 0 has logged when rank 1 is killed
RANKS = 2
SEQ_LEN = 256
ROWS = 2


def recipe(data: Path, trainer: dict[str, Any]) -> dict[str, Any]:
    doc = base_recipe(
        data,
        steps=STEPS,
        seq_len=SEQ_LEN,
        global_batch_tokens=RANKS * ROWS * SEQ_LEN,
        distribute={"dp": RANKS},
        loader={"sources_per_process": 3},  # one loader process: the CPUs go to the ranks
        checkpoint={"every_steps": 25},
        trainer=trainer,
    )
    for source in doc["sources"]:
        source["repeat"], source["loaders"] = True, 1
    return doc


def rank_pid(launcher: int, rank: int) -> int:
    for proc in processes_of_launcher(launcher):
        try:
            if str(EXAMPLE) in proc.cmdline() and proc.environ().get("RANK") == str(rank):
                return proc.pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no process of rank {rank}")


def wait_until(found: Any, what: str, launcher: Any, timeout_s: float = 240) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.poll() is None:
        if result := found():
            return result
        time.sleep(0.05)
    raise LaunchFailed(f"{what} did not happen", launcher)


def steps_logged(folder: Path) -> int:
    logs = list(folder.glob("runs/*/trainer/hf-trainer-rank-0.jsonl"))
    return len(logs[0].read_text().splitlines()) if logs else 0


def step_logs(job: Path) -> dict[int, list[dict[str, Any]]]:
    logs = {}
    for rank in range(RANKS):
        lines = (job / "trainer" / f"hf-trainer-rank-{rank}.jsonl").read_text().splitlines()
        logs[rank] = [json.loads(line) for line in lines]
    return logs


@pytest.fixture(scope="module")
def reference(small_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[str]]:
    """Each rank's batch digests when the demo trainer reads the same recipe."""
    root = tmp_path_factory.mktemp("demo")
    doc = recipe(small_data, {"command": "demo", "demo": {"step_ms": 0}})
    (root / "demo.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = run_msd("launch", "demo.yaml", cwd=root, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    (job,) = (root / "runs").iterdir()
    logs = read_rank_logs(job)
    assert sorted(logs) == list(range(RANKS))
    return {rank: [line["digest"] for line in lines] for rank, lines in logs.items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, small_data: Path) -> dict[str, Path]:
    """The job folders of the uninterrupted Trainer run and of the one killed after step 50."""
    command = f"python {EXAMPLE} --save-steps {SAVE_EVERY} --log-samples"
    launchers = {}
    for name in ("whole", "killed"):
        folder = tmp_path_factory.mktemp(name)
        doc = recipe(small_data, {"command": command})
        (folder / "r.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        launchers[name] = (folder, start_launch(folder, "r.yaml"))
    folder, killed = launchers["killed"]
    try:
        state = f"runs/*/trainer/hf-trainer/checkpoint-{SAVE_EVERY}/trainer_state.json"
        wait_until(lambda: list(folder.glob(state)), "the step-50 checkpoint", killed)
        # A few steps on, so that the restarted ranks' Clients must take the data plane back.
        wait_until(lambda: steps_logged(folder) > KILL_AFTER, f"step {KILL_AFTER}", killed)
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


def test_the_trainer_learns_from_each_ranks_msd_stream(
    runs: dict[str, Path], reference: dict[int, list[str]]
) -> None:
    logs = step_logs(runs["whole"])
    for rank, records in logs.items():
        assert [r["step"] for r in records] == list(range(STEPS))
        assert [r["digest"] for r in records] == reference[rank][:STEPS], rank
        assert all(r["start_step"] == 0 and r["tokens"] > 0 for r in records)
    losses = [r["loss"] for r in logs[0]]
    assert [r["loss"] for r in logs[1]] == losses  # the global mean: the same on every rank
    first, last = losses[0], sum(losses[-10:]) / 10
    assert last <= 0.8 * first, (first, last)


def test_a_run_resumed_from_the_step_50_checkpoint_trains_the_same_batches_and_losses(
    runs: dict[str, Path], reference: dict[int, list[str]]
) -> None:
    recoveries = json.loads((runs["killed"] / "job.json").read_text())["recoveries"]
    causes = [(r["role"], r["cause"]) for r in recoveries]
    assert causes[0] == ("trainer", "was killed by SIGKILL"), causes
    assert set(causes[1:]) == {("planner", "rewind")}, causes  # the Clients went back to 50
    checkpoint = runs["killed"] / "trainer" / "hf-trainer" / f"checkpoint-{SAVE_EVERY}"
    assert json.loads((checkpoint / "msd_data.json").read_text())["step"] == SAVE_EVERY
    whole, resumed = step_logs(runs["whole"]), step_logs(runs["killed"])
    for rank in range(RANKS):
        records = resumed[rank]
        assert [r["step"] for r in records] == list(range(STEPS))
        # Steps 51-100 (0-based 50-99) come from the restarted processes.
        assert [r["start_step"] for r in records] == [0] * SAVE_EVERY + [SAVE_EVERY] * (
            STEPS - SAVE_EVERY
        )
        assert [r["digest"] for r in records] == reference[rank][:STEPS], rank
        for field in ("loss", "tokens"):
            assert [r[field] for r in records] == [r[field] for r in whole[rank]], field


def test_the_loss_of_shifted_labels_is_the_models_own_loss_of_unshifted_ones() -> None:
    """msd's labels are already shifted; on them the Trainer's loss equals what the model
    computes from ``labels=input_ids`` (which it shifts itself), ignored tokens included."""
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    input_ids = torch.randint(0, 256, (2, 24))
    unshifted = input_ids.clone()
    unshifted[0, 10:] = IGNORE_INDEX  # no loss where a sample ends
    shifted = torch.full_like(input_ids, IGNORE_INDEX)
    shifted[:, :-1] = unshifted[:, 1:]
    with torch.no_grad():
        out = model(input_ids=input_ids, labels=unshifted)
        ours = next_token_loss(out.logits, shifted)
    torch.testing.assert_close(ours, out.loss, rtol=0, atol=1e-6)


class StandIn:
    """What MsdTrainer reads of a Client before training (no data plane needed to refuse)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size


def tiny_trainer(tmp_path: Path, client: Any, **arguments: Any) -> MsdTrainer:
    config = LlamaConfig(
        vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1, **arguments
    )
    return MsdTrainer(model=LlamaForCausalLM(config), args=args, client=client)


def test_gradient_accumulation_and_a_client_of_another_rank_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gradient_accumulation_steps to 1"):
        tiny_trainer(tmp_path, StandIn(0, 1), gradient_accumulation_steps=2)
    with pytest.raises(LaunchError, match="Client is rank 1 of 2 but this Trainer process is"):
        tiny_trainer(tmp_path, StandIn(1, 2))


def test_a_checkpoint_without_the_data_state_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"msd_data\.json is missing"):
        load_data_state(tmp_path)
    (tmp_path / "msd_data.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"msd_data\.json cannot be read"):
        load_data_state(tmp_path)
