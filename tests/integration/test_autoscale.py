"""Mix-driven autoscaling: a source whose transform is 20× slower than the others' ramps from
5 % to 60 % of the samples. With autoscaling the Planner adds its loaders before the ramp and
the trainers keep getting data; without, they wait for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from msd.synth import SynthSource, synth
from tests.conftest import read_rank_logs

REPO = Path(__file__).resolve().parents[2]
RAMP = (150, 250)  # steps: slow goes from 5 % to 60 % of the samples
STEPS = 450
WARMUP = 20


@pytest.fixture(scope="module")
def ramp_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ramp")
    sources = tuple(
        SynthSource(name, median_tokens=100, sigma=0.5, max_tokens=400, num_samples=2000)
        for name in ("web", "code", "slow")
    )
    synth(root, sources, seed=3, files_per_source=1, rows_per_row_group=200)
    return root


def _recipe(data: Path, autoscale: bool) -> dict[str, Any]:
    def source(name: str, weight: float, fn: str) -> dict[str, Any]:
        return {
            "name": name,
            "path": str(data / name / "*.parquet"),
            "text_column": "text",
            "weight": weight,
            "transform": {
                "kind": "function",
                "function": f"tests.integration.cost_transforms:{fn}",
            },
        }

    return {
        "name": "auto" if autoscale else "fixed",
        "seed": 1,
        "steps": STEPS,
        "seq_len": 512,
        "global_batch_tokens": 4096,
        "distribute": {"dp": 4},
        "sources": [
            source("web", 0.5, "fast"),
            source("code", 0.45, "fast"),
            source("slow", 0.05, "slow"),
        ],
        "mix": {
            "interpolate": "linear",
            "milestones": [
                {"step": RAMP[0], "weights": {"web": 0.5, "code": 0.45, "slow": 0.05}},
                {"step": RAMP[1], "weights": {"web": 0.2, "code": 0.2, "slow": 0.6}},
            ],
        },
        "loader": {"autoscale": {"enabled": autoscale, "max_loaders": 8, "lead_s": 10}},
        "metrics": {"every_s": 1},
        "trainer": {"command": "demo", "demo": {"step_ms": 150}},
    }


def _run(tmp_path: Path, data: Path, autoscale: bool) -> Path:
    name = "auto" if autoscale else "fixed"
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(_recipe(data, autoscale)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-m", "msd.cli", "launch", f"{name}.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (job,) = (tmp_path / "runs").glob(f"{name}-*")
    return job


def _waits(job: Path, first: int, last: int) -> np.ndarray:
    logs = read_rank_logs(job)
    return np.array(
        [r["wait_ms"] for rank in logs.values() for r in rank if first <= r["step"] < last]
    )


def test_loaders_are_added_before_the_ramp_and_trainers_do_not_wait(
    tmp_path: Path, ramp_data: Path
) -> None:
    auto = _run(tmp_path, ramp_data, autoscale=True)
    fixed = _run(tmp_path, ramp_data, autoscale=False)
    generations = json.loads((auto / "loaders.json").read_text())["generations"]
    slow = [g for g in generations if g["source"] == "slow"]
    assert slow and slow[0]["loaders"] > 1 and slow[0]["decided_at"] < RAMP[0], generations
    assert all(g["reason"].startswith("autoscale") for g in generations)
    assert not (fixed / "loaders.json").exists()
    auto_p99 = float(np.percentile(_waits(auto, WARMUP, STEPS), 99))
    fixed_after = _waits(fixed, RAMP[1], STEPS)
    print(
        f"data-wait p99: autoscale {auto_p99:.1f} ms; fixed, after the ramp "
        f"{np.percentile(fixed_after, 99):.1f} ms (mean {fixed_after.mean():.1f})"
    )
    assert auto_p99 < 20.0
    assert (
        np.percentile(fixed_after, 99) > 20.0
        and fixed_after.mean() > 4 * _waits(auto, RAMP[1], STEPS).mean()
    )
