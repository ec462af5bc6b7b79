"""Time from `msd launch --cluster slurm` to the first batch a trainer rank receives.

    python -m benchmarks.slurm_startup [--recipe recipes/quickstart.yaml] [--runs 3]

Needs a SLURM cluster (the test cluster: bash tests/slurm/cluster/up.sh) and the recipe's data.
Each run launches the recipe with `cluster: slurm`, 2 trainer nodes and 20 steps, and reads
the first record of every rank's log; it reports the time to the first batch of the first and
of the last rank, and the whole run's wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def one_run(recipe: dict, work: Path, index: int) -> dict[str, float]:
    recipe = {
        **recipe,
        "name": f"startup{index}",
        "steps": 20,
        "cluster": "slurm",
        "trainer": {**recipe.get("trainer", {}), "nodes": 2},
        "slurm": {"partition": "debug", "time_min": 10},
    }
    path = work / f"startup{index}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "msd.cli", "launch", str(path), "--run-dir", str(work / "runs")],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    (job,) = (work / "runs").glob(f"startup{index}-*")
    firsts = [
        json.loads(p.read_text().splitlines()[0])["time"]
        for p in (job / "trainer").glob("rank-*.jsonl")
    ]
    return {
        "first_rank_s": min(firsts) - started,
        "last_rank_s": max(firsts) - started,
        "wall_s": time.time() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "quickstart.yaml")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    recipe = yaml.safe_load(args.recipe.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_run(recipe, Path(tmp), i) for i in range(args.runs)]
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    result = {**medians, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "slurm_startup.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
