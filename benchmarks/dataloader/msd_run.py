"""Running msd at one point: a recipe for the same data, then ``msd launch`` as a subprocess.

The recipe has the baseline's sources, weights, ``seq_len`` and rows per rank
(``global_batch_tokens = R × rows × seq_len``, one micro-batch per rank), the ``bytes``
transform, ``repeat: true``, the trainer's cost model for balancing, and this benchmark's
trainer as ``trainer.command``. With many sources one loader process per source would be
absurd, so ``loader.sources_per_process`` groups them; ``key_supported`` tells whether this msd
knows that key yet. The data plane sampled is the launcher's ``msd.roles`` children (Planner,
loaders, Constructor), plus the trainer ranks' growth over their idle PSS.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks.dataloader.config import Point, Settings
from benchmarks.dataloader.data import ROOT, Dataset
from benchmarks.dataloader.metrics import measure
from benchmarks.dataloader.procmon import ProcessSampler, children_of, command_kind
from msd.errors import RecipeError
from msd.recipe.load import load_recipe

TRAINER_MODULE = "benchmarks.dataloader.trainer"
KINDS = {"msd.roles": "role", TRAINER_MODULE: "trainer"}
_RANK_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MSD_JOB",
    "MSD_NODE",
)


def trainer_command(log_dir: Path, settings: Settings, seconds_per_cost: float) -> str:
    return (
        f"python -m {TRAINER_MODULE} msd --log-dir {log_dir} --seconds-per-cost "
        f"{seconds_per_cost!r} --attn {settings.cost.attn!r} --lin {settings.cost.lin!r}"
    )


def recipe_dict(
    point: Point,
    dataset: Dataset,
    settings: Settings,
    command: str,
    sources_per_process: int | None,
) -> dict[str, Any]:
    """The recipe for ``point``; ``loader.sources_per_process`` only when given."""
    recipe: dict[str, Any] = {
        "name": f"dl-{point.key}",
        "seed": settings.seed,
        "steps": settings.steps,
        "seq_len": point.seq_len,
        "global_batch_tokens": point.global_batch_tokens,
        "micro_batch_size": point.rows,
        "distribute": {"dp": point.ranks},
        "sources": [
            {
                "name": s.name,
                "path": s.path,
                "text_column": "text",
                "transform": {"kind": "bytes"},
                "weight": s.weight,
                "repeat": True,
                "loaders": 1,
            }
            for s in dataset.sources
        ],
        "cost": {"attn": settings.cost.attn, "lin": settings.cost.lin},
        "balance": {"method": "greedy", "long_samples": "split"},
        "trainer": {"command": command, "ranks": point.ranks},
    }
    if sources_per_process is not None:
        recipe["loader"] = {"sources_per_process": sources_per_process}
    return recipe


def key_supported() -> bool:
    """Whether this msd's recipe accepts ``loader.sources_per_process``."""
    recipe = {
        "sources": [{"name": "a", "path": "a.parquet", "text_column": "text", "weight": 1}],
        "steps": 1,
        "seq_len": 16,
        "global_batch_tokens": 16,
        "loader": {"sources_per_process": 2},
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe))
        try:
            load_recipe(path)
        except RecipeError as exc:
            if "sources_per_process" in str(exc):
                return False
            raise
    return True


def start_launcher(recipe: Path, run_dir: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARIABLES}
    argv = [
        sys.executable,
        "-m",
        "msd.cli",
        "launch",
        str(recipe),
        "--run-dir",
        str(run_dir / "jobs"),
        "--json",
    ]
    with open(run_dir / "launch.out", "wb") as out, open(run_dir / "launch.err", "wb") as err:
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,
        )


def wait_launcher(launcher: subprocess.Popen[bytes], timeout_s: float) -> str | None:
    """None once ``msd launch`` exited 0; else why (the launcher is stopped: its children die
    with it)."""
    try:
        code = launcher.wait(timeout_s)
    except subprocess.TimeoutExpired:
        _stop(launcher)
        return f"timed out after {timeout_s:.0f} s"
    return None if code == 0 else f"msd launch exited with code {code}"


def _stop(launcher: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(5)
            return


def run_msd(
    point: Point,
    dataset: Dataset,
    settings: Settings,
    run_dir: Path,
    seconds_per_cost: float,
    sources_per_process: int | None,
) -> dict[str, Any]:
    """Every metric of msd at ``point`` (``error`` set if the run failed)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir = run_dir / "ranks"
    command = trainer_command(log_dir, settings, seconds_per_cost)
    recipe = recipe_dict(point, dataset, settings, command, sources_per_process)
    recipe_path = run_dir / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    started = time.time()
    launcher = start_launcher(recipe_path, run_dir)
    cache: dict[int, str] = {}

    def discover() -> tuple[list[psutil.Process], list[psutil.Process]]:
        found: dict[str, list[psutil.Process]] = {"role": [], "trainer": []}
        for proc in children_of([launcher.pid]):
            kind = command_kind(proc, KINDS, cache)
            if kind is not None:
                found[kind].append(proc)
        return found["role"], found["trainer"]

    sampler = ProcessSampler(discover, settings.sample_interval_s)
    sampler.start()
    try:
        error = wait_launcher(launcher, settings.timeout_s)
    finally:
        sampler.stop()
    if error is not None:
        tail = (run_dir / "launch.err").read_text(errors="replace")[-1500:]
        return {"error": f"{error}: {tail}", "run_dir": str(run_dir)}
    result = measure(log_dir, sampler.samples, settings.warmup)
    summary = json.loads((run_dir / "launch.out").read_text())
    return result | {
        "run_dir": str(run_dir),
        "job": summary.get("job"),
        "wall_s": time.time() - started,
        "startup_s": result["first_step_end"] - started,
        "msd_summary": {
            k: summary.get(k)
            for k in ("steps", "tokens", "tokens_per_s", "split_samples", "truncated_samples")
        },
    }
