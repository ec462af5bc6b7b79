"""What watching a job costs its data path: throughput with and without observers.

    python -m benchmarks.observability [--recipe recipes/quickstart-bpe.yaml] [--pairs 3]

Run it from the folder holding ``demo-data`` (made by ``msd synth demo-data`` if missing).
The recipe runs with a trainer that does no compute, so the data plane is the bottleneck and
any cost of observing shows in delivered tokens/s. Runs alternate, ``--pairs`` times:

  * quiet    — nobody asks the job anything;
  * observed — ``msd status JOB --watch --json --interval 1`` runs for the whole job, and a
    Prometheus scrape of ``JOB/endpoints/metrics`` happens every second.

A first quiet run warms the page cache and is not counted. Reported: each run's steady
tokens/s (from the trainers' own logs, start-up left out) and the ratio observed / quiet of
each pair and of the means (target: ≥ 0.98).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.quickstart import (
    _rank_records,
    _steady_tokens_per_s,
    ensure_demo_data,
    machine,
    paired_runs_parser,
    with_trainer,
)
from msd.launch.local import LocalJob
from msd.recipe.load import load_recipe
from msd.recipe.schema import Recipe


class Observer(threading.Thread):
    """``msd status --watch`` plus a metrics scrape a second, while the job runs."""

    def __init__(self, job: LocalJob) -> None:
        super().__init__(daemon=True)
        self.job = job
        self.done = threading.Event()
        self.scrapes = 0
        self.status_lines = 0

    def run(self) -> None:
        url = self.job.job.wait_endpoint("metrics")
        watch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "msd.cli",
                "status",
                str(self.job.job.root),
                "--watch",
                "--json",
                "--interval",
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        reader = threading.Thread(target=self._count, args=(watch,), daemon=True)
        reader.start()
        while not self.done.wait(1.0):
            try:
                urllib.request.urlopen(url, timeout=5).read()
                self.scrapes += 1
            except OSError:
                pass
        watch.terminate()
        watch.wait(10)

    def _count(self, watch: subprocess.Popen[str]) -> None:
        assert watch.stdout is not None
        for _ in watch.stdout:
            self.status_lines += 1


def run_once(recipe: Recipe, run_root: Path, warmup: int, observed: bool) -> dict[str, Any]:
    job = LocalJob(recipe, "# benchmark\n", run_root)
    job.start()
    observer = Observer(job) if observed else None
    if observer is not None:
        observer.start()
    outcome = job.watch(lambda status: None)
    if observer is not None:
        observer.done.set()
        observer.join(30)
    if not outcome.ok:
        raise SystemExit(f"msd run failed: {outcome.message}")
    records = _rank_records(outcome.job.root)
    return {
        "observed": observed,
        "tokens_per_s": _steady_tokens_per_s(records, warmup),
        "scrapes": observer.scrapes if observer else 0,
        "status_lines": observer.status_lines if observer else 0,
    }


def main() -> None:
    args = paired_runs_parser(__doc__).parse_args()
    ensure_demo_data(args.data)
    recipe = with_trainer(load_recipe(args.recipe), args.steps, 0.0)
    run_once(recipe, args.out / "runs", args.warmup, False)  # caches warm; not counted
    runs = []
    for pair in range(args.pairs):
        for observed in (False, True) if pair % 2 == 0 else (True, False):
            runs.append(run_once(recipe, args.out / "runs", args.warmup, observed))
            print(json.dumps(runs[-1]), flush=True)
    quiet = [r["tokens_per_s"] for r in runs if not r["observed"]]
    watched = [r["tokens_per_s"] for r in runs if r["observed"]]
    results = {
        "machine": machine(),
        "recipe": str(args.recipe),
        "steps": args.steps,
        "runs": runs,
        "pair_ratios": [w / q for q, w in zip(quiet, watched, strict=True)],
        "ratio_of_means": (sum(watched) / len(watched)) / (sum(quiet) / len(quiet)),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "observability.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: results[k] for k in ("pair_ratios", "ratio_of_means")}, indent=2))


if __name__ == "__main__":
    main()
