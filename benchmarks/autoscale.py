"""Mix-driven autoscaling against fixed loader counts, side by side.

    python -m benchmarks.autoscale [--pairs 2] [--out benchmarks/results/autoscale.json]

Three sources; ``slow``'s transform costs 20× the others' per sample (slept, not spun, so the
scenario is about loader counts, not about this machine's cores) and its share ramps from 5 %
to 60 % of the samples over steps 150→250 of 450; 4 demo ranks. Each pair runs the recipe with
``loader.autoscale`` on, then off. Reported per run: the trainers' data-wait p50/p99 over the
steps after warm-up (autoscale) or after the ramp (fixed), and the loader generations the
Planner decided (step, loaders, reason). Target: autoscale p99 < 20 ms; fixed grows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from msd.synth.text import SynthSource, synth

REPO = Path(__file__).resolve().parents[1]
RAMP = (150, 250)  # steps: slow goes from 5 % to 60 % of the samples
STEPS = 450
WARMUP = 20


def make_data(root: Path) -> Path:
    sources = tuple(
        SynthSource(name, median_tokens=100, sigma=0.5, max_tokens=400, num_samples=2000)
        for name in ("web", "code", "slow")
    )
    synth(root, sources, seed=3, files_per_source=1, rows_per_row_group=200)
    return root


def recipe(data: Path, autoscale: bool, headroom: float | None = None) -> dict[str, Any]:
    """The scenario's recipe; ``headroom``: ``loader.autoscale.headroom`` (None: msd's
    default)."""

    def source(name: str, weight: float, fn: str) -> dict[str, Any]:
        return {
            "name": name,
            "path": str(data / name / "*.parquet"),
            "text_column": "text",
            "weight": weight,
            "transform": {"kind": "function", "function": f"benchmarks.cost_transforms:{fn}"},
        }

    planned = {} if headroom is None else {"headroom": headroom}
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
        "loader": {"autoscale": {"enabled": autoscale, "max_loaders": 8, "lead_s": 10} | planned},
        "metrics": {"every_s": 1},
        "trainer": {"command": "demo", "demo": {"step_ms": 150}},
    }


def run(workdir: Path, data: Path, autoscale: bool, headroom: float | None = None) -> Path:
    """``msd launch`` the scenario in ``workdir``; return the job folder."""
    import yaml

    name = "auto" if autoscale else "fixed"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / f"{name}.yaml").write_text(yaml.safe_dump(recipe(data, autoscale, headroom)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    before = set((workdir / "runs").glob(f"{name}-*"))
    result = subprocess.run(
        [sys.executable, "-m", "msd.cli", "launch", f"{name}.yaml"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"msd launch {name}.yaml failed:\n{result.stdout}{result.stderr}")
    (job,) = set((workdir / "runs").glob(f"{name}-*")) - before
    return job


def waits(job: Path, first: int, last: int) -> np.ndarray:
    """Every rank's data-wait (ms) for steps ``first <= step < last``."""
    found = []
    for path in sorted((job / "trainer").glob("rank-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if first <= record["step"] < last:
                found.append(record["wait_ms"])
    return np.array(found)


def generations(job: Path) -> list[dict[str, Any]]:
    path = job / "loaders.json"
    return json.loads(path.read_text())["generations"] if path.exists() else []


def summary(job: Path, first: int) -> dict[str, Any]:
    w = waits(job, first, STEPS)
    return {
        "job": str(job),
        "steps": f"{first}-{STEPS}",
        "wait_p50_ms": round(float(np.percentile(w, 50)), 2),
        "wait_p99_ms": round(float(np.percentile(w, 99)), 2),
        "wait_mean_ms": round(float(w.mean()), 2),
        "generations": [
            {k: g[k] for k in ("source", "loaders", "decided_at", "reason")}
            for g in generations(job)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=REPO / "benchmarks" / "runs" / "autoscale")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "autoscale.json"
    )
    args = parser.parse_args()
    data = args.workdir / "data"
    if not data.exists():
        make_data(data)
    runs = []
    for pair in range(args.pairs):
        for autoscale in (True, False):
            job = run(args.workdir, data, autoscale)
            row = {
                "pair": pair,
                "autoscale": autoscale,
                **summary(job, WARMUP if autoscale else RAMP[1]),
            }
            print(json.dumps(row), flush=True)
            runs.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "runs": runs}, indent=1
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
