"""``msd.launch`` from Python: the same checks, warnings, errors and batches as ``msd launch``."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import msd
from msd.errors import MsdError
from msd.recipe.schema import (
    Balance,
    DemoTrainer,
    Distribute,
    PinnedFile,
    Recipe,
    Source,
    Trainer,
)
from tests.conftest import SMALL_SOURCES, processes_of_launcher, read_rank_logs, run_msd

WEIGHTS = (0.5, 0.3, 0.2)
TIMED = {"job", "elapsed_s", "tokens_per_s", "wait_p50_ms", "wait_p99_ms", "lifecycle"}


def tiny_recipe(data: Path, steps: int = 4, step_ms: int = 0) -> Recipe:
    """Two ranks, ``loaders: auto``, and long samples truncated (a warning at launch)."""
    return Recipe(
        name="py",
        seed=3,
        seq_len=512,
        global_batch_tokens=2048,
        steps=steps,
        distribute=Distribute(dp=2),
        balance=Balance(long_samples="truncate"),
        sources=tuple(
            Source(
                name=s.name,
                path=str(data / s.name / "*.parquet"),
                text_column="text",
                weight=w,
                repeat=True,
                loaders="auto",
            )
            for s, w in zip(SMALL_SOURCES, WEIGHTS, strict=True)
        ),
        trainer=Trainer(command="demo", demo=DemoTrainer(step_ms=step_ms)),
    )


def as_yaml(recipe: Recipe, path: Path) -> Path:
    import msgspec

    path.write_bytes(msgspec.yaml.encode(recipe))
    return path


def digests(job: Path) -> dict[tuple[int, int], str]:
    return {(rank, r["step"]): r["digest"] for rank, rs in read_rank_logs(job).items() for r in rs}


def untimed(summary: dict[str, Any]) -> dict[str, Any]:
    """The figures that do not depend on how fast this machine ran the job."""
    return {k: v for k, v in summary.items() if k not in TIMED}


def cli_warnings(stderr: str) -> list[str]:
    return [line.removeprefix("warning: ") for line in stderr.splitlines() if "warning: " in line]


def test_python_launch_gives_the_batches_and_warnings_of_msd_launch(
    small_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recipe = tiny_recipe(small_data)
    path = as_yaml(recipe, tmp_path / "recipe.yaml")
    cli = run_msd("launch", str(path), "--json", "--run-dir", "cli-runs", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    printed: dict[str, Any] = json.loads(cli.stdout)
    expected = digests(Path(printed["job"]))
    assert len(expected) == 2 * 4

    with caplog.at_level(logging.WARNING, logger="msd.launch.api"):
        from_file = msd.launch(path, runs=tmp_path / "py-runs")
    assert from_file.state == "done"
    assert digests(from_file.job) == expected
    assert from_file.summary is not None and from_file.summary["steps"] == 4
    assert sorted(from_file.summary) == sorted(k for k in printed if k != "job")
    assert untimed(from_file.summary) == untimed(printed)
    assert list(from_file.warnings) == cli_warnings(cli.stderr) != []
    assert [r.getMessage() for r in caplog.records] == list(from_file.warnings)

    running = msd.launch(recipe, runs=tmp_path / "py-runs", wait=False)
    assert (running.job / "job.json").is_file()
    from_struct = running.wait()
    assert from_struct.job != from_file.job and digests(from_struct.job) == expected
    assert processes_of_launcher(os.getpid()) == []


def test_stop_ends_a_job_started_without_waiting(small_data: Path, tmp_path: Path) -> None:
    running = msd.launch(
        tiny_recipe(small_data, steps=10_000, step_ms=50), runs=tmp_path, wait=False
    )
    result = running.stop()
    assert result.state == "stopped"
    assert json.loads((running.job / "job.json").read_text())["state"] == "stopped"
    assert processes_of_launcher(os.getpid()) == []


BAD = {
    "unknown key": ({"sequence_len": 512}, ()),
    "missing files": ({"sources": [{"path": "/nowhere/*.parquet"}]}, ()),
    "unknown cluster": ({}, ("--cluster", "k8s")),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_raises_the_sentence_msd_launch_prints(
    case: str, small_data: Path, tmp_path: Path
) -> None:
    import msgspec

    change, options = BAD[case]
    data = msgspec.to_builtins(tiny_recipe(small_data))
    for key, value in change.items():
        data[key] = [{**data[key][0], **value[0]}] if isinstance(value, list) else value
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(data))
    cli = run_msd("launch", str(path), *options, cwd=tmp_path)
    assert cli.returncode == 1 and "Traceback" not in cli.stderr
    cluster = options[1] if options else None
    with pytest.raises(MsdError) as raised:
        msd.launch(path, cluster=cluster, runs=tmp_path / "runs")
    assert cli.stderr.strip() == f"error: {raised.value}"


def test_import_msd_stays_light_until_launch_is_called() -> None:
    probe = (
        "import sys, msd\n"
        "light = not any(m in sys.modules for m in ('torch', 'msd.launch', 'zmq'))\n"
        "try:\n"
        "    msd.launch('/nowhere/recipe.yaml')\n"
        "except msd.errors.RecipeError as e:\n"
        "    print(light, 'msd.launch.api' in sys.modules, 'torch' in sys.modules, e)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    light, loaded, torch, sentence = run.stdout.split(" ", 3)
    assert (light, loaded, torch) == ("True", "True", "False")
    assert "cannot read the recipe" in sentence


def test_a_recipe_in_code_may_not_list_files_as_a_recipe_file_may_not(
    small_data: Path, tmp_path: Path
) -> None:
    import msgspec

    recipe = tiny_recipe(small_data)
    pinned = PinnedFile(path="a.parquet", size=1, mtime_ns=1)
    listed = msgspec.structs.replace(recipe.sources[1], files=(pinned,))
    bad = msgspec.structs.replace(recipe, sources=(recipe.sources[0], listed))
    with pytest.raises(MsdError, match=r"^msd\.launch: recipe\.sources\[1\]\.files: is written by"):
        msd.launch(bad, runs=tmp_path)
    assert not tmp_path.joinpath("py").exists() and list(tmp_path.iterdir()) == []
