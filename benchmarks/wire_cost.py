"""What the data sockets' authentication costs: quickstart throughput and CPU per 1M tokens,
this msd against another version of it, side by side in one run.

    python -m benchmarks.wire_cost --baseline-python PYTHON [--data demo-data] [--pairs 3]

``PYTHON`` is the interpreter of an environment with the msd to compare with installed, e.g.
``git worktree add /tmp/base REF && python3 -m venv /tmp/base-venv &&
/tmp/base-venv/bin/pip install -e /tmp/base``; this msd is the one this interpreter imports.
Each pair runs `recipes/quickstart.yaml` with a trainer that does no compute (the data plane is
the bottleneck) under both versions, in alternating order, each at two lengths:

  * delivered tokens/s: over the steady part of the long run (the first ``--warmup`` steps
    left out);
  * CPU per 1M tokens: the CPU time of every process of the job (launcher, Planner, loaders,
    Constructor, trainers with their Clients) of the long run minus the short run's, over the
    tokens between them, so start-up (imports, opening sources) cancels out.

Reported: each version's median, and the ratios this / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.quickstart import (
    _steady_tokens_per_s,
    ensure_demo_data,
    machine,
    paired_runs_parser,
)

ROOT = Path(__file__).resolve().parent.parent


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Run:
    cpu_s: float
    records: list[dict[str, Any]]

    @property
    def tokens(self) -> int:
        return sum(r["tokens"] for r in self.records)


def run(python: str, recipe: dict[str, Any], steps: int, workdir: Path) -> Run:
    """One `msd launch` of ``recipe`` with ``steps`` steps, run by ``python``'s msd."""
    folder = Path(tempfile.mkdtemp(dir=workdir))
    (folder / "r.yaml").write_text(yaml.safe_dump({**recipe, "steps": steps}, sort_keys=False))
    before = children_cpu_s()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # each its own msd
    done = subprocess.run(
        [python, "-m", "msd.cli", "launch", "r.yaml"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{python} -m msd.cli launch failed in {folder}:\n{done.stderr[-3000:]}")
    cpu_s = children_cpu_s() - before
    records = []
    for path in folder.glob("runs/*/trainer/rank-*.jsonl"):
        records += [json.loads(line) for line in path.read_text().splitlines()]
    return Run(cpu_s, records)


def measure(python: str, recipe: dict[str, Any], args: argparse.Namespace, work: Path) -> dict:
    short = run(python, recipe, args.short_steps, work)
    long = run(python, recipe, args.steps, work)
    return {
        "tokens_per_s": _steady_tokens_per_s(long.records, args.warmup),
        "cpu_s_per_1m_tokens": (long.cpu_s - short.cpu_s) / (long.tokens - short.tokens) * 1e6,
    }


def main() -> None:
    parser = paired_runs_parser(__doc__)
    parser.set_defaults(recipe=ROOT / "recipes" / "quickstart.yaml", steps=400)
    parser.add_argument("--baseline-python", required=True)
    parser.add_argument("--short-steps", type=int, default=50)
    args = parser.parse_args()
    ensure_demo_data(args.data)
    recipe = yaml.safe_load(args.recipe.read_text())
    for source in recipe["sources"]:
        source["path"] = str(args.data.resolve() / Path(source["path"]).relative_to("demo-data"))
    recipe["trainer"] = {"command": "demo", "demo": {"step_ms": 0}}
    trees = {"this": sys.executable, "baseline": args.baseline_python}
    found: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as work:
        for pair in range(args.pairs):
            order = list(trees) if pair % 2 == 0 else list(reversed(trees))
            for name in order:
                found[name].append(measure(trees[name], recipe, args, Path(work)))
                print(name, found[name][-1], flush=True)
    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in found.items()
    }
    results = {
        "machine": machine(),
        "recipe": str(args.recipe),
        "steps": args.steps,
        "pairs": args.pairs,
        "runs": found,
        "median": medians,
        "this_over_baseline": {
            key: medians["this"][key] / medians["baseline"][key] for key in medians["this"]
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "wire_cost.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results[k] for k in ("median", "this_over_baseline")}, indent=2))


if __name__ == "__main__":
    main()
